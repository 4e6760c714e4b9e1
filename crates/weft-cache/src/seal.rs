//! The bank key: what seals every value the bank stores and hides the names in its keys (docs/format.md §12).
//!
//! memcached serves anyone who reaches its port, so a value is worth only what its seal proves: every item is
//! AES-256-GCM under a key derived from the cluster key, with the item's header and its memcached key as
//! associated data. A bystander can neither read a payload (file bytes, attributes, names) nor write one a holder
//! of the key accepts, nor move a sealed item under another key. Names in lookup keys are HMACs under the same
//! secret, so a key listing (`lru_crawler metadump`) does not give them away to a dictionary either.
//!
//! Who holds it: every process that holds the cluster key (the MDS, the data servers, the gateway, and clients
//! that prove the cluster key). A client that proves a per-client key has no bank key and does not use the bank.
//! With authentication off there is no secret at all: [`BankKey::public`] seals under a key everyone can derive,
//! which keeps only the integrity checks of a checksum (the roles log that at start).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

/// Bytes of the AEAD tag after a sealed payload.
pub const TAG_BYTES: usize = 16;
/// Bytes of a value's nonce.
pub const NONCE_BYTES: usize = NONCE_LEN;
/// The label the bank's secret is derived under from the cluster key (`HMAC(cluster key, label ‖ generation)`).
pub const BANK_KEY_LABEL: &[u8] = b"weft-bank-v2";

/// The bank's two sub-keys: one seals values, one names entries. Never printed.
pub struct BankKey {
    seal: LessSafeKey,
    names: hmac::Key,
    rng: SystemRandom,
    /// This instance's random 64-bit nonce seed, drawn at the first seal (see [`BankKey::nonce`]).
    nonce_seed: OnceLock<u64>,
    /// Seals made by this instance.
    nonces: AtomicU64,
}

impl std::fmt::Debug for BankKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BankKey(..)")
    }
}

/// Sealing failed: the system's random source did not answer (a value is then not stored).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no random nonce for a bank value")]
pub struct SealError;

impl BankKey {
    /// The bank key from its 32-byte secret (see [`BankKey::for_cluster`]).
    pub fn from_secret(secret: &[u8; 32]) -> BankKey {
        let parent = hmac::Key::new(hmac::HMAC_SHA256, secret);
        let seal_bytes = hmac::sign(&parent, b"weft-bank-v2 seal");
        let names_bytes = hmac::sign(&parent, b"weft-bank-v2 names");
        // AES-256 takes exactly the 32 bytes an HMAC-SHA256 tag has.
        let unbound = UnboundKey::new(&AES_256_GCM, seal_bytes.as_ref()).expect("a 32-byte AES-256 key");
        BankKey {
            seal: LessSafeKey::new(unbound),
            names: hmac::Key::new(hmac::HMAC_SHA256, names_bytes.as_ref()),
            rng: SystemRandom::new(),
            nonce_seed: OnceLock::new(),
            nonces: AtomicU64::new(0),
        }
    }

    /// The bank key of a cluster: its secret is `HMAC(cluster key, "weft-bank-v2" ‖ generation as u32 LE)`, so
    /// raising `[cache] key_generation` everywhere rotates it without touching the cluster key. `sign` is the
    /// cluster key's HMAC (the key's bytes never leave `weft-rpc`).
    pub fn for_cluster(sign: impl FnOnce(&[&[u8]]) -> [u8; 32], generation: u32) -> BankKey {
        BankKey::from_secret(&sign(&[BANK_KEY_LABEL, &generation.to_le_bytes()]))
    }

    /// The key of a cluster without authentication: derived from no secret, so it proves nothing against a
    /// bystander; it keeps the checks a checksum gave (corrupt, truncated, misrouted items are misses).
    pub fn public() -> BankKey {
        BankKey::from_secret(&[0; 32])
    }

    /// The first 16 bytes of `HMAC(names key, name)`: the name's part of its lookup key.
    pub fn name_hash(&self, name: &str) -> [u8; 16] {
        let tag = hmac::sign(&self.names, name.as_bytes());
        let mut out = [0u8; 16];
        out.copy_from_slice(&tag.as_ref()[..16]);
        out
    }

    /// A nonce no other value sealed under this key has: 8 bytes of prefix, then this instance's seal count's low
    /// 32 bits (LE). The prefix is the instance's random seed XOR `splitmix64(count >> 32)`, a new one every 2^32
    /// seals (splitmix64 is a bijection, so an instance never repeats one). Why counted and not 12 random bytes:
    /// AES-GCM loses its integrity on a repeated nonce, and with random nonces one key is good for about 2^32 seals
    /// (NIST SP 800-38D), which a busy cluster reaches in days; here a repeat needs two instances to draw colliding
    /// 64-bit prefixes, about 2^-64 per pair of (instance, 2^32 seals).
    pub(crate) fn nonce(&self) -> Result<[u8; NONCE_BYTES], SealError> {
        let seed = match self.nonce_seed.get() {
            Some(s) => *s,
            None => {
                let mut b = [0u8; 8];
                self.rng.fill(&mut b).map_err(|_| SealError)?;
                *self.nonce_seed.get_or_init(|| u64::from_le_bytes(b))
            }
        };
        let count = self.nonces.fetch_add(1, Ordering::Relaxed);
        let prefix = seed ^ splitmix64(count >> 32);
        let mut n = [0u8; NONCE_BYTES];
        n[..8].copy_from_slice(&prefix.to_le_bytes());
        n[8..].copy_from_slice(&(count as u32).to_le_bytes());
        Ok(n)
    }

