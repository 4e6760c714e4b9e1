//! Sealing and checking capabilities (docs/format.md §10): the MDS seals, a data server checks, locally, with no
//! round trip to the MDS. Crypto only: which op needs which rights is the caller's business.
//!
//! The capability key is `HMAC-SHA256(cluster key, "weft-cap-key-v1")`, never the cluster key itself, so a MAC
//! over a capability can never be replayed as a handshake proof or a session secret (different key, and the MAC
//! input starts with its own label). The tag is HMAC-SHA256 truncated to 16 bytes: a forger must guess 128 bits
//! online, one data-server request per guess (each refusal logged), which is out of reach, and every data request
//! carries 16 bytes fewer (truncation to ≥ 128 bits is what RFC 2104 §5 and NIST SP 800-107 allow).

use ring::hmac;
use weft_proto::capability::{CAPABILITY_MAC_BYTES, CAPABILITY_NONE, CAPABILITY_VERSION};
use weft_proto::{Capability, ErrorCode, Rights, WireError};

use crate::auth::Key;

const CAPABILITY_KEY_LABEL: &[u8] = b"weft-cap-key-v1";

/// The key capabilities are sealed under, derived from the cluster key. Never printed.
#[derive(Clone)]
pub struct CapabilityKey(hmac::Key);

impl std::fmt::Debug for CapabilityKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CapabilityKey(..)")
    }
}

/// Why a capability cannot be sealed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SealError {
    #[error("key id of {0} bytes is too long for a capability")]
    KeyIdTooLong(usize),
    #[error("a capability needs read or write rights, not {0:?}")]
    Rights(Rights),
}

/// Why a data server refuses a request's capability. `Display` is the reason the client and the log see.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    #[error("no capability (open the file at the metadata service first)")]
    Missing,
    #[error("unknown capability version {0}")]
    Version(u8),
    #[error("malformed capability (rights byte {rights:#x}, key id of {key_id_bytes} bytes)")]
    Malformed { rights: u8, key_id_bytes: usize },
    #[error("forged capability: its MAC does not match")]
    Forged,
    #[error("capability expired at {expiry_ms} ms (now {now_ms} ms, skew allowed {skew_ms} ms)")]
    Expired { expiry_ms: u64, now_ms: u64, skew_ms: u64 },
    #[error("capability is for inode {cap} but the request is on inode {request}")]
    WrongInode { cap: u64, request: u64 },
    #[error("capability grants {have} but the request needs {need}")]
    Rights { have: &'static str, need: &'static str },
    #[error("capability was issued to key {cap:?} but this connection proved key {connection:?}")]
    WrongKey { cap: String, connection: String },
    #[error("inode {0} was removed; its capabilities are void")]
    Removed(u64),
}

impl Refusal {
    /// `CapabilityExpired` for an expired capability (the client renews and retries), `CapabilityRefused` else.
    pub fn code(&self) -> ErrorCode {
        match self {
            Refusal::Expired { .. } => ErrorCode::CapabilityExpired,
            _ => ErrorCode::CapabilityRefused,
        }
    }

    /// A short word for logs and counters.
    pub fn kind(&self) -> &'static str {
        match self {
            Refusal::Missing => "missing",
            Refusal::Version(_) => "version",
            Refusal::Malformed { .. } => "malformed",
            Refusal::Forged => "forged",
            Refusal::Expired { .. } => "expired",
            Refusal::WrongInode { .. } => "wrong-inode",
            Refusal::Rights { .. } => "rights",
            Refusal::WrongKey { .. } => "wrong-key",
            Refusal::Removed(_) => "removed",
        }
    }

    pub fn to_wire(&self) -> WireError {
        WireError::new(self.code(), format!("capability refused: {self}"))
    }
}

/// What a request asks of its capability.
#[derive(Debug, Clone, Copy)]
pub struct Demand<'a> {
    /// The inode the request is on.
    pub ino: u64,
    /// Every right in it must be granted (an empty set asks for at least one right).
    pub rights: Rights,
    /// The key id the request's connection proved.
    pub key_id: &'a str,
    /// The checker's wall clock, Unix ms.
    pub now_ms: u64,
    /// Clock difference allowed between the MDS and this server.
    pub skew_ms: u64,
}

