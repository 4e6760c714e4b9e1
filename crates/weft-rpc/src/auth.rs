//! Who is at the other end of a connection: key files, the mutual challenge–response every connection runs before
//! anything else, and the session secret and bind proof that keep a session with the connection that owns it.
//!
//! The formats (key file, handshake bodies, the inputs of every HMAC) are in docs/format.md §9. HMAC-SHA256 and the
//! random bytes come from `ring`, whose `hmac::verify` compares in constant time. Nothing here does I/O on a
//! connection: the server's half of the handshake is the pure state machine [`ServerAuth`], the client's half is in
//! `client.rs`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};
use weft_proto::msg::{AUTH_BYTES, AuthBeginReq, AuthBeginResp, AuthFinishReq, KEY_ID_BYTES_MAX};
use weft_proto::{ErrorCode, WireError};

use crate::key::mac;
pub use crate::key::{CLUSTER_KEY_ID, Key, KeyError, KeyFormatError, Secret, random_bytes};
use crate::keyring::{ClientKeys, FileStamp, KeyPolicy, KeyringError};

const SERVER_PROOF_LABEL: &[u8] = b"weft-auth-v1 server";
const CLIENT_PROOF_LABEL: &[u8] = b"weft-auth-v1 client";
const SESSION_SECRET_LABEL: &[u8] = b"weft-session-v1";
const BIND_PROOF_LABEL: &[u8] = b"weft-bind-v1";
const SIDE_SERVER_LABEL: &[u8] = b"weft-rdma-side-v1 server";
const SIDE_CLIENT_LABEL: &[u8] = b"weft-rdma-side-v1 client";
const TLS_BINDING_LABEL: &[u8] = b"weft-tls-binding-v1";

/// `auth = "key" | "none"` in every role's config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// Every connection proves the key named by `key_file` (the default).
    #[default]
    Key,
    /// No authentication at all: for loopback experiments only; every role says so loudly at start.
    None,
}

/// The key a role runs with: loaded from `key_file` with `auth = "key"`, none (and a loud warning) with
/// `auth = "none"`. `role` names the process in messages.
pub fn role_key(auth: AuthMode, key_file: Option<&Path>, role: &str) -> Result<Option<Key>, KeyError> {
    match auth {
        AuthMode::None => {
            tracing::warn!(
                "{role}: AUTHENTICATION IS OFF (auth = \"none\"): any process that reaches this port may do anything; \
                 for loopback experiments only"
            );
            Ok(None)
        }
        AuthMode::Key => {
            let path = key_file.ok_or_else(|| KeyError::NoKeyFile { role: role.to_string() })?;
            Key::load(path).map(Some)
        }
    }
}

/// The key ring a server role runs with: none with authentication off; else the cluster key, and the clients
/// keyring when the config names one.
pub fn role_keyring(key: Option<Key>, clients_keyring: Option<&Path>) -> Result<Option<Arc<KeyRing>>, KeyringError> {
    let Some(key) = key else { return Ok(None) };
    Ok(Some(Arc::new(match clients_keyring {
        Some(path) => KeyRing::with_clients(key, path)?,
        None => KeyRing::cluster(key),
    })))
}

/// A client's credential: which key it proves, and the key.
#[derive(Debug, Clone)]
pub struct Credential {
    pub key_id: Arc<str>,
    pub key: Key,
}

impl Credential {
    /// The cluster key as a credential.
    pub fn cluster(key: Key) -> Credential {
        Credential { key_id: CLUSTER_KEY_ID.into(), key }
    }
}

/// Who an authenticated connection speaks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// Authentication is off on this server: everyone is trusted as what they claim.
    Anonymous,
    /// Proved the key named `key_id` in the server's [`KeyRing`]; `policy` says what its holder may assert.
    Key { key_id: Arc<str>, policy: KeyPolicy },
}

impl Principal {
    /// Proved the cluster key.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Principal::Key { policy: KeyPolicy::Cluster, .. })
    }

    /// May act as a server of the cluster (register a data server): the cluster key, or anyone when authentication
    /// is off.
    pub fn is_trusted_server(&self) -> bool {
        matches!(self, Principal::Anonymous) || self.is_cluster()
    }

    /// The key id, for logs.
    pub fn name(&self) -> &str {
        match self {
            Principal::Anonymous => "anonymous (auth off)",
            Principal::Key { key_id, .. } => key_id,
        }
    }
}