    /// Encrypts `in_out` in place and returns the tag; `header ‖ key` is authenticated, not encrypted.
    pub(crate) fn seal(
        &self,
        nonce: [u8; NONCE_BYTES],
        header: &[u8],
        key: &[u8],
        in_out: &mut [u8],
    ) -> [u8; TAG_BYTES] {
        let mut aad = [0u8; AAD_BYTES_MAX];
        let aad = joined(&mut aad, header, key);
        let tag = self
            .seal
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), in_out)
            .expect("AES-GCM seals any payload under 64 GiB");
        let mut out = [0u8; TAG_BYTES];
        out.copy_from_slice(tag.as_ref());
        out
    }

    /// Decrypts `in_out` (ciphertext then tag) in place; `false` when the tag does not check (then `in_out` is
    /// garbage and must not be used).
    pub(crate) fn open(&self, nonce: [u8; NONCE_BYTES], header: &[u8], key: &[u8], in_out: &mut [u8]) -> bool {
        let mut aad = [0u8; AAD_BYTES_MAX];
        let aad = joined(&mut aad, header, key);
        self.seal.open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(aad), in_out).is_ok()
    }
}

/// SplitMix64's finalizer: a bijection of `u64` that spreads consecutive inputs over the whole range.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The longest associated data: a value header (24 bytes) and the longest memcached key (250); `value.rs`, which
/// defines both, asserts they fit.
pub(crate) const AAD_BYTES_MAX: usize = 24 + 250;

/// `header ‖ key` in `buf` (on the caller's stack: no allocation per value).
fn joined<'a>(buf: &'a mut [u8; AAD_BYTES_MAX], header: &[u8], key: &[u8]) -> &'a [u8] {
    assert!(header.len() + key.len() <= AAD_BYTES_MAX, "a value header and a memcached key");
    buf[..header.len()].copy_from_slice(header);
    buf[header.len()..header.len() + key.len()].copy_from_slice(key);
    &buf[..header.len() + key.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_keyed_and_keys_differ_by_secret() {
        let a = BankKey::from_secret(&[1; 32]);
        let b = BankKey::from_secret(&[2; 32]);
        assert_eq!(a.name_hash("passwd"), a.name_hash("passwd"));
        assert_ne!(a.name_hash("passwd"), b.name_hash("passwd"), "another secret, another name");
        assert_ne!(a.name_hash("passwd"), a.name_hash("shadow"));
        let mut bytes = b"payload".to_vec();
        let n = a.nonce().unwrap();
        let tag = a.seal(n, b"head", b"key", &mut bytes);
        assert_ne!(&bytes, b"payload");
        let mut sealed = [bytes.clone(), tag.to_vec()].concat();
        assert!(!b.open(n, b"head", b"key", &mut sealed.clone()), "another key does not open it");
        assert!(!a.open(n, b"head", b"other", &mut sealed.clone()), "another key name does not open it");
        assert!(a.open(n, b"head", b"key", &mut sealed));
        assert_eq!(&sealed[..7], b"payload");
        assert_ne!(a.nonce().unwrap(), a.nonce().unwrap());
        assert_eq!(format!("{a:?}"), "BankKey(..)");
    }

    /// Nonces never repeat within an instance, across the 2^32-seal prefix change too, and two instances of one
    /// secret (two processes) start from different random prefixes.
    #[test]
    fn nonces_are_counted_under_a_random_prefix_and_never_repeat() {
        let a = BankKey::from_secret(&[1; 32]);
        let b = BankKey::from_secret(&[1; 32]);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            assert!(seen.insert(a.nonce().unwrap()), "a repeated nonce");
        }
        let (na, nb) = (a.nonce().unwrap(), b.nonce().unwrap());
        assert_ne!(na[..8], nb[..8], "two instances, two prefixes");
        assert_eq!(u32::from_le_bytes(na[8..].try_into().unwrap()), 10_000, "the count");
        a.nonces.store((1 << 32) - 2, Ordering::Relaxed);
        let around: Vec<_> = (0..4).map(|_| a.nonce().unwrap()).collect();
        assert_eq!(around[0][..8], around[1][..8]);
        assert_ne!(around[1][..8], around[2][..8], "a new prefix after 2^32 seals");
        assert_eq!(around[2][8..], [0; 4], "the count's low bits start again");
        for n in around {
            assert!(seen.insert(n), "a repeated nonce across the prefix change");
        }
    }
}
