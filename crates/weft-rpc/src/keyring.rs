//! Per-client keys: the clients keyring file (`weft key add/list/remove`) and the policy each key carries.
//!
//! A per-client key authenticates a client exactly as the cluster key does (auth.rs), but the connection's
//! [`crate::Principal`] then carries the key's [`KeyPolicy`], which the metadata service applies to the user each
//! request asserts. The file format is in docs/format.md §9: a `weft-keyring-v1` header line, then one line per
//! client `NAME HEX POLICY`. The file holds secrets, so it is refused when group or other may read or write it,
//! and it is replaced atomically (write a temporary file, fsync, rename) so a reader never sees half of it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use weft_proto::msg::KEY_ID_BYTES_MAX;

use crate::key::{CLUSTER_KEY_ID, Key, KeyFormatError};

/// First line of a keyring file.
const KEYRING_HEADER: &str = "weft-keyring-v1";
/// Most entries a keyring holds; a larger file is refused (it is read whole, on every change).
pub const KEYRING_ENTRIES_MAX: usize = 10_000;
/// Largest keyring file read: the entries at their longest, with room to spare.
const KEYRING_BYTES_MAX: u64 = 2 << 20;
/// The uid and gid a squashed root becomes (knfsd's `anonuid`/`anongid` defaults: nobody, nogroup).
pub const NOBODY_ID: u32 = 65534;

/// What a key lets its holder assert about the user of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyPolicy {
    /// The cluster key: a trusted server or host (AUTH_SYS); may register data servers.
    Cluster,
    /// A per-client key for a trusted host: the asserted user as is, root included.
    Trusted,
    /// The asserted user, but uid 0 becomes [`NOBODY_ID`] and gid 0 (primary or supplementary) [`NOBODY_ID`].
    SquashRoot,
    /// Always this user, whatever is asserted, with no supplementary groups.
    Fixed { uid: u32, gid: u32 },
}

impl KeyPolicy {
    /// The policy's text in a keyring line.
    pub fn to_text(self) -> String {
        match self {
            KeyPolicy::Cluster => "cluster".into(),
            KeyPolicy::Trusted => "trusted".into(),
            KeyPolicy::SquashRoot => "squash-root".into(),
            KeyPolicy::Fixed { uid, gid } => format!("uid={uid},gid={gid}"),
        }
    }

    fn parse(text: &str) -> Option<KeyPolicy> {
        match text {
            "trusted" => Some(KeyPolicy::Trusted),
            "squash-root" => Some(KeyPolicy::SquashRoot),
            _ => {
                let (u, g) = text.split_once(',')?;
                let uid = u.strip_prefix("uid=")?;
                let gid = g.strip_prefix("gid=")?;
                let num = |s: &str| (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok())?;
                Some(KeyPolicy::Fixed { uid: num(uid)?, gid: num(gid)? })
            }
        }
    }
}

/// What is wrong with a keyring file or a client name.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyringError {
    #[error("keyring {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(
        "keyring {path} has mode {mode:04o}: it must not be readable or writable by group or other (chmod 600 {path})"
    )]
    Permissions { path: PathBuf, mode: u32 },
    #[error("keyring {path}, line {line}: {reason}")]
    Format { path: PathBuf, line: usize, reason: String },
    #[error("keyring {path} is larger than {KEYRING_BYTES_MAX} bytes or {KEYRING_ENTRIES_MAX} entries")]
    TooLarge { path: PathBuf },
    #[error("client name {name:?}: {reason}")]
    BadName { name: String, reason: &'static str },
    #[error("keyring {path} already has a key named {name:?}")]
    Duplicate { path: PathBuf, name: String },
    #[error("keyring {path} has no key named {name:?}")]
    NoSuchName { path: PathBuf, name: String },
}

/// Checks a client key's name: 1 to `KEY_ID_BYTES_MAX` bytes of `A-Z a-z 0-9 . _ -`, not starting with `-`, and
/// not the cluster key's id nor `"pnfs"` (the key id of pNFS data-server filehandles, docs/format.md §23: no
/// connection may ever prove it, or a pNFS handle would work on Weft's own protocol).
pub fn check_client_name(name: &str) -> Result<(), KeyringError> {
    let bad = |reason| Err(KeyringError::BadName { name: name.into(), reason });
    if name.is_empty() || name.len() > KEY_ID_BYTES_MAX {
        return bad("a name has 1 to 64 bytes");
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) || name.starts_with('-') {
        return bad("a name has only letters, digits, '.', '_' and '-' (and does not start with '-')");
    }
    if name == CLUSTER_KEY_ID {
        return bad("\"cluster\" names the cluster key");
    }
    if name == weft_proto::msg::PNFS_KEY_ID {
        return bad("\"pnfs\" is reserved for pNFS data-server filehandles");
    }
    Ok(())
}

