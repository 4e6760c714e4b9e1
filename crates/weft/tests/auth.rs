//! Keys and authentication against real server processes: a peer without the cluster key can neither open a
//! session nor register a data server, a session serves only the connection it is bound to, key files must be
//! private, and `auth = "none"` works and says so.

use crate::common;

use std::path::Path;
use std::process::Stdio;

use common::*;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use weft_client::{Client, ClientTuning, ClusterConfig};
use weft_fabric::TcpFabric;
use weft_proto::frame::FLAG_ERROR;
use weft_proto::msg::{AuthBeginReq, AuthFinishReq, InoReq, SessionBindReq, SessionCreateReq, decode};
use weft_proto::{ErrorCode, ROOT_INO, Request, Response, ServerState, WireError};
use weft_rpc::auth::{self, Key, Nonces};
use weft_rpc::{AuthMode, ClientConfig, RpcClient};

const CONTROL_SLOT: u32 = u32::MAX;

/// A hand-made client: one TCP connection, one request at a time, frames built by hand.
struct Raw {
    s: TcpStream,
}

impl Raw {
    async fn connect(addr: &str) -> Raw {
        Raw { s: TcpStream::connect(addr).await.unwrap() }
    }

    /// Sends `req` on (session, slot, seq) and returns the reply: the response, or the server's error.
    async fn call(&mut self, req: &Request, session: u64, slot: u32, seq: u32) -> Result<Response, WireError> {
        let body = req.encode_body();
        self.s.write_all(&wire::request_frame(req.op() as u16, session, slot, seq, &body, &[])).await.unwrap();
        let (rh, rbody, rdata) = wire::read_reply(&mut self.s).await;
        assert!(rdata.is_empty());
        if rh.flags & FLAG_ERROR != 0 {
            return Err(decode::<WireError>(rh.op, &rbody).unwrap());
        }
        Ok(Response::decode(rh.op, &rbody).unwrap())
    }

    async fn control(&mut self, req: Request) -> Result<Response, WireError> {
        self.call(&req, 0, CONTROL_SLOT, 0).await
    }

    /// Runs the challenge–response with `key` as the cluster key; returns the nonces.
    async fn authenticate(&mut self, key: &Key) -> Nonces {
        let client_nonce = auth::random_bytes().unwrap();
        let r = match self.control(Request::AuthBegin(AuthBeginReq { key_id: "cluster".into(), client_nonce })).await {
            Ok(Response::AuthBegin(r)) => r,
            other => panic!("AuthBegin: {other:?}"),
        };
        let n = Nonces { client: client_nonce, server: r.server_nonce };
        assert!(auth::server_proof_matches(key, "cluster", &n, &r.server_proof), "the server proves the key");
        let client_proof = auth::client_proof(key, "cluster", &n.client, &n.server);
        self.control(Request::AuthFinish(AuthFinishReq { client_proof })).await.unwrap();
        n
    }
}

fn code<T: std::fmt::Debug>(r: Result<T, WireError>) -> ErrorCode {
    r.unwrap_err().code
}

fn other_key(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("other.key");
    if !p.exists() {
        Key::create_file(&p).unwrap();
    }
    p
}

/// Polls `what` (a log, a server list) until `ok`, for up to 30 s; the processes act on their own schedule.
async fn eventually<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "gave up waiting for: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_client_without_the_key_can_do_nothing_and_both_sides_say_why() {
    let cl = start("auth-client", 1).await;
    // Another key: the client refuses the server (which cannot prove our key), before sending any proof.
    let wrong = ClusterConfig {
        key_file: Some(other_key(cl.dir())),
        client: ClientTuning { attempts_max: 1, ..ClientTuning::default() },
        ..cl.cluster_config()
    };
    let err = Client::connect(&wrong).await.err().expect("a client with another key is refused").to_string();
    assert!(err.contains("could not prove it holds key \"cluster\""), "{err}");
    let mds_log = eventually("the MDS logs the failed handshake", async || {
        let log = cl.log("meta");
        log.contains("without proving the key").then_some(log)
    })
    .await;
    assert!(mds_log.contains("key_id=\"cluster\"") || mds_log.contains("key_id=cluster"), "{mds_log}");
    // The CLI says it on stderr too.
    let wrong_file = cl.dir().join("wrong-cluster.toml");
    std::fs::write(&wrong_file, wrong.to_toml()).unwrap();
    let out = std::process::Command::new(WEFT).args(["ls", "/"]).env("WEFT_CLUSTER", &wrong_file).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("could not prove it holds key"), "{stderr}");

    // No key at all: every op but Null is refused, on the MDS and on a data server.
    for addr in [cl.mds_addr().to_string(), cl.data_addrs()[0].clone()] {
        let err = RpcClient::connect(TcpFabric::default(), &addr, ClientConfig::default()).await.err().unwrap();
        assert_eq!(err.remote().map(|e| e.code), Some(ErrorCode::Unauthenticated), "{err}");
        let mut raw = Raw::connect(&addr).await;
        assert_eq!(raw.control(Request::Null(())).await, Ok(Response::Null(())));
        let create = Request::SessionCreate(SessionCreateReq { client_name: "x".into(), slots: 1 });
        assert_eq!(code(raw.control(create).await), ErrorCode::Unauthenticated);
        assert_eq!(
            code(raw.call(&Request::GetAttr(InoReq { ino: ROOT_INO }), 1, 0, 1).await),
            ErrorCode::Unauthenticated
        );
        // A made-up proof is refused too, and the connection stays unauthenticated.
        let begin = AuthBeginReq { key_id: "cluster".into(), client_nonce: [1; 32] };
        assert!(matches!(raw.control(Request::AuthBegin(begin)).await, Ok(Response::AuthBegin(_))));
        let finish = Request::AuthFinish(AuthFinishReq { client_proof: [0; 32] });
        assert_eq!(code(raw.control(finish).await), ErrorCode::Unauthenticated);
        let create = Request::SessionCreate(SessionCreateReq { client_name: "x".into(), slots: 1 });
        assert_eq!(code(raw.control(create).await), ErrorCode::Unauthenticated);
        let unknown = AuthBeginReq { key_id: "nobody".into(), client_nonce: [1; 32] };
        assert_eq!(code(raw.control(Request::AuthBegin(unknown)).await), ErrorCode::Unauthenticated);
    }
    assert!(cl.log("meta").contains("has not authenticated"));
    assert!(cl.log("data0").contains("has not authenticated"));
    // The key holder is served as usual.
    cl.client().await.mkdir(ROOT_INO, "ok", 0o755).await.unwrap();
}