impl CapabilityKey {
    /// `HMAC-SHA256(cluster_key, "weft-cap-key-v1")` as the key.
    pub fn derive(cluster_key: &Key) -> CapabilityKey {
        let tag = hmac::sign(&cluster_key.hmac_key(), CAPABILITY_KEY_LABEL);
        CapabilityKey(hmac::Key::new(hmac::HMAC_SHA256, tag.as_ref()))
    }

    fn tag(&self, input: &[u8]) -> [u8; CAPABILITY_MAC_BYTES] {
        let full = hmac::sign(&self.0, input);
        let mut out = [0u8; CAPABILITY_MAC_BYTES];
        out.copy_from_slice(&full.as_ref()[..CAPABILITY_MAC_BYTES]);
        out
    }

    /// A sealed capability (version 2) for `ino` at `data_version` with `rights` until `expiry_ms`, for a
    /// connection that proved `key_id`, in MDS session `session`.
    pub fn seal(
        &self,
        ino: u64,
        rights: Rights,
        expiry_ms: u64,
        key_id: &str,
        session: u64,
        data_version: u64,
    ) -> Result<Capability, SealError> {
        if !rights.is_valid() {
            return Err(SealError::Rights(rights));
        }
        let mut cap = Capability {
            version: CAPABILITY_VERSION,
            ino,
            rights,
            expiry_ms,
            key_id: key_id.to_string(),
            session,
            data_version,
            mac: [0; CAPABILITY_MAC_BYTES],
        };
        let input = cap.mac_input().ok_or(SealError::KeyIdTooLong(key_id.len()))?;
        cap.mac = self.tag(&input);
        Ok(cap)
    }

    /// Whether `cap`'s MAC is right (constant time), whatever its other fields say.
    pub fn mac_matches(&self, cap: &Capability) -> bool {
        match cap.mac_input() {
            Some(input) => constant_time_eq(&self.tag(&input), &cap.mac),
            None => false,
        }
    }

    /// Checks `cap` against `demand`: present, version 2, well formed, MAC right (before any other field is
    /// believed), not expired (beyond the skew), for this inode, granting the rights, issued to this key.
    pub fn check(&self, cap: &Capability, demand: &Demand<'_>) -> Result<(), Refusal> {
        check_unsealed_fields(cap)?;
        if !self.mac_matches(cap) {
            return Err(Refusal::Forged);
        }
        check_claims(cap, demand)
    }
}

fn check_unsealed_fields(cap: &Capability) -> Result<(), Refusal> {
    match cap.version {
        CAPABILITY_NONE => return Err(Refusal::Missing),
        CAPABILITY_VERSION => {}
        v => return Err(Refusal::Version(v)),
    }
    if !cap.rights.is_valid() || cap.key_id.len() > weft_proto::capability::CAPABILITY_KEY_ID_BYTES_MAX {
        return Err(Refusal::Malformed { rights: cap.rights.bits(), key_id_bytes: cap.key_id.len() });
    }
    Ok(())
}

fn check_claims(cap: &Capability, d: &Demand<'_>) -> Result<(), Refusal> {
    if d.now_ms > cap.expiry_ms.saturating_add(d.skew_ms) {
        return Err(Refusal::Expired { expiry_ms: cap.expiry_ms, now_ms: d.now_ms, skew_ms: d.skew_ms });
    }
    if cap.ino != d.ino {
        return Err(Refusal::WrongInode { cap: cap.ino, request: d.ino });
    }
    if !cap.rights.covers(d.rights) {
        return Err(Refusal::Rights { have: cap.rights.name(), need: d.rights.name() });
    }
    if cap.key_id != d.key_id {
        return Err(Refusal::WrongKey { cap: cap.key_id.clone(), connection: d.key_id.to_string() });
    }
    Ok(())
}