/// The contents of a clients keyring, by name (kept sorted, so a rewrite keeps the file stable).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientKeys {
    entries: BTreeMap<String, (Key, KeyPolicy)>,
}

impl ClientKeys {
    pub fn get(&self, name: &str) -> Option<&(Key, KeyPolicy)> {
        self.entries.get(name)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Names and policies, in name order (never the keys).
    pub fn list(&self) -> impl Iterator<Item = (&str, KeyPolicy)> {
        self.entries.iter().map(|(n, (_, p))| (n.as_str(), *p))
    }

    /// Parses a keyring's text; `path` only names the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<ClientKeys, KeyringError> {
        let format = |line, reason: String| KeyringError::Format { path: path.to_path_buf(), line, reason };
        let mut lines = text.split_terminator('\n').enumerate().map(|(i, l)| (i + 1, l));
        match lines.next() {
            Some((_, KEYRING_HEADER)) => {}
            _ => return Err(format(1, format!("the first line must be {KEYRING_HEADER:?}"))),
        }
        let mut keys = ClientKeys::default();
        for (n, line) in lines {
            let mut fields = line.split(' ');
            let (Some(name), Some(hex), Some(policy), None) =
                (fields.next(), fields.next(), fields.next(), fields.next())
            else {
                return Err(format(n, "expected three fields: NAME HEX POLICY, separated by one space".into()));
            };
            check_client_name(name).map_err(|e| format(n, e.to_string()))?;
            let key =
                Key::parse(&format!("weft-key-v1 {hex}")).map_err(|e: KeyFormatError| format(n, e.to_string()))?;
            let policy = KeyPolicy::parse(policy)
                .ok_or_else(|| format(n, format!("unknown policy {policy:?} (trusted, squash-root or uid=U,gid=G)")))?;
            if keys.entries.insert(name.to_string(), (key, policy)).is_some() {
                return Err(format(n, format!("{name:?} appears twice")));
            }
            if keys.entries.len() > KEYRING_ENTRIES_MAX {
                return Err(KeyringError::TooLarge { path: path.to_path_buf() });
            }
        }
        Ok(keys)
    }

    /// The file's text.
    pub fn to_text(&self) -> String {
        let mut s = format!("{KEYRING_HEADER}\n");
        for (name, (key, policy)) in &self.entries {
            let line = key.to_file_text();
            let hex = line.trim_end().rsplit(' ').next().unwrap_or_default();
            s.push_str(&format!("{name} {hex} {}\n", policy.to_text()));
        }
        s
    }

    /// Reads a keyring, refusing one that group or other may read or write.
    pub fn load(path: &Path) -> Result<ClientKeys, KeyringError> {
        use std::io::Read;
        use std::os::unix::fs::PermissionsExt;
        let io = |source| KeyringError::Io { path: path.to_path_buf(), source };
        let f = std::fs::File::open(path).map_err(io)?;
        let meta = f.metadata().map_err(io)?;
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(KeyringError::Permissions { path: path.to_path_buf(), mode });
        }
        if meta.len() > KEYRING_BYTES_MAX {
            return Err(KeyringError::TooLarge { path: path.to_path_buf() });
        }
        let mut text = String::new();
        f.take(KEYRING_BYTES_MAX).read_to_string(&mut text).map_err(io)?;
        ClientKeys::parse(&text, path)
    }

    /// Loads `path`, or an empty keyring if there is no file.
    pub fn load_or_empty(path: &Path) -> Result<ClientKeys, KeyringError> {
        match ClientKeys::load(path) {
            Err(KeyringError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                Ok(ClientKeys::default())
            }
            other => other,
        }
    }

    /// Writes the keyring to `path` atomically (a temporary file in the same directory, mode 0600, fsynced, then
    /// renamed over it), so the servers re-reading it never see a partial file.
    pub fn save(&self, path: &Path) -> Result<(), KeyringError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
        let io = |source| KeyringError::Io { path: path.to_path_buf(), source };
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).map_err(io)?;
        let written = f.write_all(self.to_text().as_bytes()).and_then(|()| f.sync_all());
        if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
            let _ = std::fs::remove_file(&tmp);
            return Err(io(e));
        }
        Ok(())
    }

    /// Adds a client; refuses a bad name or one already present.
    pub fn add(&mut self, name: &str, key: Key, policy: KeyPolicy, path: &Path) -> Result<(), KeyringError> {
        check_client_name(name)?;
        if self.entries.contains_key(name) {
            return Err(KeyringError::Duplicate { path: path.to_path_buf(), name: name.into() });
        }
        if self.entries.len() >= KEYRING_ENTRIES_MAX {
            return Err(KeyringError::TooLarge { path: path.to_path_buf() });
        }
        self.entries.insert(name.to_string(), (key, policy));
        Ok(())
    }

    /// Removes a client.
    pub fn remove(&mut self, name: &str, path: &Path) -> Result<(), KeyringError> {
        self.entries
            .remove(name)
            .map(|_| ())
            .ok_or_else(|| KeyringError::NoSuchName { path: path.to_path_buf(), name: name.into() })
    }
}

