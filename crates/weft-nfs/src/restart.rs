//! What a gateway keeps across a restart (docs/format.md §22): the state file naming the MDS session its locks
//! are held on, so that the next process adopts them (`AdoptLocks`), and the keyed lock-owner ids that make an
//! NFSv4 lock-owner the same MDS owner in every gateway process.
//!
//! The file is 24 bytes, written whole to a temporary name, synced and renamed over the old one (then the
//! directory synced), so a reader sees one version or the other. The directory is held with an exclusive
//! `flock` on `gateway.lock` while the gateway runs: two live gateways on one directory would take each other's
//! locks. The kernel drops that `flock` when the process dies, `kill -9` included.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The state file's name in the state directory.
pub const STATE_FILE: &str = "gateway.state";
/// The lock file's name in the state directory.
pub const LOCK_FILE: &str = "gateway.lock";
const MAGIC: &[u8; 8] = b"WEFTNFSS";
const VERSION: u32 = 1;
/// The state file's size: magic, version, session, CRC.
pub const STATE_BYTES: usize = 24;

/// Why a state file could not be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum StateFileError {
    #[error("{0} bytes, not {STATE_BYTES}")]
    Length(usize),
    #[error("not a gateway state file (bad magic)")]
    Magic,
    #[error("version {0}, this gateway reads version {VERSION}")]
    Version(u32),
    #[error("checksum mismatch")]
    Crc,
}

/// The state file's bytes for `session`.
pub fn encode(session: u64) -> [u8; STATE_BYTES] {
    let mut b = [0u8; STATE_BYTES];
    b[..8].copy_from_slice(MAGIC);
    b[8..12].copy_from_slice(&VERSION.to_be_bytes());
    b[12..20].copy_from_slice(&session.to_be_bytes());
    let crc = crc32c::crc32c(&b[..20]);
    b[20..].copy_from_slice(&crc.to_be_bytes());
    b
}

/// The MDS session a state file names; every byte checked.
pub fn decode(b: &[u8]) -> Result<u64, StateFileError> {
    if b.len() != STATE_BYTES {
        return Err(StateFileError::Length(b.len()));
    }
    if &b[..8] != MAGIC {
        return Err(StateFileError::Magic);
    }
    let version = u32::from_be_bytes(b[8..12].try_into().expect("4 bytes"));
    if version != VERSION {
        return Err(StateFileError::Version(version));
    }
    if u32::from_be_bytes(b[20..24].try_into().expect("4 bytes")) != crc32c::crc32c(&b[..20]) {
        return Err(StateFileError::Crc);
    }
    Ok(u64::from_be_bytes(b[12..20].try_into().expect("8 bytes")))
}

/// A gateway's state directory, held (exclusive `flock`) for as long as this value lives.
pub struct StateDir {
    dir: PathBuf,
    _lock: File,
}

impl StateDir {
    /// Creates the directory if needed and takes its lock; fails if another gateway holds it.
    pub fn open(dir: &Path) -> Result<StateDir, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let path = dir.join(LOCK_FILE);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| format!("opening {}: {e}", path.display()))?;
        lock.try_lock().map_err(|e| {
            format!(
                "{} is held by another running gateway ({e}): each gateway needs its own --state-dir",
                path.display()
            )
        })?;
        Ok(StateDir { dir: dir.to_path_buf(), _lock: lock })
    }

    /// The previous process's MDS session: `Ok(None)` when there is no state file (a first start).
    pub fn previous_session(&self) -> Result<Option<u64>, String> {
        let path = self.dir.join(STATE_FILE);
        match std::fs::read(&path) {
            Ok(b) => decode(&b).map(Some).map_err(|e| format!("{}: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("reading {}: {e}", path.display())),
        }
    }

    /// Records `session` atomically: a temporary file, synced, renamed over the old one, the directory synced.
    pub fn record(&self, session: u64) -> std::io::Result<()> {
        let tmp = self.dir.join(format!("{STATE_FILE}.tmp"));
        let mut f = OpenOptions::new().create(true).truncate(true).write(true).mode(0o600).open(&tmp)?;
        f.write_all(&encode(session))?;
        f.sync_data()?;
        drop(f);
        std::fs::rename(&tmp, self.dir.join(STATE_FILE))?;
        File::open(&self.dir)?.sync_all()
    }
}

/// The label the lock-owner key is derived under (so the gateway's key itself never makes an owner id).
pub const OWNER_KEY_LABEL: &[u8] = b"weft-nfs-lock-owner-v1";

/// Makes the MDS lock-owner id of an NFSv4 lock-owner: the same in every gateway process with the same key.
#[derive(Clone)]
pub struct OwnerKey(weft_rpc::Key);

impl std::fmt::Debug for OwnerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OwnerKey(..)")
    }
}