/// Compares without an early exit, so the time taken says nothing about where a guess first went wrong.
fn constant_time_eq(a: &[u8; CAPABILITY_MAC_BYTES], b: &[u8; CAPABILITY_MAC_BYTES]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Wall-clock now, Unix ms (0 if the clock is before 1970).
pub fn unix_now_ms() -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    // Tests only (`WEFT_FAULT=clock-ahead:MS`): a host whose clock runs ahead.
    now.saturating_add(crate::fault::clock_ahead_ms())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_700_000_000_000;

    fn key() -> CapabilityKey {
        CapabilityKey::derive(&Key::from_bytes([7; 32]))
    }

    fn sealed() -> Capability {
        key().seal(42, Rights::READ_WRITE, NOW + 60_000, "cluster", 9, 5).unwrap()
    }

    fn demand(rights: Rights) -> Demand<'static> {
        Demand { ino: 42, rights, key_id: "cluster", now_ms: NOW, skew_ms: 1000 }
    }

    #[test]
    fn a_sealed_capability_passes() {
        let cap = sealed();
        assert_eq!(cap.version, CAPABILITY_VERSION);
        assert_eq!(key().check(&cap, &demand(Rights::WRITE)), Ok(()));
        assert_eq!(key().check(&cap, &demand(Rights::READ)), Ok(()));
    }

    /// Changing any field (or any MAC byte) breaks the MAC: every field is covered.
    #[test]
    fn every_field_is_covered_by_the_mac() {
        let k = key();
        let base = sealed();
        let mutants: Vec<(&str, Capability)> = vec![
            ("ino", Capability { ino: 43, ..base.clone() }),
            ("rights", Capability { rights: Rights::READ, ..base.clone() }),
            ("expiry", Capability { expiry_ms: base.expiry_ms + 1, ..base.clone() }),
            ("key id", Capability { key_id: "clustex".into(), ..base.clone() }),
            ("session", Capability { session: 10, ..base.clone() }),
            ("data version", Capability { data_version: 6, ..base.clone() }),
        ];
        for (what, m) in mutants {
            assert!(!k.mac_matches(&m), "changing the {what} must break the MAC");
        }
        for i in 0..CAPABILITY_MAC_BYTES {
            let mut m = base.clone();
            m.mac[i] ^= 1;
            assert_eq!(k.check(&m, &demand(Rights::READ)), Err(Refusal::Forged), "MAC byte {i}");
        }
        // A version change is refused before the MAC is even looked at.
        for v in [1, 3] {
            let old = Capability { version: v, ..base.clone() };
            assert_eq!(k.check(&old, &demand(Rights::READ)), Err(Refusal::Version(v)));
        }
        // Another cluster key: forged.
        let other = CapabilityKey::derive(&Key::from_bytes([8; 32]));
        assert_eq!(other.check(&base, &demand(Rights::READ)), Err(Refusal::Forged));
    }

    #[test]
    fn the_capability_key_is_not_the_cluster_key() {
        let cluster = Key::from_bytes([7; 32]);
        let raw = CapabilityKey(cluster.hmac_key());
        assert!(!raw.mac_matches(&sealed()), "sealing must not use the raw cluster key");
    }

    #[test]
    fn each_claim_is_checked() {
        let k = key();
        let cap = sealed();
        let late = Demand { now_ms: NOW + 61_001, ..demand(Rights::READ) };
        assert!(matches!(k.check(&cap, &late), Err(Refusal::Expired { .. })));
        assert_eq!(k.check(&cap, &late).unwrap_err().code(), ErrorCode::CapabilityExpired);
        let within_skew = Demand { now_ms: NOW + 61_000, ..demand(Rights::READ) };
        assert_eq!(k.check(&cap, &within_skew), Ok(()));
        let other_ino = Demand { ino: 41, ..demand(Rights::READ) };
        assert_eq!(k.check(&cap, &other_ino), Err(Refusal::WrongInode { cap: 42, request: 41 }));
        let other_key = Demand { key_id: "alice", ..demand(Rights::READ) };
        assert!(matches!(k.check(&cap, &other_key), Err(Refusal::WrongKey { .. })));
        let ro = k.seal(42, Rights::READ, NOW + 60_000, "cluster", 9, 5).unwrap();
        assert!(matches!(k.check(&ro, &demand(Rights::WRITE)), Err(Refusal::Rights { .. })));
        assert_eq!(k.check(&ro, &demand(Rights::WRITE)).unwrap_err().code(), ErrorCode::CapabilityRefused);
        assert_eq!(k.check(&Capability::none(), &demand(Rights::READ)), Err(Refusal::Missing));
        let bad_rights = Capability { rights: Rights::from_bits(0).unwrap(), ..cap.clone() };
        assert!(matches!(k.check(&bad_rights, &demand(Rights::READ)), Err(Refusal::Malformed { .. })));
        assert_eq!(k.seal(1, Rights::NONE, 0, "x", 0, 0), Err(SealError::Rights(Rights::NONE)));
        assert_eq!(k.seal(1, Rights::READ, 0, &"x".repeat(65), 0, 0), Err(SealError::KeyIdTooLong(65)));
    }
}
