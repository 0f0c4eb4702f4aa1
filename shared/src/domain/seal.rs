//! Sealed records: a request carries the record as the write that launched its step committed it,
//! sealed under a key only the coordinator holds, inside the reply token the worker copies untouched.
//! The reply's completion, in whichever process it runs, decides on that record and writes
//! conditionally on its version with no read first; the condition proves the copy was current, and a
//! failed seal or write falls back to a read.
//!
//! Token: `<reply token>.<record>.<mac>`: the launch's reply token (`ids::reply_token`), the record's
//! JSON (base64url) with its reply secret encrypted, and an HMAC-SHA256 (128 bits, base64url) under the
//! key over that JSON. A worker sees what the record holds besides its secret (the execution's current
//! step, its progress and history); it cannot change it, and with the secret hidden it cannot derive
//! the token of any launch it was not sent.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use uuid::Uuid;

use super::ids::hmac_sha256;
use super::Execution;

/// Records whose JSON is larger are not sealed (their completion reads the record): a request stays
/// well inside a queue message with its payload beside it.
pub const SEAL_MAX_BYTES: usize = 8 * 1024;

const SEPARATOR: char = '.';

/// The coordinator's sealing key (32 random bytes, kept in the release registry).
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

    /// A fresh random key.
    pub fn generate() -> Self {
        let mut bytes = [0u8; 32];
        for chunk in bytes.chunks_mut(16) {
            chunk.copy_from_slice(Uuid::new_v4().as_bytes());
        }
        // Two v4 ids hold 244 random bits; hashing spreads them over the whole key.
        Self(hmac_sha256(&bytes, b"stepline/seal-key"))
    }

    /// The one-time pad hiding `record`'s secret: the same secret under the same id always gives the
    /// same ciphertext, and nothing else is ever encrypted under it.
    fn pad(&self, id: Uuid) -> [u8; 32] {
        let mut message = b"seal/secret/".to_vec();
        message.extend_from_slice(id.as_bytes());
        hmac_sha256(&self.0, &message)
    }

    fn mac(&self, body: &[u8]) -> [u8; 16] {
        let mut message = b"seal/v1/".to_vec();
        message.extend_from_slice(body);
        let mut mac = [0u8; 16];
        mac.copy_from_slice(&hmac_sha256(&self.0, &message)[..16]);
        mac
    }
}

fn xor(pad: &[u8; 32], bytes: &[u8]) -> Vec<u8> {
    bytes.iter().zip(pad).map(|(b, p)| b ^ p).collect()
}

/// `record` sealed under `key`, to append to a reply token; None when it is too large to travel (or
/// its secret longer than the pad).
pub fn seal(key: &SealKey, record: &Execution) -> Option<String> {
    if record.secret.len() > 32 {
        return None;
    }
    let mut hidden = record.clone();
    hidden.secret = hex::encode(xor(&key.pad(record.id), record.secret.as_bytes()));
    let body = serde_json::to_vec(&hidden).ok()?;
    if body.len() > SEAL_MAX_BYTES {
        return None;
    }
    Some(format!(
        "{}{SEPARATOR}{}",
        URL_SAFE_NO_PAD.encode(&body),
        URL_SAFE_NO_PAD.encode(key.mac(&body))
    ))
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

/// The record sealed in `sealed`, if the seal holds under `key` and it is execution `id`'s.
pub fn unseal(key: &SealKey, sealed: &str, id: Uuid) -> Option<Execution> {
    let (body, mac) = sealed.split_once(SEPARATOR)?;
    let body = URL_SAFE_NO_PAD.decode(body).ok()?;
    let mac = URL_SAFE_NO_PAD.decode(mac).ok()?;
    if body.len() > SEAL_MAX_BYTES || !constant_time_eq(&key.mac(&body), &mac) {
        return None;
    }
    let mut record: Execution = serde_json::from_slice(&body).ok()?;
    if record.id != id {
        return None;
    }
    let hidden = hex::decode(&record.secret).ok()?;
    if hidden.len() > 32 {
        return None;
    }
    record.secret = String::from_utf8(xor(&key.pad(id), &hidden)).ok()?;
    Some(record)
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{self, Context, NewExecution, PipelineDef, StepDef};
    use serde_json::json;

    fn record() -> Execution {
        let definition =
            PipelineDef::new("p", "1", [StepDef::task("a", "q"), StepDef::task("b", "q")]);
        let ctx = Context {
            now: 1_000,
            jitter: 0.5,
            token: Uuid::from_u128(9),
            owner: "test".into(),
            lease_ms: 30_000,
            lifecycle: false,
        };
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
    fn a_sealed_record_comes_back_whole_and_hides_its_secret() {
        let key = SealKey::generate();
        let record = record();
        assert!(!record.secret.is_empty());
        let sealed = seal(&key, &record).expect("sealed");
        assert!(!sealed.contains(&record.secret));
        let body = URL_SAFE_NO_PAD
            .decode(sealed.split_once('.').unwrap().0)
            .unwrap();
        assert!(!String::from_utf8(body).unwrap().contains(&record.secret));
        assert_eq!(unseal(&key, &sealed, record.id), Some(record.clone()));
        let token = sealed_token("abc", &sealed);
        assert_eq!(split_token(&token), ("abc", Some(sealed.as_str())));
        assert_eq!(split_token("abc"), ("abc", None));
    }

    #[test]
    fn a_seal_holds_only_under_its_key_for_its_execution_untouched() {
        let key = SealKey::generate();
        let record = record();
        let sealed = seal(&key, &record).unwrap();
        assert_eq!(unseal(&SealKey::generate(), &sealed, record.id), None);
        assert_eq!(unseal(&key, &sealed, Uuid::from_u128(8)), None);
        // Any change to the record (here: its version) breaks the seal.
        let (body, mac) = sealed.split_once('.').unwrap();
        let text = String::from_utf8(URL_SAFE_NO_PAD.decode(body).unwrap()).unwrap();
        let changed = text.replace("\"version\":1", "\"version\":9");
        assert_ne!(changed, text);
        let forged = format!("{}.{mac}", URL_SAFE_NO_PAD.encode(changed));
        assert_eq!(unseal(&key, &forged, record.id), None);
        assert_eq!(unseal(&key, "garbage", record.id), None);
        assert_eq!(unseal(&key, "a.b", record.id), None);
        let stored = SealKey::from_hex(&key.to_hex()).unwrap();
        assert_eq!(unseal(&stored, &sealed, record.id), Some(record));
    }

    #[test]
    fn records_too_large_to_travel_are_not_sealed() {
        let key = SealKey::generate();
        let mut record = record();
        record.input = domain::Payload::new(json!({"doc": "x".repeat(SEAL_MAX_BYTES)}));
        assert_eq!(seal(&key, &record), None);
    }
}