#[tokio::test]
async fn a_session_serves_only_the_connection_it_is_bound_to() {
    let cl = start("auth-session", 1).await;
    let key = Key::load(&cl.key_file()).unwrap();
    let getattr = Request::GetAttr(InoReq { ino: ROOT_INO });
    for addr in [cl.mds_addr().to_string(), cl.data_addrs()[0].clone()] {
        let probe = if addr == cl.mds_addr() { getattr.clone() } else { Request::SpaceStat(()) };
        let mut owner = Raw::connect(&addr).await;
        let owner_nonces = owner.authenticate(&key).await;
        let create = Request::SessionCreate(SessionCreateReq { client_name: "owner".into(), slots: 2 });
        let Ok(Response::SessionCreate(s)) = owner.control(create).await else { panic!("no session") };
        assert_ne!(s.session, 0);
        assert!(owner.call(&probe, s.session, 0, 1).await.is_ok());

        // Another connection, authenticated with the same cluster key, can neither use nor destroy it…
        let mut thief = Raw::connect(&addr).await;
        let thief_nonces = thief.authenticate(&key).await;
        let e = thief.call(&probe, s.session, 0, 2).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::StaleSession, "{e:?}");
        assert!(e.message.contains("not bound to this connection"), "{e:?}");
        assert_eq!(
            code(thief.call(&Request::SessionDestroy(()), s.session, CONTROL_SLOT, 0).await),
            ErrorCode::StaleSession
        );
        // …nor bind it without the session secret (a proof made from the key alone, or replayed, fails).
        let guess = auth::bind_proof(&auth::session_secret(&key, &thief_nonces, s.session), s.session, &thief_nonces);
        let bind = Request::SessionBind(SessionBindReq { session: s.session, proof: guess });
        assert_eq!(code(thief.control(bind).await), ErrorCode::StaleSession);
        let secret = auth::session_secret(&key, &owner_nonces, s.session);
        let replayed = auth::bind_proof(&secret, s.session, &owner_nonces);
        let bind = Request::SessionBind(SessionBindReq { session: s.session, proof: replayed });
        assert_eq!(code(thief.control(bind).await), ErrorCode::StaleSession, "a proof is bound to its connection");
        // The owner goes on; its slot state is intact.
        assert!(owner.call(&probe, s.session, 0, 2).await.is_ok());

        // The owner's secret re-binds the session to a new connection (what a reconnecting client does), and
        // from then on only that one is served.
        let mut again = Raw::connect(&addr).await;
        let n = again.authenticate(&key).await;
        let bind = Request::SessionBind(SessionBindReq {
            session: s.session,
            proof: auth::bind_proof(&secret, s.session, &n),
        });
        assert_eq!(again.control(bind).await, Ok(Response::SessionBind(())));
        assert!(again.call(&probe, s.session, 0, 3).await.is_ok());
        assert_eq!(code(owner.call(&probe, s.session, 0, 4).await), ErrorCode::StaleSession);
        assert_eq!(
            again.call(&Request::SessionDestroy(()), s.session, CONTROL_SLOT, 0).await,
            Ok(Response::SessionDestroy(()))
        );
        assert_eq!(code(again.call(&probe, s.session, 0, 4).await), ErrorCode::StaleSession);
    }
}

