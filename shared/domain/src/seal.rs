//! Sealed records: a request carries the record as the write that launched its step committed it,
//! sealed under a key only the coordinator holds, inside the reply token the worker copies untouched.
//! The reply's completion, in whichever process it runs, decides on that record and writes
//! conditionally on its version with no read first; the condition proves the copy was current, and a
//! seal that does not open, or a failed write, falls back to a read.
//!
//! Token: `<reply token>.<sealed>`: the launch's reply token (`ids::reply_token`), then base64url of
//! a fresh 192-bit nonce followed by the record's JSON encrypted and authenticated with
//! XChaCha20-Poly1305 under the key, the execution's id as associated data. A worker learns nothing of
//! the record (its secret, history, incidents, a fan-out parent's token) and cannot change it, move it
//! to another execution or make one. Random nonces suit a key shared by every coordinator process:
//! at 192 bits they never repeat in practice, with no counter to keep. A token of an older format,
//! or sealed under a retired key, does not open: its completion reads the record.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use uuid::Uuid;

use super::crypto::{self, NONCE_BYTES};
use super::Execution;

/// Records whose JSON is larger are not sealed (their completion reads the record): a request stays
/// well inside a queue message with its payload beside it.
pub const SEAL_MAX_BYTES: usize = 8 * 1024;

const SEPARATOR: char = '.';

/// The shortest secret text a key is derived from (64 alphanumerics hold about 380 random bits).
pub const SECRET_MIN_CHARS: usize = 43;

/// HKDF's salt for keys derived from a secret's text.
const SECRET_SALT: &[u8] = b"stepline/seal-key/v1";

/// What the seal authenticates beside the record: its format and the execution it belongs to.
fn associated(id: Uuid) -> Vec<u8> {
    let mut aad = b"stepline/seal/v2/".to_vec();
    aad.extend_from_slice(id.as_bytes());
    aad
}

/// The coordinator's sealing key (256 random bits).
#[derive(Clone)]
pub struct SealKey([u8; 32]);

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealKey(..)")
    }
}