/// The keys a server accepts, by key id: the cluster key, and the per-client keys of the clients keyring
/// (`weft key add`), if the server's config names one.
///
/// The keyring is re-read when it changes while the server runs: every handshake naming a client key `stat`s the
/// file (one syscall per new connection, bounded by the connection caps) and reads it again only when its inode,
/// length or mtime differ from the version loaded. A key added with `weft key add` works for the next connection;
/// a key removed stops new connections, while connections already authenticated keep their principal until they
/// close. A file that has become unreadable or malformed is logged and the last good version stays in force.
#[derive(Debug)]
pub struct KeyRing {
    cluster: Key,
    clients: Option<ClientsFile>,
}

#[derive(Debug)]
struct ClientsFile {
    path: PathBuf,
    loaded: Mutex<(Option<FileStamp>, ClientKeys)>,
}

impl KeyRing {
    /// A ring holding only the cluster key.
    pub fn cluster(key: Key) -> KeyRing {
        KeyRing { cluster: key, clients: None }
    }

    /// The cluster key and the clients keyring at `path`, which must exist and be well formed (a typo in a config
    /// must not silently turn every client key away).
    pub fn with_clients(key: Key, path: &Path) -> Result<KeyRing, KeyringError> {
        let stamp = FileStamp::of(path);
        let keys = ClientKeys::load(path)?;
        Ok(KeyRing {
            cluster: key,
            clients: Some(ClientsFile { path: path.to_path_buf(), loaded: Mutex::new((stamp, keys)) }),
        })
    }

    /// The key named `key_id` and its policy.
    pub fn get(&self, key_id: &str) -> Option<(Key, KeyPolicy)> {
        if key_id == CLUSTER_KEY_ID {
            return Some((self.cluster.clone(), KeyPolicy::Cluster));
        }
        // Never a key, whatever a keyring says (its reader refuses the name too): pNFS handles are sealed for it.
        if key_id == weft_proto::msg::PNFS_KEY_ID {
            return None;
        }
        let clients = self.clients.as_ref()?;
        let mut loaded = clients.loaded.lock().expect("keyring");
        let stamp = FileStamp::of(&clients.path);
        if stamp != loaded.0 {
            match ClientKeys::load(&clients.path) {
                Ok(keys) => {
                    tracing::info!(path = %clients.path.display(), keys = keys.len(), "clients keyring re-read");
                    *loaded = (stamp, keys);
                }
                Err(e) => {
                    // Remember the bad version, so it is logged once, not on every handshake.
                    loaded.0 = stamp;
                    tracing::warn!("{e}; keeping the keyring as last read");
                }
            }
        }
        loaded.1.get(key_id).cloned()
    }
}

/// A random non-zero 64-bit id (session ids). Falls back to the clock and a counter only if the system's random
/// source fails, which on Linux means getrandom(2) failed.
pub fn random_id() -> u64 {
    let mut b = [0u8; 8];
    loop {
        if SystemRandom::new().fill(&mut b).is_err() {
            static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
            b = ((t as u64) ^ N.fetch_add(0x9E37_79B9_7F4A_7C15, std::sync::atomic::Ordering::Relaxed)).to_le_bytes();
        }
        let id = u64::from_le_bytes(b);
        if id != 0 {
            return id;
        }
    }
}

/// Checks `tag` against the HMAC of `parts` in constant time.
fn mac_matches(key: &hmac::Key, parts: &[&[u8]], tag: &Secret) -> bool {
    hmac::verify(key, &parts.concat(), tag).is_ok()
}

/// HMAC(key, "weft-auth-v1 server" ‖ key_id ‖ client_nonce ‖ server_nonce).
pub fn server_proof(key: &Key, key_id: &str, client_nonce: &Secret, server_nonce: &Secret) -> Secret {
    mac(&key.hmac_key(), &[SERVER_PROOF_LABEL, key_id.as_bytes(), client_nonce, server_nonce])
}

