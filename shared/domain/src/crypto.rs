//! The cryptography the domain uses, all of it from standard, maintained crates: HMAC-SHA256
//! (`hmac`, `sha2`) for reply and fan-out tokens, comparisons in constant time (`subtle`), random
//! keys and secrets from the operating system (`getrandom`), and XChaCha20-Poly1305
//! (`chacha20poly1305`) for sealed records (`seal`).

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::XChaCha20Poly1305;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// Bytes of an XChaCha20-Poly1305 nonce: 192 bits, so nonces drawn at random never repeat in practice.
pub const NONCE_BYTES: usize = 24;

/// HMAC-SHA256 (RFC 2104) of `message` under `key`.
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(message);
    mac.finalize().into_bytes().into()
}

/// Whether two secrets are equal, in time independent of where they differ.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    a.ct_eq(b).into()
}

/// `N` bytes from the operating system's random source.
///
/// # Panics
/// When the operating system has no randomness to give: no key or secret may be made without it.
pub fn random<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).expect("the operating system's random source");
    bytes
}

/// `plaintext` encrypted and authenticated under `key` with `nonce`, `aad` authenticated beside it
/// (the ciphertext followed by its 16-byte tag).
pub fn encrypt(key: &[u8; 32], nonce: &[u8; NONCE_BYTES], aad: &[u8], plaintext: &[u8]) -> Vec<u8> {
    XChaCha20Poly1305::new(key.into())
        .encrypt(
            nonce.into(),
            Payload {
                msg: plaintext,
                aad,
            },
        )
        .expect("XChaCha20-Poly1305 encrypts any message that fits in memory")
}

/// The plaintext of `ciphertext` (tag included), if it was made by `encrypt` under `key`, `nonce` and
/// `aad`, unchanged.
pub fn decrypt(
    key: &[u8; 32],
    nonce: &[u8; NONCE_BYTES],
    aad: &[u8],
    ciphertext: &[u8],
) -> Option<Vec<u8>> {
    XChaCha20Poly1305::new(key.into())
        .decrypt(
            nonce.into(),
            Payload {
                msg: ciphertext,
                aad,
            },
        )
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 4231, every test case of HMAC-SHA256, long keys (cases 6 and 7: hashed first) included.
    #[test]
    fn hmac_matches_every_rfc_4231_test_case() {
        let long_key = [0xaa; 131];
        let four_key: Vec<u8> = (1..=25).collect();
        let cases: [(&[u8], &[u8], &str); 7] = [
            (&[0x0b; 20], b"Hi There", "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
            (b"Jefe", b"what do ya want for nothing?", "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"),
            (&[0xaa; 20], &[0xdd; 50], "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"),
            (&four_key, &[0xcd; 50], "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"),
            // Case 5 specifies the first 128 bits only.
            (&[0x0c; 20], b"Test With Truncation", "a3b6167473100ee06e0c796c2955552b"),
            (&long_key, b"Test Using Larger Than Block-Size Key - Hash Key First", "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"),
            (&long_key, b"This is a test using a larger than block-size key and a larger than block-size data. The key needs to be hashed before being used by the HMAC algorithm.", "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"),
        ];
        for (n, (key, message, expected)) in cases.iter().enumerate() {
            let mac = hex::encode(hmac_sha256(key, message));
            assert_eq!(&mac[..expected.len()], *expected, "RFC 4231 case {}", n + 1);
        }
    }

    /// draft-irtf-cfrg-xchacha-03, appendix A.3.1: the AEAD's test vector.
    #[test]
    fn the_aead_matches_the_xchacha20_poly1305_test_vector() {
        let key: [u8; 32] = std::array::from_fn(|i| 0x80 + i as u8);
        let nonce: [u8; 24] = std::array::from_fn(|i| 0x40 + i as u8);
        let aad = hex::decode("50515253c0c1c2c3c4c5c6c7").unwrap();
        let plaintext = b"Ladies and Gentlemen of the class of '99: If I could offer you only one tip for the future, sunscreen would be it.";
        let expected = "bd6d179d3e83d43b9576579493c0e939572a1700252bfaccbed2902c21396cbb\
                        731c7f1b0b4aa6440bf3a82f4eda7e39ae64c6708c54c216cb96b72e1213b452\
                        2f8c9ba40db5d945b11b69b982c1bb9e3f3fac2bc369488f76b2383565d3fff9\
                        21f9664c97637da9768812f615c68b13b52e\
                        c0875924c1c7987947deafd8780acf49";
        let sealed = encrypt(&key, &nonce, &aad, plaintext);
        assert_eq!(hex::encode(&sealed), expected);
        assert_eq!(
            decrypt(&key, &nonce, &aad, &sealed).as_deref(),
            Some(&plaintext[..])
        );
        // Any other associated data, nonce, key or a flipped bit: refused.
        assert_eq!(decrypt(&key, &nonce, b"other", &sealed), None);
        assert_eq!(decrypt(&key, &[0; 24], &aad, &sealed), None);
        assert_eq!(decrypt(&[0; 32], &nonce, &aad, &sealed), None);
        let mut flipped = sealed.clone();
        flipped[3] ^= 1;
        assert_eq!(decrypt(&key, &nonce, &aad, &flipped), None);
    }

    #[test]
    fn comparisons_see_every_byte_and_the_length() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"ab"));
        assert!(!same(b"", b"a"));
    }

    #[test]
    fn random_draws_differ() {
        assert_ne!(random::<16>(), random::<16>());
    }
}
