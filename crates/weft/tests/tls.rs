//! TLS on the `tcp` fabric against real server processes: bytes round-trip under TLS (the data servers' mapped
//! reads and vectored writes included), a plaintext client and a TLS server refuse each other (and the reverse)
//! with a clear error on both sides, a client refuses a server whose certificate does not chain to its CA or does
//! not name the address it dialled, and `weft tls ca` / `weft tls cert` make working, private files.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use bytes::{Bytes, BytesMut};
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weft_client::{Client, ClientTuning, ClusterConfig, FabricChoice, OpenMode};
use weft_fabric::{Fabric, Listener, TcpFabric, TlsConfig, TlsFiles};
use weft_launch::tls::{CA_CERT_FILE, CA_KEY_FILE, SERVER_CERT_FILE, SERVER_KEY_FILE};

/// Polls `what` (a log) until `ok`, for up to 30 s; the processes act on their own schedule.
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "gave up waiting for: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

async fn start_tls(name: &str, servers: u32, tls: bool) -> TestCluster {
    start_with(name, servers, |o| o.tls = tls).await
}

/// A client config for `cl` that gives up at once and uses tcp (where TLS applies) for data too.
fn tcp_config(cl: &TestCluster) -> ClusterConfig {
    let client = ClientTuning { attempts_max: 1, fabric: FabricChoice::Tcp, ..ClientTuning::default() };
    ClusterConfig { client, ..cl.cluster_config() }
}

/// Runs `weft ARGS` to completion and returns its stdout; panics with its stderr if it fails.
fn weft(args: &[&str]) -> String {
    let out = std::process::Command::new(WEFT).args(args).output().unwrap();
    assert!(out.status.success(), "weft {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Another cluster's CA, made with the CLI.
fn other_ca(dir: &Path) -> PathBuf {
    let ca = dir.join("other-ca");
    weft(&["tls", "ca", "--out", ca.to_str().unwrap()]);
    ca
}

#[tokio::test]
async fn bytes_round_trip_under_tls() {
    let cl = start_tls("tls-roundtrip", 2, true).await;
    assert!(cl.log("meta").contains("tls=true"), "the MDS says TLS is on");
    let client = Client::connect(&tcp_config(&cl)).await.unwrap();
    // 3 MiB + a tail: inline, pooled and mapped (> 64 KiB) reads, vectored writes, over both servers.
    let len = (3 << 20) + 12_345;
    let data = pattern(11, 0, len);
    let f = client.create_path("/tls", 0o644, true, false).await.unwrap();
    f.write_at(0, Bytes::from(data.clone())).await.unwrap();
    f.write_at(100, Bytes::from_static(b"small")).await.unwrap();
    f.close().await.unwrap();
    let mut want = data;
    want[100..105].copy_from_slice(b"small");
    let f = client.open("/tls", OpenMode::Read).await.unwrap();
    let got = f.read_at(0, BytesMut::zeroed(len)).await.unwrap();
    assert!(got[..] == want[..], "bytes differ after a round trip under TLS");
    let small = f.read_at(98, BytesMut::zeroed(9)).await.unwrap();
    assert_eq!(&small[..], &want[98..107]);
    let fabrics = client.fabrics().await;
    assert!(!fabrics.is_empty() && fabrics.iter().all(|(_, name)| *name == "tls"), "{fabrics:?}");
}

#[tokio::test]
async fn a_plaintext_client_and_a_tls_server_refuse_each_other_and_say_why() {
    let cl = start_tls("tls-plain-client", 1, true).await;
    let plain = ClusterConfig { tls: false, tls_ca_file: None, ..tcp_config(&cl) };
    let err = Client::connect(&plain).await.err().expect("a plaintext client is refused").to_string();
    assert!(err.contains("speaks TLS"), "the client says the server speaks TLS: {err}");
    eventually("the MDS logs the refused plaintext peer", || {
        let log = cl.log("meta");
        log.contains("TLS handshake with") && log.contains("plaintext client")
    })
    .await;
}

#[tokio::test]
async fn a_tls_client_and_a_plaintext_server_refuse_each_other_and_say_why() {
    let cl = start_tls("tls-plain-server", 1, false).await;
    let ca = other_ca(cl.dir());
    let tls = ClusterConfig { tls: true, tls_ca_file: Some(ca.join(CA_CERT_FILE)), ..tcp_config(&cl) };
    let err = Client::connect(&tls).await.err().expect("a plaintext server is refused").to_string();
    assert!(err.contains("TLS handshake with") && err.contains("is tls on at the server"), "{err}");
    eventually("the MDS logs the TLS peer", || cl.log("meta").contains("the peer speaks TLS")).await;
}

#[tokio::test]
async fn a_client_refuses_a_server_whose_certificate_does_not_chain_to_its_ca() {
    let cl = start_tls("tls-other-ca", 1, true).await;
    let ca = other_ca(cl.dir());
    let wrong = ClusterConfig { tls_ca_file: Some(ca.join(CA_CERT_FILE)), ..tcp_config(&cl) };
    let err = Client::connect(&wrong).await.err().expect("a server from another CA is refused").to_string();
    assert!(err.contains("invalid peer certificate") && err.contains("UnknownIssuer"), "{err}");
    eventually("the MDS logs the client's refusal", || cl.log("meta").contains("TLS handshake with")).await;
    // The cluster's own CA still works.
    Client::connect(&tcp_config(&cl)).await.unwrap().close().await;
}

/// A server presenting `cert_dir`'s certificate on loopback; answers one connection's `ping` with `pong`.
async fn serve_once(ca: &Path, cert_dir: &Path) -> String {
    let files = TlsFiles {
        ca_file: Some(ca.join(CA_CERT_FILE)),
        cert_file: Some(cert_dir.join(SERVER_CERT_FILE)),
        key_file: Some(cert_dir.join(SERVER_KEY_FILE)),
    };
    let server = TcpFabric::default().with_tls(Some(TlsConfig::server_from_files(&files).unwrap()));
    let mut l = server.listen("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok(mut c) = l.accept().await {
            let mut b = [0u8; 4];
            if c.reader.read_exact(&mut b).await.is_ok() && &b == b"ping" {
                let _ = c.writer.write_all(b"pong").await;
                let _ = c.writer.flush().await;
            }
        }
    });
    addr
}