/// Starts `weft data` with `config` and returns it once it listens (the caller kills it).
async fn spawn_data(config: &Path, log: &Path) -> tokio::process::Child {
    let log_file = std::fs::File::create(log).unwrap();
    let mut child = tokio::process::Command::new(WEFT)
        .args(["data", "--config"])
        .arg(config)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log_file))
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = lines.next_line().await.unwrap().unwrap_or_default();
    assert!(
        line.starts_with("WEFT-READY "),
        "the rogue data server did not start: {}",
        std::fs::read_to_string(log).unwrap()
    );
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    child
}

#[tokio::test]
async fn a_data_server_with_another_key_is_not_registered_and_cannot_take_over_an_id() {
    let cl = start("auth-register", 1).await;
    let before = cl.client().await.cluster_info().await.unwrap();
    let key = other_key(cl.dir());
    let mut rogues = Vec::new();
    for id in [0u32, 7] {
        let root = cl.dir().join(format!("rogue{id}"));
        std::fs::create_dir_all(&root).unwrap();
        let cfg = cl.dir().join(format!("config/rogue{id}.toml"));
        let text = format!(
            "id = {id}\nlisten = \"127.0.0.1:0\"\nroot = {root:?}\nmds = \"{}\"\nkey_file = {key:?}\nheartbeat_ms = 100\nshm = false\nrdma = false\n",
            cl.mds_addr()
        );
        std::fs::write(&cfg, text).unwrap();
        let log = cl.dir().join(format!("logs/rogue{id}.log"));
        rogues.push((spawn_data(&cfg, &log).await, log));
    }
    for (_, log) in &rogues {
        let text = eventually("the rogue logs its refusal", async || {
            let t = std::fs::read_to_string(log).unwrap_or_default();
            t.contains("heartbeat failed").then_some(t)
        })
        .await;
        assert!(text.contains("could not prove it holds key"), "{text}");
    }
    eventually("the MDS logs the refusals", async || {
        cl.log("meta").matches("without proving the key").count().ge(&2).then_some(())
    })
    .await;
    // Server 0 keeps its address, 7 is unknown; `weft status` agrees.
    let after = cl.client().await.cluster_info().await.unwrap();
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!((after[0].id, &after[0].addr, after[0].state), (0, &before[0].addr, ServerState::Up));
    let (ok, out, err) = weft(&cl, &["status"]);
    assert!(ok, "{err}");
    assert!(out.contains(&before[0].addr), "{out}");
    assert!(!out.lines().any(|l| l.trim_start().starts_with("7 ")), "the rogue id 7 is not listed: {out}");
}

#[tokio::test]
async fn a_key_file_others_may_read_is_refused_with_its_name() {
    use std::os::unix::fs::PermissionsExt;
    let dir = test_dir("auth-mode");
    let key = dir.join("cluster.key");
    Key::create_file(&key).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let cfg = dir.join("meta.toml");
    std::fs::write(&cfg, format!("listen = \"127.0.0.1:0\"\ndata_dir = {:?}\nkey_file = {key:?}\n", dir.join("m")))
        .unwrap();
    let out = std::process::Command::new(WEFT).args(["meta", "--config"]).arg(&cfg).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains(&key.display().to_string()) && stderr.contains("0644"), "{stderr}");
    // auth = "key" without a key file is a startup error that says what to do.
    std::fs::write(&cfg, format!("listen = \"127.0.0.1:0\"\ndata_dir = {:?}\n", dir.join("m"))).unwrap();
    let out = std::process::Command::new(WEFT).args(["meta", "--config"]).arg(&cfg).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("no key_file"), "{stderr}");
    // `weft key new` makes a private key file and never overwrites one.
    let new = dir.join("new.key");
    let out = std::process::Command::new(WEFT).args(["key", "new"]).arg(&new).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::metadata(&new).unwrap().permissions().mode() & 0o777, 0o600);
    let first = Key::load(&new).unwrap();
    let out = std::process::Command::new(WEFT).args(["key", "new"]).arg(&new).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("already exists"));
    assert_eq!(Key::load(&new).unwrap(), first);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn auth_none_works_and_warns_on_every_role() {
    let cl = start_with("auth-none", 1, |o| o.auth = AuthMode::None).await;
    assert!(!cl.key_file().exists(), "no key is made with auth = none");
    let c = cl.client().await;
    c.mkdir(ROOT_INO, "open", 0o755).await.unwrap();
    for role in ["meta", "data0"] {
        assert!(cl.log(role).contains("AUTHENTICATION IS OFF"), "{role}: {}", cl.log(role));
    }
    // A client holding a key refuses a server that cannot prove it.
    let dir = test_dir("auth-none-key");
    let cfg = ClusterConfig { key_file: Some(other_key(&dir)), auth: AuthMode::Key, ..cl.cluster_config() };
    let err = Client::connect(&cfg).await.err().expect("refused").to_string();
    assert!(err.contains("authentication is off"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
