//! Keys (docs/format.md §9): the 256-bit key a key file holds, its file format, the sub-keys derived from it, and
//! the HMAC and random bytes everything above (`auth.rs`, `keyring.rs`, `capability.rs`) builds on.

use std::path::{Path, PathBuf};

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use weft_proto::msg::AUTH_BYTES;

/// The key id of the cluster key: the credential of servers and trusted hosts.
pub const CLUSTER_KEY_ID: &str = "cluster";

/// First word of a key file (docs/format.md §9).
const KEY_FILE_HEADER: &str = "weft-key-v1 ";

/// 32 bytes: a nonce, a proof or a session secret.
pub type Secret = [u8; AUTH_BYTES];

/// A 256-bit key. Never printed: its `Debug` hides the bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Key([u8; AUTH_BYTES]);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

/// What is wrong with a key file's text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyFormatError {
    #[error("it does not start with \"weft-key-v1 \"")]
    Header,
    #[error("the key has {0} hex digits, not 64")]
    Length(usize),
    #[error("the key has a character that is not a lower-case hex digit")]
    NotHex,
    #[error("text follows the key line")]
    Trailing,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    #[error("key file {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("key file {path} already exists; not overwriting it")]
    Exists { path: PathBuf },
    #[error(
        "key file {path} has mode {mode:04o}: it must not be readable or writable by group or other (chmod 600 {path})"
    )]
    Permissions { path: PathBuf, mode: u32 },
    #[error("key file {path} is not a Weft key: {reason}")]
    Format { path: PathBuf, reason: KeyFormatError },
    #[error("{role}: auth = \"key\" but no key_file is configured (name one, or set auth = \"none\")")]
    NoKeyFile { role: String },
    #[error("the system's random source failed")]
    Random,
}

impl Key {
    pub fn from_bytes(bytes: [u8; AUTH_BYTES]) -> Key {
        Key(bytes)
    }

    /// A fresh random key.
    pub fn generate() -> Result<Key, KeyError> {
        random_bytes().map(Key)
    }

    /// Parses a key file's text: `weft-key-v1 <64 lower-case hex>` and an optional final newline.
    pub fn parse(text: &str) -> Result<Key, KeyFormatError> {
        let rest = text.strip_prefix(KEY_FILE_HEADER).ok_or(KeyFormatError::Header)?;
        let hex = rest.strip_suffix('\n').unwrap_or(rest);
        if let Some(end) = hex.find(|c: char| c.is_whitespace()) {
            return Err(if hex[..end].len() == 2 * AUTH_BYTES {
                KeyFormatError::Trailing
            } else {
                KeyFormatError::NotHex
            });
        }
        if !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err(KeyFormatError::NotHex);
        }
        if hex.len() != 2 * AUTH_BYTES {
            return Err(KeyFormatError::Length(hex.len()));
        }
        let mut out = [0u8; AUTH_BYTES];
        for (i, b) in out.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| KeyFormatError::NotHex)?;
        }
        Ok(Key(out))
    }

    /// The key file's text.
    pub fn to_file_text(&self) -> String {
        let hex: String = self.0.iter().map(|b| format!("{b:02x}")).collect();
        format!("{KEY_FILE_HEADER}{hex}\n")
    }

    /// Reads a key file, refusing one that group or other may read or write.
    pub fn load(path: &Path) -> Result<Key, KeyError> {
        use std::os::unix::fs::PermissionsExt;
        let io = |source| KeyError::Io { path: path.to_path_buf(), source };
        let mode = std::fs::metadata(path).map_err(io)?.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(KeyError::Permissions { path: path.to_path_buf(), mode });
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        Key::parse(&text).map_err(|reason| KeyError::Format { path: path.to_path_buf(), reason })
    }

    /// Creates a key file holding a new random key, mode 0600; refuses to overwrite an existing file.
    pub fn create_file(path: &Path) -> Result<Key, KeyError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let key = Key::generate()?;
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                KeyError::Exists { path: path.to_path_buf() }
            } else {
                KeyError::Io { path: path.to_path_buf(), source: e }
            }
        })?;
        f.write_all(key.to_file_text().as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(|source| KeyError::Io { path: path.to_path_buf(), source })?;
        Ok(key)
    }

    /// Loads `path`, creating it (a new random key, mode 0600) if there is no file there.
    pub fn load_or_create(path: &Path) -> Result<Key, KeyError> {
        match Key::create_file(path) {
            Err(KeyError::Exists { .. }) => Key::load(path),
            other => other,
        }
    }

    /// A sub-key for one purpose, `HMAC(self, label)`, so one key is never used directly for two (the NFS
    /// gateway seals filehandles with `derive(b"weft-nfs-fh-v1")`, docs/format.md §15).
    pub fn derive(&self, label: &[u8]) -> Key {
        Key(mac(&self.hmac_key(), &[label]))
    }

    /// `HMAC(self, part₀ ‖ part₁ ‖ …)`.
    pub fn sign(&self, parts: &[&[u8]]) -> Secret {
        mac(&self.hmac_key(), parts)
    }

    pub(crate) fn hmac_key(&self) -> hmac::Key {
        hmac::Key::new(hmac::HMAC_SHA256, &self.0)
    }
}

/// 32 bytes from the system's random source.
pub fn random_bytes() -> Result<Secret, KeyError> {
    let mut b = [0u8; AUTH_BYTES];
    SystemRandom::new().fill(&mut b).map_err(|_| KeyError::Random)?;
    Ok(b)
}

pub(crate) fn mac(key: &hmac::Key, parts: &[&[u8]]) -> Secret {
    let mut ctx = hmac::Context::with_key(key);
    for p in parts {
        ctx.update(p);
    }
    let tag = ctx.sign();
    let mut out = [0u8; AUTH_BYTES];
    out.copy_from_slice(tag.as_ref());
    out
}