/// HMAC(key, "weft-auth-v1 client" ‖ key_id ‖ client_nonce ‖ server_nonce).
pub fn client_proof(key: &Key, key_id: &str, client_nonce: &Secret, server_nonce: &Secret) -> Secret {
    mac(&key.hmac_key(), &[CLIENT_PROOF_LABEL, key_id.as_bytes(), client_nonce, server_nonce])
}

/// Constant-time check of a server's proof (on the client).
pub fn server_proof_matches(key: &Key, key_id: &str, nonces: &Nonces, proof: &Secret) -> bool {
    mac_matches(&key.hmac_key(), &[SERVER_PROOF_LABEL, key_id.as_bytes(), &nonces.client, &nonces.server], proof)
}

/// A side-channel proof (side_auth.rs): HMAC(key, "weft-rdma-side-v1 server|client" ‖ key_id ‖ client_nonce ‖
/// server_nonce); `server` picks the direction.
pub fn side_proof(key: &Key, server: bool, key_id: &str, client_nonce: &Secret, server_nonce: &Secret) -> Secret {
    let label = if server { SIDE_SERVER_LABEL } else { SIDE_CLIENT_LABEL };
    mac(&key.hmac_key(), &[label, key_id.as_bytes(), client_nonce, server_nonce])
}

/// Constant-time check of a side-channel proof.
pub fn side_proof_matches(
    key: &Key,
    server: bool,
    key_id: &str,
    client_nonce: &Secret,
    server_nonce: &Secret,
    proof: &Secret,
) -> bool {
    let label = if server { SIDE_SERVER_LABEL } else { SIDE_CLIENT_LABEL };
    mac_matches(&key.hmac_key(), &[label, key_id.as_bytes(), client_nonce, server_nonce], proof)
}

/// HMAC(key, "weft-session-v1" ‖ client_nonce ‖ server_nonce ‖ session LE): the secret of a session, known to both
/// ends of the connection that created it, never sent.
pub fn session_secret(key: &Key, nonces: &Nonces, session: u64) -> Secret {
    mac(&key.hmac_key(), &[SESSION_SECRET_LABEL, &nonces.client, &nonces.server, &session.to_le_bytes()])
}

/// HMAC(session secret, "weft-bind-v1" ‖ session LE ‖ client_nonce ‖ server_nonce) of the connection binding it.
pub fn bind_proof(secret: &Secret, session: u64, nonces: &Nonces) -> Secret {
    let k = hmac::Key::new(hmac::HMAC_SHA256, secret);
    mac(&k, &[BIND_PROOF_LABEL, &session.to_le_bytes(), &nonces.client, &nonces.server])
}

/// Constant-time check of a bind proof (on the server).
pub fn bind_proof_matches(secret: &Secret, session: u64, nonces: &Nonces, proof: &Secret) -> bool {
    let k = hmac::Key::new(hmac::HMAC_SHA256, secret);
    mac_matches(&k, &[BIND_PROOF_LABEL, &session.to_le_bytes(), &nonces.client, &nonces.server], proof)
}

/// The client nonce the proofs use (docs/format.md §11): with a channel binding (TLS),
/// `SHA-256("weft-tls-binding-v1" ‖ client_nonce ‖ binding)`, so proofs made on one TLS session do not verify on
/// another; without one, the nonce as sent.
pub fn bound_nonce(client_nonce: &Secret, binding: Option<&[u8; 32]>) -> Secret {
    let Some(binding) = binding else { return *client_nonce };
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for part in [TLS_BINDING_LABEL, &client_nonce[..], &binding[..]] {
        ctx.update(part);
    }
    let mut out = [0u8; AUTH_BYTES];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// The two nonces of one connection's handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nonces {
    pub client: Secret,
    pub server: Secret,
}

/// What an authenticated connection knows of its handshake: who, with which key, and the nonces.
#[derive(Debug, Clone)]
pub struct Authenticated {
    pub principal: Principal,
    pub key: Key,
    pub nonces: Nonces,
}

/// The server's side of one connection's handshake.
#[derive(Debug, Default)]
pub enum ServerAuth {
    #[default]
    Fresh,
    /// `AuthBegin` answered; waiting for the client's proof.
    Begun {
        key_id: Arc<str>,
        key: Key,
        policy: KeyPolicy,
        nonces: Nonces,
    },
    Done(Authenticated),
}