/// What identifies one version of the keyring file: a rewrite (rename) changes the inode, an edit in place the
/// mtime or length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileStamp {
    dev: u64,
    ino: u64,
    mtime_ns: i128,
    len: u64,
}

impl FileStamp {
    pub(crate) fn of(path: &Path) -> Option<FileStamp> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        Some(FileStamp {
            dev: m.dev(),
            ino: m.ino(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            len: m.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyrings_round_trip_and_every_bad_form_is_refused() {
        let p = Path::new("/k");
        let mut k = ClientKeys::default();
        k.add("alice", Key::from_bytes([1; 32]), KeyPolicy::Fixed { uid: 1000, gid: 100 }, p).unwrap();
        k.add("lab-7.host_2", Key::from_bytes([2; 32]), KeyPolicy::SquashRoot, p).unwrap();
        k.add("build", Key::from_bytes([3; 32]), KeyPolicy::Trusted, p).unwrap();
        assert!(matches!(
            k.add("alice", Key::from_bytes([4; 32]), KeyPolicy::Trusted, p),
            Err(KeyringError::Duplicate { .. })
        ));
        let text = k.to_text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "weft-keyring-v1");
        assert_eq!(lines[1], format!("alice {} uid=1000,gid=100", "01".repeat(32)));
        assert_eq!(lines[2], format!("build {} trusted", "03".repeat(32)));
        assert_eq!(lines[3], format!("lab-7.host_2 {} squash-root", "02".repeat(32)));
        assert_eq!(ClientKeys::parse(&text, p).unwrap(), k);
        let hex = "ab".repeat(32);
        for bad in [
            String::new(),
            "weft-keyring-v2\n".into(),
            format!("weft-keyring-v1\nalice {hex}\n"),
            format!("weft-keyring-v1\nalice {hex} trusted x\n"),
            format!("weft-keyring-v1\nalice  {hex} trusted\n"),
            format!("weft-keyring-v1\ncluster {hex} trusted\n"),
            format!("weft-keyring-v1\nal/ice {hex} trusted\n"),
            format!("weft-keyring-v1\nalice {} trusted\n", &hex[..62]),
            format!("weft-keyring-v1\nalice {hex} root\n"),
            format!("weft-keyring-v1\nalice {hex} uid=1,gid=\n"),
            format!("weft-keyring-v1\nalice {hex} uid=-1,gid=2\n"),
            format!("weft-keyring-v1\nalice {hex} trusted\nalice {hex} trusted\n"),
        ] {
            assert!(ClientKeys::parse(&bad, p).is_err(), "{bad:?} must be refused");
        }
        assert!(ClientKeys::parse("weft-keyring-v1\n", p).unwrap().is_empty());
        assert!(ClientKeys::parse("weft-keyring-v1", p).unwrap().is_empty(), "the final newline may be missing");
    }

    #[test]
    fn client_names_are_checked() {
        for ok in ["a", "alice", "node-01.lab", "A_B", &"x".repeat(64)] {
            assert!(check_client_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "cluster", "pnfs", "-x", "a b", "a/b", "é", &"x".repeat(65)] {
            assert!(check_client_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn keyrings_are_private_and_saved_whole() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("weft-keyring-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("clients.keyring");
        assert!(ClientKeys::load_or_empty(&path).unwrap().is_empty());
        let mut k = ClientKeys::default();
        k.add("bob", Key::from_bytes([9; 32]), KeyPolicy::SquashRoot, &path).unwrap();
        k.save(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(ClientKeys::load(&path).unwrap(), k);
        let before = FileStamp::of(&path).unwrap();
        k.remove("bob", &path).unwrap();
        assert!(matches!(k.remove("bob", &path), Err(KeyringError::NoSuchName { .. })));
        k.save(&path).unwrap();
        assert_ne!(FileStamp::of(&path).unwrap(), before, "a rewrite is seen as a change");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(matches!(ClientKeys::load(&path), Err(KeyringError::Permissions { mode: 0o640, .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