impl SealKey {
    pub fn new(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// A key from its stored form (64 hex characters).
    pub fn from_hex(text: &str) -> Option<Self> {
        let bytes = hex::decode(text).ok()?;
        Some(Self(bytes.try_into().ok()?))
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The key of a secret's text (as a secrets store holds it: at least [`SECRET_MIN_CHARS`]
    /// characters, e.g. 64 random alphanumerics), by HKDF-Extract (RFC 5869) with SHA-256 and a salt
    /// naming this use: HMAC-SHA256 keyed by the salt over the text. None when the text is too short
    /// to hold 256 bits of randomness.
    pub fn from_secret(text: &str) -> Option<Self> {
        (text.chars().count() >= SECRET_MIN_CHARS)
            .then(|| Self(crypto::hmac_sha256(SECRET_SALT, text.as_bytes())))
    }

    /// A fresh random key, from the operating system's random source.
    pub fn generate() -> Self {
        Self(crypto::random())
    }

    /// HMAC-SHA256 of `message` under a key derived from this one for `purpose` alone, so that a MAC
    /// made for one purpose never serves another, nor the seal.
    pub fn mac(&self, purpose: &str, message: &[u8]) -> [u8; 32] {
        let derived = crypto::hmac_sha256(&self.0, purpose.as_bytes());
        crypto::hmac_sha256(&derived, message)
    }
}

/// The coordinator's keys: the current one, which seals and signs, and those it replaced (a rotation
/// keeps the previous one), under which what was sealed or signed before the rotation still opens.
#[derive(Clone, Debug)]
pub struct SealKeys {
    current: SealKey,
    previous: Vec<SealKey>,
}

impl SealKeys {
    pub fn new(current: SealKey, previous: Vec<SealKey>) -> Self {
        Self { current, previous }
    }

    /// A single fresh random key (in-memory stores, tests).
    pub fn generate() -> Self {
        Self::new(SealKey::generate(), Vec::new())
    }

    /// The key that seals and signs.
    pub fn current(&self) -> &SealKey {
        &self.current
    }

    /// Every key that opens, current first.
    pub fn all(&self) -> impl Iterator<Item = &SealKey> {
        std::iter::once(&self.current).chain(&self.previous)
    }

    /// The record sealed in `sealed`, if it opens under any of the keys (see [`unseal`]).
    pub fn unseal(&self, sealed: &str, id: Uuid) -> Option<Execution> {
        self.all().find_map(|key| unseal(key, sealed, id))
    }
}

/// `record` sealed under `key` with a fresh random nonce, to append to a reply token; None when it is
/// too large to travel.
pub fn seal(key: &SealKey, record: &Execution) -> Option<String> {
    seal_with_nonce(key, record, crypto::random())
}

/// `seal` with the nonce given (each nonce must be used once under a key).
pub fn seal_with_nonce(
    key: &SealKey,
    record: &Execution,
    nonce: [u8; NONCE_BYTES],
) -> Option<String> {
    let body = serde_json::to_vec(record).ok()?;
    if body.len() > SEAL_MAX_BYTES {
        return None;
    }
    let mut sealed = nonce.to_vec();
    if crate::planted!(AcceptsUnauthenticatedSeals) {
        sealed.extend(body);
        return Some(URL_SAFE_NO_PAD.encode(sealed));
    }
    sealed.extend(crypto::encrypt(
        &key.0,
        &nonce,
        &associated(record.id),
        &body,
    ));
    Some(URL_SAFE_NO_PAD.encode(sealed))
}

/// A reply token with `sealed` appended.
pub fn sealed_token(token: &str, sealed: &str) -> String {
    format!("{token}{SEPARATOR}{sealed}")
}

/// A reply token's parts: the launch's token, and the sealed record after it, if any.
pub fn split_token(token: &str) -> (&str, Option<&str>) {
    match token.split_once(SEPARATOR) {
        Some((token, sealed)) => (token, Some(sealed)),
        None => (token, None),
    }
}

/// The record sealed in `sealed`, if it opens under `key` as execution `id`'s, unchanged.
pub fn unseal(key: &SealKey, sealed: &str, id: Uuid) -> Option<Execution> {
    let bytes = URL_SAFE_NO_PAD.decode(sealed).ok()?;
    if bytes.len() <= NONCE_BYTES || bytes.len() > NONCE_BYTES + SEAL_MAX_BYTES + 16 {
        return None;
    }
    let (nonce, ciphertext) = bytes.split_at(NONCE_BYTES);
    let nonce: [u8; NONCE_BYTES] = nonce.try_into().ok()?;
    let body = match crypto::decrypt(&key.0, &nonce, &associated(id), ciphertext) {
        Some(body) => body,
        None if crate::planted!(AcceptsUnauthenticatedSeals) => ciphertext.to_vec(),
        None => return None,
    };
    let record: Execution = serde_json::from_slice(&body).ok()?;
    (record.id == id).then_some(record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{self as domain, Context, NewExecution, PipelineDef, StepDef};
    use serde_json::json;

    fn record() -> Execution {
        let definition =
            PipelineDef::new("p", "1", [StepDef::task("a", "q"), StepDef::task("b", "q")]);
        let ctx = Context::at(crate::Timestamp::from_millis(1_000));
        let new = NewExecution {
            id: Uuid::from_u128(7),
            tenant: "t",
            definition: &definition,
            contract_version: "sha256:x".into(),
            input: json!({"order": 1}),
            idempotency_key: None,
        };
        domain::start_launched(new, &ctx).0
    }

    #[test]
    fn a_sealed_record_comes_back_whole_and_shows_nothing_of_itself() {
        let key = SealKey::generate();
        let mut record = record();
        record.input = domain::Payload::new(json!({"card": "4111-visible-to-nobody"}));
        assert!(!record.secret.is_empty());
        let sealed = seal(&key, &record).expect("sealed");
        let bytes = URL_SAFE_NO_PAD.decode(&sealed).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        for hidden in [
            record.secret.as_str(),
            "4111-visible-to-nobody",
            "\"tenant\"",
            "\"t\"",
        ] {
            assert!(!text.contains(hidden), "{hidden} readable in the seal");
        }
        assert!(!sealed.contains(SEPARATOR));
        assert_eq!(unseal(&key, &sealed, record.id), Some(record.clone()));
        let token = sealed_token("abc", &sealed);
        assert_eq!(split_token(&token), ("abc", Some(sealed.as_str())));
        assert_eq!(split_token("abc"), ("abc", None));
        // A fresh nonce each time: the same record never seals to the same text.
        assert_ne!(seal(&key, &record), Some(sealed));
    }

    #[test]
    fn a_seal_opens_only_under_its_key_for_its_execution_untouched() {
        let key = SealKey::generate();
        let record = record();
        let sealed = seal_with_nonce(&key, &record, [3; NONCE_BYTES]).unwrap();
        assert_eq!(unseal(&SealKey::generate(), &sealed, record.id), None);
        assert_eq!(unseal(&key, &sealed, Uuid::from_u128(8)), None);
        // Any bit changed anywhere (nonce, ciphertext or tag) breaks the seal.
        let bytes = URL_SAFE_NO_PAD.decode(&sealed).unwrap();
        for at in [0, NONCE_BYTES, bytes.len() / 2, bytes.len() - 1] {
            let mut changed = bytes.clone();
            changed[at] ^= 0x01;
            assert_eq!(
                unseal(&key, &URL_SAFE_NO_PAD.encode(changed), record.id),
                None
            );
        }
        // Cut short, or missing its tag: refused.
        let short = URL_SAFE_NO_PAD.encode(&bytes[..bytes.len() - 16]);
        assert_eq!(unseal(&key, &short, record.id), None);
        assert_eq!(unseal(&key, "garbage", record.id), None);
        assert_eq!(unseal(&key, "", record.id), None);
        // The format before this one (a JSON body and a MAC, dot-separated) does not open: its
        // completion reads the record instead.
        assert_eq!(unseal(&key, "e30.AAAAAAAAAAAAAAAAAAAAAA", record.id), None);
        let stored = SealKey::from_hex(&key.to_hex()).unwrap();
        assert_eq!(unseal(&stored, &sealed, record.id), Some(record));
    }

    #[test]
    fn a_record_sealed_by_whoever_lacks_the_key_does_not_open() {
        // Whoever can read every record but not the key makes a seal of a record of their choosing
        // under a key of their own: it does not open under the coordinator's.
        let key = SealKey::generate();
        let mut chosen = record();
        chosen.tenant = "mallory".into();
        chosen.secret = "00".repeat(16);
        let forged = seal(&SealKey::new([0; 32]), &chosen).unwrap();
        assert_eq!(unseal(&key, &forged, chosen.id), None);
    }

    #[test]
    fn records_too_large_to_travel_are_not_sealed() {
        let key = SealKey::generate();
        let mut record = record();
        record.input = domain::Payload::new(json!({"doc": "x".repeat(SEAL_MAX_BYTES)}));
        assert_eq!(seal(&key, &record), None);
    }

    #[test]
    fn a_rotation_keeps_what_the_previous_key_sealed_open_and_seals_under_the_new_one() {
        let old = SealKey::generate();
        let sealed_before = seal(&old, &record()).unwrap();
        let keys = SealKeys::new(SealKey::generate(), vec![old.clone()]);
        assert_eq!(keys.unseal(&sealed_before, record().id), Some(record()));
        let sealed_after = seal(keys.current(), &record()).unwrap();
        assert_eq!(unseal(&old, &sealed_after, record().id), None);
        assert_eq!(keys.unseal(&sealed_after, record().id), Some(record()));
        // Once the old key is retired, what it sealed no longer opens (its completion reads).
        let retired = SealKeys::new(SealKey::generate(), vec![keys.current().clone()]);
        assert_eq!(retired.unseal(&sealed_before, record().id), None);
    }

    #[test]
    fn a_key_is_derived_from_a_secret_text_by_hkdf_extract() {
        let text = "a".repeat(SECRET_MIN_CHARS);
        let key = SealKey::from_secret(&text).unwrap();
        // RFC 5869 Extract: PRK = HMAC-Hash(salt, IKM).
        assert_eq!(key.0, crypto::hmac_sha256(SECRET_SALT, text.as_bytes()));
        assert_eq!(SealKey::from_secret(&text).unwrap().0, key.0, "stable");
        let other = SealKey::from_secret(&"b".repeat(SECRET_MIN_CHARS)).unwrap();
        assert_ne!(other.0, key.0);
        assert!(SealKey::from_secret(&"a".repeat(SECRET_MIN_CHARS - 1)).is_none());
    }
}
