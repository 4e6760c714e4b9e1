//! A capability: the MDS's sealed permission for one client connection to read (or read and write) one file's
//! objects on the data servers until an expiry (docs/format.md §10).
//!
//! This module holds the wire type and the exact bytes its MAC covers; the MAC itself (HMAC-SHA256 under the
//! capability key) is computed and checked in `weft-rpc`'s `capability` module, since this crate does no
//! cryptography.

use serde::{Deserialize, Serialize};

/// [`Capability::version`] of a sealed capability. Version 2 added `data_version`; version 1 is refused.
pub const CAPABILITY_VERSION: u8 = 2;
/// [`Capability::version`] of the empty capability: issued by an MDS with authentication off, and what a request
/// carries when it has none. A data server with authentication on refuses it.
pub const CAPABILITY_NONE: u8 = 0;
/// Bytes of the (truncated) HMAC-SHA256 tag.
pub const CAPABILITY_MAC_BYTES: usize = 16;
/// Longest key id a connection proves (`AuthBeginReq::key_id`) and so a capability names.
pub const KEY_ID_BYTES_MAX: usize = 64;
/// Longest key id a capability names (as `AuthBeginReq::key_id`).
pub const CAPABILITY_KEY_ID_BYTES_MAX: usize = KEY_ID_BYTES_MAX;
/// The label that starts the MAC input, so a capability's MAC never equals any other HMAC under that key.
pub const CAPABILITY_MAC_LABEL: &[u8] = b"weft-cap-v1";

/// What a capability allows: a set of [`Rights::READ`] and [`Rights::WRITE`]. Encoded as one byte; other bits
/// are refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Rights(u8);

impl Rights {
    pub const NONE: Rights = Rights(0);
    pub const READ: Rights = Rights(1);
    pub const WRITE: Rights = Rights(2);
    pub const READ_WRITE: Rights = Rights(3);

    /// The rights from their byte; `None` for a byte with bits other than READ and WRITE.
    pub fn from_bits(bits: u8) -> Option<Rights> {
        (bits & !3 == 0).then_some(Rights(bits))
    }

    pub fn bits(self) -> u8 {
        self.0
    }

    /// Every right in `needed` is in `self`.
    pub fn covers(self, needed: Rights) -> bool {
        self.0 & needed.0 == needed.0
    }

    pub fn is_valid(self) -> bool {
        Rights::from_bits(self.0).is_some() && self.0 != 0
    }

    /// "read", "write" or "read+write", for messages.
    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "none",
            1 => "read",
            2 => "write",
            3 => "read+write",
            _ => "invalid",
        }
    }
}

/// The capability a data-server request on an inode carries (docs/format.md §10).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Capability {
    /// [`CAPABILITY_VERSION`], or [`CAPABILITY_NONE`] for none.
    pub version: u8,
    pub ino: u64,
    pub rights: Rights,
    /// Wall-clock expiry, Unix milliseconds (the MDS's clock).
    pub expiry_ms: u64,
    /// The key id the connection it was issued on proved; a data server serves it only on a connection that
    /// proved the same key.
    pub key_id: String,
    /// The MDS session it was issued to (for logs and revocation by session).
    pub session: u64,
    /// The file's data version when the MDS issued it (docs/format.md §6): what a data server names the cache-bank
    /// blocks it fills under (§12), so a reader cannot choose the version of what it plants.
    pub data_version: u64,
    /// HMAC-SHA256 over [`Capability::mac_input`] under the capability key, first 16 bytes.
    pub mac: [u8; CAPABILITY_MAC_BYTES],
}

impl Capability {
    /// The empty capability (version 0): what a request without one carries.
    pub fn none() -> Capability {
        Capability {
            version: CAPABILITY_NONE,
            ino: 0,
            rights: Rights::NONE,
            expiry_ms: 0,
            key_id: String::new(),
            session: 0,
            data_version: 0,
            mac: [0; CAPABILITY_MAC_BYTES],
        }
    }

    pub fn is_none(&self) -> bool {
        self.version == CAPABILITY_NONE
    }

    /// The exact bytes the MAC covers: `"weft-cap-v1" ‖ version u8 ‖ ino u64 LE ‖ rights u8 ‖ expiry_ms u64 LE ‖
    /// session u64 LE ‖ data_version u64 LE ‖ key_id length u8 ‖ key_id`. Every field but the key id has a fixed size and the key id
    /// comes last with its length, so one input has exactly one reading. `None` if the key id is too long.
    pub fn mac_input(&self) -> Option<Vec<u8>> {
        let id = self.key_id.as_bytes();
        if id.len() > CAPABILITY_KEY_ID_BYTES_MAX {
            return None;
        }
        let mut v = Vec::with_capacity(CAPABILITY_MAC_LABEL.len() + 1 + 8 + 1 + 8 + 8 + 8 + 1 + id.len());
        v.extend_from_slice(CAPABILITY_MAC_LABEL);
        v.push(self.version);
        v.extend_from_slice(&self.ino.to_le_bytes());
        v.push(self.rights.bits());
        v.extend_from_slice(&self.expiry_ms.to_le_bytes());
        v.extend_from_slice(&self.session.to_le_bytes());
        v.extend_from_slice(&self.data_version.to_le_bytes());
        v.push(id.len() as u8);
        v.extend_from_slice(id);
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap() -> Capability {
        Capability {
            version: CAPABILITY_VERSION,
            ino: 0x0102_0304_0506_0708,
            rights: Rights::READ_WRITE,
            expiry_ms: 1_700_000_000_000,
            key_id: "cluster".into(),
            session: 0xaabb,
            data_version: 0x0d0c,
            mac: [0x5a; CAPABILITY_MAC_BYTES],
        }
    }

    /// The MAC input of docs/format.md §10, byte by byte.
    #[test]
    fn mac_input_has_the_documented_layout() {
        let c = cap();
        let v = c.mac_input().unwrap();
        let mut want = b"weft-cap-v1".to_vec();
        want.push(2);
        want.extend_from_slice(&[8, 7, 6, 5, 4, 3, 2, 1]);
        want.push(3);
        want.extend_from_slice(&1_700_000_000_000u64.to_le_bytes());
        want.extend_from_slice(&0xaabbu64.to_le_bytes());
        want.extend_from_slice(&0x0d0cu64.to_le_bytes());
        want.push(7);
        want.extend_from_slice(b"cluster");
        assert_eq!(v, want);
        let long = Capability { key_id: "k".repeat(65), ..cap() };
        assert_eq!(long.mac_input(), None);
    }

    /// The wire encoding (postcard): version byte, varints, rights byte, length-prefixed key id, 16 raw MAC bytes.
    #[test]
    fn wire_encoding_is_postcard_in_field_order() {
        let c = Capability { ino: 5, expiry_ms: 300, session: 2, data_version: 9, ..cap() };
        let body = crate::msg::encode_value(&c);
        let mut want = vec![2, 5, 3, 0xac, 0x02, 7];
        want.extend_from_slice(b"cluster");
        want.extend_from_slice(&[2, 9]);
        want.extend_from_slice(&[0x5a; 16]);
        assert_eq!(body, want);
        let back: Capability = crate::msg::decode(0, &body).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn rights_refuse_unknown_bits() {
        assert_eq!(Rights::from_bits(4), None);
        assert!(Rights::READ_WRITE.covers(Rights::WRITE) && !Rights::READ.covers(Rights::WRITE));
        assert!(Rights::READ.is_valid() && !Rights::NONE.is_valid() && !Rights(9).is_valid());
    }
}