fn unauthenticated(msg: impl Into<String>) -> WireError {
    WireError::new(ErrorCode::Unauthenticated, msg)
}

impl ServerAuth {
    /// Answers `AuthBegin` with a fresh nonce and the server's proof.
    pub fn begin(&mut self, ring: &KeyRing, req: &AuthBeginReq) -> Result<AuthBeginResp, WireError> {
        if matches!(self, ServerAuth::Done(_)) {
            return Err(unauthenticated("this connection is already authenticated"));
        }
        if req.key_id.len() > KEY_ID_BYTES_MAX {
            return Err(unauthenticated(format!("key id of {} bytes is too long", req.key_id.len())));
        }
        let Some((key, policy)) = ring.get(&req.key_id) else {
            *self = ServerAuth::Fresh;
            return Err(unauthenticated(format!("unknown key id {:?}", req.key_id)));
        };
        let server_nonce = random_bytes().map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))?;
        let nonces = Nonces { client: req.client_nonce, server: server_nonce };
        let server_proof = server_proof(&key, &req.key_id, &nonces.client, &nonces.server);
        *self = ServerAuth::Begun { key_id: req.key_id.as_str().into(), key, policy, nonces };
        Ok(AuthBeginResp { server_nonce, server_proof })
    }

    /// Checks the client's proof; on success the connection is authenticated. Any failure starts over.
    pub fn finish(&mut self, req: &AuthFinishReq) -> Result<&Authenticated, WireError> {
        match std::mem::take(self) {
            ServerAuth::Begun { key_id, key, policy, nonces } => {
                let parts: [&[u8]; 4] = [CLIENT_PROOF_LABEL, key_id.as_bytes(), &nonces.client, &nonces.server];
                if !mac_matches(&key.hmac_key(), &parts, &req.client_proof) {
                    return Err(unauthenticated(format!("wrong proof of key {key_id:?}: the client has another key")));
                }
                *self = ServerAuth::Done(Authenticated { principal: Principal::Key { key_id, policy }, key, nonces });
                match self {
                    ServerAuth::Done(a) => Ok(a),
                    _ => unreachable!("just set"),
                }
            }
            done @ ServerAuth::Done(_) => {
                *self = done;
                Err(unauthenticated("this connection is already authenticated"))
            }
            ServerAuth::Fresh => Err(unauthenticated("AuthFinish without AuthBegin")),
        }
    }

    /// The key id of a handshake begun but not finished (for the log line when the peer leaves).
    pub fn pending_key_id(&self) -> Option<&str> {
        match self {
            ServerAuth::Begun { key_id, .. } => Some(key_id),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    /// RFC 4231 test case 2 (key "Jefe"), through the same `mac` every proof uses.
    #[test]
    fn hmac_sha256_known_answer_rfc4231_case_2() {
        let key = hmac::Key::new(hmac::HMAC_SHA256, b"Jefe");
        let tag = mac(&key, &[b"what do ya want ", b"for nothing?"]);
        assert_eq!(tag.to_vec(), hex("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"));
        assert!(mac_matches(&key, &[b"what do ya want for nothing?"], &tag));
        let mut bad = tag;
        bad[31] ^= 1;
        assert!(!mac_matches(&key, &[b"what do ya want for nothing?"], &bad));
    }

    /// RFC 4231 test case 1 (20 bytes of 0x0b, "Hi There").
    #[test]
    fn hmac_sha256_known_answer_rfc4231_case_1() {
        let key = hmac::Key::new(hmac::HMAC_SHA256, &[0x0b; 20]);
        let tag = mac(&key, &[b"Hi There"]);
        assert_eq!(tag.to_vec(), hex("b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"));
    }

    /// The proofs are the HMACs of the documented inputs (docs/format.md §9), so another implementation agrees.
    #[test]
    fn proofs_are_hmacs_of_the_documented_inputs() {
        let key = Key::from_bytes([0x11; 32]);
        let n = Nonces { client: [0x22; 32], server: [0x33; 32] };
        let k = hmac::Key::new(hmac::HMAC_SHA256, &[0x11; 32]);
        let expect = |label: &[u8], rest: &[&[u8]]| {
            let mut parts = vec![label];
            parts.extend_from_slice(rest);
            mac(&k, &parts)
        };
        assert_eq!(
            server_proof(&key, "cluster", &n.client, &n.server),
            expect(b"weft-auth-v1 server", &[b"cluster", &n.client, &n.server])
        );
        assert_eq!(
            client_proof(&key, "cluster", &n.client, &n.server),
            expect(b"weft-auth-v1 client", &[b"cluster", &n.client, &n.server])
        );
        assert_ne!(
            server_proof(&key, "cluster", &n.client, &n.server),
            client_proof(&key, "cluster", &n.client, &n.server)
        );
        let secret = session_secret(&key, &n, 0x0102);
        assert_eq!(secret, expect(b"weft-session-v1", &[&n.client, &n.server, &0x0102u64.to_le_bytes()]));
        let p = bind_proof(&secret, 0x0102, &n);
        assert!(bind_proof_matches(&secret, 0x0102, &n, &p));
        assert!(!bind_proof_matches(&secret, 0x0103, &n, &p), "the proof names its session");
        let other = Nonces { client: [0x44; 32], ..n };
        assert!(!bind_proof_matches(&secret, 0x0102, &other, &p), "the proof is bound to the connection's nonces");
        assert!(server_proof_matches(&key, "cluster", &n, &server_proof(&key, "cluster", &n.client, &n.server)));
        assert!(!server_proof_matches(
            &Key::from_bytes([0x12; 32]),
            "cluster",
            &n,
            &server_proof(&key, "cluster", &n.client, &n.server)
        ));
    }

    #[test]
    fn key_text_round_trips_and_every_bad_form_is_refused() {
        let key = Key::generate().unwrap();
        let text = key.to_file_text();
        assert!(text.starts_with("weft-key-v1 ") && text.ends_with('\n') && text.len() == 12 + 64 + 1);
        assert_eq!(Key::parse(&text).unwrap(), key);
        assert_eq!(Key::parse(text.trim_end()).unwrap(), key, "the final newline may be missing");
        let hex64 = &text[12..76];
        assert_eq!(Key::parse(&format!("weft-key-v2 {hex64}\n")), Err(KeyFormatError::Header));
        assert_eq!(Key::parse(hex64), Err(KeyFormatError::Header));
        assert_eq!(Key::parse(&format!("weft-key-v1 {}\n", &hex64[..62])), Err(KeyFormatError::Length(62)));
        assert_eq!(Key::parse(&format!("weft-key-v1 {hex64}00\n")), Err(KeyFormatError::Length(66)));
        assert_eq!(Key::parse(&format!("weft-key-v1 A{}\n", &hex64[1..])), Err(KeyFormatError::NotHex));
        assert_eq!(Key::parse(&format!("weft-key-v1 {}zz\n", &hex64[..62])), Err(KeyFormatError::NotHex));
        assert_eq!(Key::parse(&format!("weft-key-v1 {hex64}\n\n")), Err(KeyFormatError::Trailing));
        assert_eq!(Key::parse(&format!("weft-key-v1 {hex64} extra\n")), Err(KeyFormatError::Trailing));
        assert_eq!(format!("{key:?}"), "Key(..)", "a key is never printed");
    }

    #[test]
    fn key_files_are_private_and_never_overwritten() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("weft-key-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("k");
        let key = Key::create_file(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(Key::load(&path).unwrap(), key);
        assert!(matches!(Key::create_file(&path), Err(KeyError::Exists { .. })));
        assert_eq!(Key::load_or_create(&path).unwrap(), key);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = Key::load(&path).unwrap_err();
        assert!(matches!(err, KeyError::Permissions { mode: 0o644, .. }), "{err}");
        assert!(err.to_string().contains(&path.display().to_string()), "the message names the file: {err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, "weft-key-v1 00\n").unwrap();
        let err = Key::load(&path).unwrap_err();
        assert!(matches!(err, KeyError::Format { reason: KeyFormatError::Length(2), .. }), "{err}");
        assert!(err.to_string().contains(&path.display().to_string()));
        assert!(matches!(Key::load(&dir.join("missing")), Err(KeyError::Io { .. })));
        assert!(matches!(role_key(AuthMode::Key, None, "test"), Err(KeyError::NoKeyFile { .. })));
        assert!(role_key(AuthMode::None, None, "test").unwrap().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_server_handshake_accepts_only_the_right_proof_in_order() {
        let key = Key::from_bytes([5; 32]);
        let ring = KeyRing::cluster(key.clone());
        let begin = AuthBeginReq { key_id: "cluster".into(), client_nonce: [9; 32] };
        // Finish before begin.
        let mut s = ServerAuth::default();
        assert_eq!(s.finish(&AuthFinishReq { client_proof: [0; 32] }).unwrap_err().code, ErrorCode::Unauthenticated);
        // Unknown key id.
        let unknown = AuthBeginReq { key_id: "nobody".into(), ..begin.clone() };
        assert_eq!(s.begin(&ring, &unknown).unwrap_err().code, ErrorCode::Unauthenticated);
        // A wrong proof, then the handshake starts over.
        let r = s.begin(&ring, &begin).unwrap();
        let n = Nonces { client: begin.client_nonce, server: r.server_nonce };
        assert!(server_proof_matches(&key, "cluster", &n, &r.server_proof));
        assert_eq!(s.pending_key_id(), Some("cluster"));
        let wrong = client_proof(&Key::from_bytes([6; 32]), "cluster", &n.client, &n.server);
        assert_eq!(s.finish(&AuthFinishReq { client_proof: wrong }).unwrap_err().code, ErrorCode::Unauthenticated);
        let right = client_proof(&key, "cluster", &n.client, &n.server);
        assert!(s.finish(&AuthFinishReq { client_proof: right }).is_err(), "a failed proof needs a new AuthBegin");
        // The right proof, with fresh nonces.
        let r2 = s.begin(&ring, &begin).unwrap();
        assert_ne!(r2.server_nonce, r.server_nonce, "every handshake has a fresh server nonce");
        let proof = client_proof(&key, "cluster", &begin.client_nonce, &r2.server_nonce);
        let done = s.finish(&AuthFinishReq { client_proof: proof }).unwrap();
        assert!(done.principal.is_cluster() && done.principal.is_trusted_server());
        // Nothing more to do on an authenticated connection.
        assert!(s.begin(&ring, &begin).is_err());
        assert!(matches!(s, ServerAuth::Done(_)));
    }

    #[test]
    fn random_ids_are_never_zero_and_differ() {
        let ids: std::collections::HashSet<u64> = (0..1000).map(|_| random_id()).collect();
        assert_eq!(ids.len(), 1000);
        assert!(!ids.contains(&0));
    }

    /// The TLS channel binding (docs/format.md §11): the documented digest, identity without a binding, and a
    /// proof made on one TLS session does not verify on another (a relay terminating TLS on both sides).
    #[test]
    fn a_channel_binding_ties_the_proofs_to_one_tls_session() {
        let cn = [1u8; AUTH_BYTES];
        assert_eq!(bound_nonce(&cn, None), cn);
        let (a, b) = ([0xaau8; 32], [0xbbu8; 32]);
        let mut input = b"weft-tls-binding-v1".to_vec();
        input.extend_from_slice(&cn);
        input.extend_from_slice(&a);
        assert_eq!(&bound_nonce(&cn, Some(&a))[..], ring::digest::digest(&ring::digest::SHA256, &input).as_ref());
        let key = Key::from_bytes([7; AUTH_BYTES]);
        let sn = [2u8; AUTH_BYTES];
        // The server's session with the relay has binding `a`, the client's has `b`.
        let server_side = Nonces { client: bound_nonce(&cn, Some(&a)), server: sn };
        let client_side = Nonces { client: bound_nonce(&cn, Some(&b)), server: sn };
        let proof = server_proof(&key, "cluster", &server_side.client, &server_side.server);
        assert!(!server_proof_matches(&key, "cluster", &client_side, &proof));
        assert!(server_proof_matches(&key, "cluster", &server_side, &proof));
    }
}