fn client_fabric(ca: &Path) -> TcpFabric {
    let files = TlsFiles { ca_file: Some(ca.join(CA_CERT_FILE)), ..TlsFiles::default() };
    TcpFabric::default().with_tls(Some(TlsConfig::from_files(&files).unwrap()))
}

#[tokio::test]
async fn the_cli_makes_a_ca_and_certificates_and_a_certificate_for_another_name_is_refused() {
    let dir = test_dir("tls-cli");
    let ca = dir.join("ca");
    let out = weft(&["tls", "ca", "--out", ca.to_str().unwrap()]);
    assert!(out.contains("ca.pem"), "{out}");
    let here = dir.join("here");
    weft(&[
        "tls",
        "cert",
        "--ca",
        ca.to_str().unwrap(),
        "--name",
        "localhost,127.0.0.1",
        "--out",
        here.to_str().unwrap(),
    ]);
    let elsewhere = dir.join("elsewhere");
    weft(&[
        "tls",
        "cert",
        "--ca",
        ca.to_str().unwrap(),
        "--name",
        "db1.example,10.9.9.9",
        "--out",
        elsewhere.to_str().unwrap(),
    ]);
    for key in [ca.join(CA_KEY_FILE), here.join(SERVER_KEY_FILE), elsewhere.join(SERVER_KEY_FILE)] {
        assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600, "{}", key.display());
    }
    // Never overwrites.
    let again = std::process::Command::new(WEFT).args(["tls", "ca", "--out", ca.to_str().unwrap()]).output().unwrap();
    assert!(!again.status.success());

    // A certificate for this address: the handshake succeeds and bytes flow, by IP and by name.
    let addr = serve_once(&ca, &here).await;
    let port = addr.rsplit_once(':').unwrap().1;
    for dial in [addr.clone(), format!("localhost:{port}")] {
        let mut c = client_fabric(&ca).connect(&dial).await.unwrap_or_else(|e| panic!("{dial}: {e}"));
        c.writer.write_all(b"ping").await.unwrap();
        c.writer.flush().await.unwrap();
        let mut b = [0u8; 4];
        c.reader.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"pong");
    }

    // A certificate of the same CA for other names: refused.
    let addr = serve_once(&ca, &elsewhere).await;
    let err = client_fabric(&ca).connect(&addr).await.err().expect("a certificate for another name is refused");
    let err = err.to_string();
    assert!(err.contains("invalid peer certificate") && err.contains("not valid for name"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
