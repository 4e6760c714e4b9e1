//! NFS filehandles (docs/format.md §15): 36 bytes, sealed so a client cannot make one for an inode it was never
//! given, stable across gateway restarts and across gateways (every gateway of a cluster derives the same seal
//! key from the key it holds).
//!
//! ```text
//! 0      version = 1
//! 1..4   zero
//! 4..8   export id (u32 BE: CRC-32C of the export path)
//! 8..16  inode (u64 BE)
//! 16..20 generation (u32 BE, 0: Weft never reuses an inode number)
//! 20..36 HMAC-SHA256(derive(key, "weft-nfs-fh-v1"), bytes 0..20), first 16 bytes
//! ```

use weft_rpc::Key;

pub const FH_VERSION: u8 = 1;
pub const FH_BYTES: usize = 36;
const SEALED_BYTES: usize = 20;
const MAC_BYTES: usize = 16;
/// The label the seal key is derived under, so the cluster key itself never signs a handle.
pub const FH_KEY_LABEL: &[u8] = b"weft-nfs-fh-v1";

/// What a handle names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fh {
    pub export_id: u32,
    pub ino: u64,
    pub generation: u32,
}

/// Why a handle is refused (NFS3ERR_BADHANDLE for all but a foreign export, which is NFS3ERR_STALE).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FhError {
    #[error("filehandle of {0} bytes, not {FH_BYTES}")]
    Length(usize),
    #[error("filehandle version {0}")]
    Version(u8),
    #[error("filehandle seal does not match")]
    Seal,
    #[error("filehandle of another export")]
    OtherExport,
}

/// Seals and opens handles for one export.
#[derive(Clone)]
pub struct FhSealer {
    key: Key,
    export_id: u32,
}

impl std::fmt::Debug for FhSealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FhSealer(export {:#x})", self.export_id)
    }
}

/// The export id of an export path.
pub fn export_id(path: &str) -> u32 {
    crc32c::crc32c(path.as_bytes())
}

impl FhSealer {
    /// `key` is the key the gateway holds (the cluster key, or its trusted client key); the seal key is derived
    /// from it.
    pub fn new(key: &Key, export_path: &str) -> FhSealer {
        FhSealer { key: key.derive(FH_KEY_LABEL), export_id: export_id(export_path) }
    }

    pub fn export_id(&self) -> u32 {
        self.export_id
    }

    pub fn seal(&self, ino: u64) -> [u8; FH_BYTES] {
        let mut b = [0u8; FH_BYTES];
        b[0] = FH_VERSION;
        b[4..8].copy_from_slice(&self.export_id.to_be_bytes());
        b[8..16].copy_from_slice(&ino.to_be_bytes());
        // generation 0, bytes 16..20
        let tag = self.key.sign(&[&b[..SEALED_BYTES]]);
        b[SEALED_BYTES..].copy_from_slice(&tag[..MAC_BYTES]);
        b
    }

    pub fn open(&self, b: &[u8]) -> Result<Fh, FhError> {
        if b.len() != FH_BYTES {
            return Err(FhError::Length(b.len()));
        }
        if b[0] != FH_VERSION {
            return Err(FhError::Version(b[0]));
        }
        let tag = self.key.sign(&[&b[..SEALED_BYTES]]);
        // Constant time: the comparison must not say how many leading bytes of a guess were right.
        let diff = tag[..MAC_BYTES].iter().zip(&b[SEALED_BYTES..]).fold(0u8, |d, (x, y)| d | (x ^ y));
        if diff != 0 || b[1..4] != [0, 0, 0] {
            return Err(FhError::Seal);
        }
        let fh = Fh {
            export_id: u32::from_be_bytes(b[4..8].try_into().expect("4 bytes")),
            ino: u64::from_be_bytes(b[8..16].try_into().expect("8 bytes")),
            generation: u32::from_be_bytes(b[16..20].try_into().expect("4 bytes")),
        };
        if fh.export_id != self.export_id {
            return Err(FhError::OtherExport);
        }
        Ok(fh)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_opens_only_unchanged_and_under_its_key_and_export() {
        let key = Key::from_bytes([7; 32]);
        let s = FhSealer::new(&key, "/");
        let h = s.seal(42);
        assert_eq!(s.open(&h).unwrap(), Fh { export_id: export_id("/"), ino: 42, generation: 0 });
        // Another gateway with the same key opens it: handles survive restarts and move between gateways.
        assert_eq!(FhSealer::new(&key, "/").open(&h).unwrap().ino, 42);
        for i in 0..FH_BYTES {
            let mut bad = h;
            bad[i] ^= 0x01;
            assert!(s.open(&bad).is_err(), "byte {i} flipped");
        }
        let mut forged = h;
        forged[8..16].copy_from_slice(&43u64.to_be_bytes());
        assert_eq!(s.open(&forged), Err(FhError::Seal));
        assert_eq!(FhSealer::new(&Key::from_bytes([8; 32]), "/").open(&h), Err(FhError::Seal));
        assert_eq!(FhSealer::new(&key, "/other").open(&h), Err(FhError::OtherExport));
        assert_eq!(s.open(&h[..20]), Err(FhError::Length(20)));
        let mut v2 = h;
        v2[0] = 2;
        assert_eq!(s.open(&v2), Err(FhError::Version(2)));
    }
}
