//! Token secrets a server can show again: Consul shows a token's
//! `SecretID` to callers with `acl:write`, where cairn stores only its
//! hash (the lookup key). Alongside the hash a token may carry its secret
//! sealed (ChaCha20-Poly1305, a random nonce, the accessor as associated
//! data so a sealed secret cannot be moved to another token) under a key
//! the servers hold and the data never does: derived from `--encrypt`,
//! which every server of a cluster shares, or made at random for one dev
//! server's life. Without such a key nothing is sealed and reads show
//! `<hidden>`, as before; a copy of the data dir, a snapshot or the Raft
//! log holds no secret either way.

use base64::Engine;
use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

/// The version tag of a sealed secret: a later format can be told apart.
const V1: &str = "v1:";

/// The key that seals and opens token secrets.
pub struct SecretSeal {
    key: LessSafeKey,
}

impl std::fmt::Debug for SecretSeal {
    // Never the key, in a log or a panic.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretSeal(..)")
    }
}

impl SecretSeal {
    /// A seal with `key` (32 bytes, e.g. derived from `--encrypt`).
    pub fn new(key: &[u8; 32]) -> SecretSeal {
        let unbound =
            UnboundKey::new(&aead::CHACHA20_POLY1305, key).expect("a 32-byte ChaCha20 key");
        SecretSeal {
            key: LessSafeKey::new(unbound),
        }
    }

    /// A seal with a random key, for one process's life (a dev server).
    pub fn random() -> Option<SecretSeal> {
        let mut key = [0u8; 32];
        SystemRandom::new().fill(&mut key).ok()?;
        Some(SecretSeal::new(&key))
    }

    /// `secret` sealed for the token `accessor`; `None` only if the system
    /// has no random bytes (the token is then stored with its hash alone).
    pub fn seal(&self, accessor: &str, secret: &str) -> Option<String> {
        let mut nonce = [0u8; aead::NONCE_LEN];
        SystemRandom::new().fill(&mut nonce).ok()?;
        let mut data = secret.as_bytes().to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(accessor.as_bytes()),
                &mut data,
            )
            .ok()?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&data);
        Some(format!(
            "{V1}{}",
            base64::engine::general_purpose::STANDARD.encode(out)
        ))
    }

    /// The secret `sealed` holds for `accessor`, if this key sealed it
    /// (another key, another token or altered bytes open to nothing).
    pub fn open(&self, accessor: &str, sealed: &str) -> Option<String> {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(sealed.strip_prefix(V1)?)
            .ok()?;
        if raw.len() < aead::NONCE_LEN {
            return None;
        }
        let (nonce, ct) = raw.split_at(aead::NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut ct = ct.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(accessor.as_bytes()), &mut ct)
            .ok()?;
        String::from_utf8(plain.to_vec()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_secret_opens_only_with_its_key_and_token() {
        let seal = SecretSeal::new(&[7u8; 32]);
        let sealed = seal.seal("acc-1", "s3cret").unwrap();
        assert!(!sealed.contains("s3cret"));
        assert_eq!(seal.open("acc-1", &sealed).as_deref(), Some("s3cret"));
        // Another token's, another key, altered or cut bytes: nothing.
        assert_eq!(seal.open("acc-2", &sealed), None);
        assert_eq!(SecretSeal::new(&[8u8; 32]).open("acc-1", &sealed), None);
        let mut bytes = sealed.clone().into_bytes();
        let last = bytes.len() - 3;
        bytes[last] = if bytes[last] == b'A' { b'B' } else { b'A' };
        assert_eq!(seal.open("acc-1", &String::from_utf8(bytes).unwrap()), None);
        assert_eq!(seal.open("acc-1", &sealed[..sealed.len() - 8]), None);
        assert_eq!(seal.open("acc-1", "v1:"), None);
        assert_eq!(seal.open("acc-1", "garbage"), None);
        // A fresh nonce each time.
        assert_ne!(seal.seal("acc-1", "s3cret").unwrap(), sealed);
    }
}