impl OwnerKey {
    /// `K_lo = HMAC-SHA256(K, "weft-nfs-lock-owner-v1")`, `K` the gateway's key (as for filehandles).
    pub fn new(key: &weft_rpc::Key) -> OwnerKey {
        OwnerKey(key.derive(OWNER_KEY_LABEL))
    }

    /// The owner id of (the client's `co_ownerid`, the lock-owner bytes): the first 8 bytes of
    /// `HMAC(K_lo, len(co_ownerid) as u32 BE || co_ownerid || owner)`, big-endian.
    pub fn owner(&self, co_ownerid: &[u8], owner: &[u8]) -> u64 {
        let len = (co_ownerid.len() as u32).to_be_bytes();
        let tag = self.0.sign(&[&len, co_ownerid, owner]);
        u64::from_be_bytes(tag[..8].try_into().expect("8 bytes"))
    }
}

impl Default for OwnerKey {
    /// A fixed key (32 zero bytes): only for gateways without authentication, and for tests.
    fn default() -> OwnerKey {
        OwnerKey::new(&weft_rpc::Key::from_bytes([0; 32]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_file_round_trips_and_every_damage_is_refused() {
        let b = encode(0x0123_4567_89ab_cdef);
        assert_eq!(&b[..8], b"WEFTNFSS");
        assert_eq!(&b[8..12], &[0, 0, 0, 1]);
        assert_eq!(decode(&b), Ok(0x0123_4567_89ab_cdef));
        assert_eq!(decode(&b[..23]), Err(StateFileError::Length(23)));
        let mut long = b.to_vec();
        long.push(0);
        assert_eq!(decode(&long), Err(StateFileError::Length(25)));
        for i in 0..STATE_BYTES {
            let mut bad = b;
            bad[i] ^= 0x40;
            assert!(decode(&bad).is_err(), "byte {i} flipped");
        }
        let mut v2 = b;
        v2[11] = 2;
        let crc = crc32c::crc32c(&v2[..20]);
        v2[20..].copy_from_slice(&crc.to_be_bytes());
        assert_eq!(decode(&v2), Err(StateFileError::Version(2)));
    }

    #[test]
    fn a_state_dir_is_held_by_one_gateway_and_records_atomically() {
        let dir = std::env::temp_dir().join(format!("weft-nfs-state-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let d = StateDir::open(&dir).unwrap();
        assert_eq!(d.previous_session(), Ok(None));
        assert!(StateDir::open(&dir).is_err(), "a second holder is refused");
        d.record(7).unwrap();
        d.record(9).unwrap();
        assert_eq!(d.previous_session(), Ok(Some(9)));
        assert!(!dir.join("gateway.state.tmp").exists());
        drop(d);
        let d = StateDir::open(&dir).unwrap();
        assert_eq!(d.previous_session(), Ok(Some(9)));
        std::fs::write(dir.join(STATE_FILE), b"junk").unwrap();
        assert!(d.previous_session().is_err());
        drop(d);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn owner_ids_are_stable_keyed_and_separate_their_parts() {
        let k = OwnerKey::new(&weft_rpc::Key::from_bytes([5; 32]));
        let a = k.owner(b"client-a", b"lock id:\x00\x01");
        assert_eq!(a, OwnerKey::new(&weft_rpc::Key::from_bytes([5; 32])).owner(b"client-a", b"lock id:\x00\x01"));
        assert_ne!(a, k.owner(b"client-b", b"lock id:\x00\x01"));
        assert_ne!(a, k.owner(b"client-a", b"lock id:\x00\x02"));
        // The length prefix keeps ("ab", "c") apart from ("a", "bc").
        assert_ne!(k.owner(b"ab", b"c"), k.owner(b"a", b"bc"));
        assert_ne!(a, OwnerKey::default().owner(b"client-a", b"lock id:\x00\x01"), "keyed");
    }
}
