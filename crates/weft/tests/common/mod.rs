//! Shared by the integration tests: a real local cluster of `weft` processes on loopback with ephemeral ports,
//! in a fresh directory that is removed when the test ends. `WEFT_FABRIC=tcp` makes every client use tcp, and
//! `WEFT_TLS=1` starts every cluster with `tcp` under TLS (`LaunchOptions::tls`), so one suite runs both ways.

#![allow(dead_code)]

pub mod bytes_read;
pub mod members;
pub mod memcached;
pub mod mount;
pub mod nfs41;
/// `weft top`'s scraper (the binary's own file, as the tests' copy).
#[path = "../../src/scrape.rs"]
pub mod scrape;
pub mod storm;
pub mod tmpfs;
pub mod wire;

use std::path::{Path, PathBuf};

use weft_client::{Client, ClientTuning, ClusterConfig};
use weft_launch::{LaunchOptions, LocalCluster};

#[allow(unused_imports)]
pub use bytes_read::{read_range, same};

pub const WEFT: &str = env!("CARGO_BIN_EXE_weft");

pub struct TestCluster {
    pub cluster: LocalCluster,
    pub dir: PathBuf,
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl std::ops::Deref for TestCluster {
    type Target = LocalCluster;
    fn deref(&self) -> &LocalCluster {
        &self.cluster
    }
}

impl std::ops::DerefMut for TestCluster {
    fn deref_mut(&mut self) -> &mut LocalCluster {
        &mut self.cluster
    }
}

pub fn test_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weft-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub async fn start(name: &str, servers: u32) -> TestCluster {
    start_with(name, servers, |_| {}).await
}

pub async fn start_with(name: &str, servers: u32, f: impl FnOnce(&mut LaunchOptions)) -> TestCluster {
    let dir = test_dir(name);
    let mut opts = LaunchOptions::new(WEFT, &dir, servers);
    opts.log_filter = "info".into();
    f(&mut opts);
    let cluster = LocalCluster::start(opts).await.unwrap_or_else(|e| panic!("starting the cluster: {e}"));
    TestCluster { cluster, dir }
}

impl TestCluster {
    pub async fn client(&self) -> Client {
        self.cluster.client().await.unwrap()
    }

    /// A client that gives up quickly (for tests that stop servers on purpose).
    pub async fn impatient_client(&self) -> Client {
        let cfg = ClusterConfig {
            client: ClientTuning {
                attempts_max: 1,
                call_timeout_ms: 5_000,
                mds_failover_timeout_ms: 0,
                ..ClientTuning::default()
            },
            ..self.cluster_config()
        };
        Client::connect(&cfg).await.unwrap()
    }

    pub fn log(&self, role: &str) -> String {
        std::fs::read_to_string(self.dir().join(format!("logs/{role}.log"))).unwrap_or_default()
    }
}

/// Copies the directories and regular files under `from` to `to` (what a data server's root holds on its disk).
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let kind = e.file_type().unwrap();
        if kind.is_dir() {
            copy_tree(&e.path(), &to.join(e.file_name()));
        } else if kind.is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// Data server `i`'s machine loses power: the process is killed, its root goes back to `durable` (a copy taken
/// when only synced writes were on it: what its disk still holds), and it comes back on another boot
/// (`WEFT_FAULT=boot-id:`), as after a reboot.
pub async fn power_loss(c: &mut TestCluster, i: u32, durable: &Path, boot: &str) {
    c.kill_data_server(i).await;
    let root = c.data_root(i);
    std::fs::remove_dir_all(&root).unwrap();
    copy_tree(durable, &root);
    c.set_env(vec![("WEFT_FAULT".into(), format!("boot-id:{boot}"))]);
    c.restart_data_server(i).await.unwrap();
    c.set_env(vec![]);
}

/// Where data server `root` keeps the object of inode `ino` (the on-disk format of weft-data).
pub fn object_path(root: &Path, ino: u64) -> PathBuf {
    root.join("objects").join(format!("{:02x}", ino & 0xff)).join(format!("{ino:016x}"))
}

/// Deterministic pseudo-random bytes (xorshift64*), different for every seed and offset.
pub fn pattern(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut word_index = offset / 8;
    let mut skip = (offset % 8) as usize;
    while out.len() < len {
        let mut x = seed ^ word_index.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let w = x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
        for &b in &w[skip..] {
            if out.len() == len {
                break;
            }
            out.push(b);
        }
        skip = 0;
        word_index += 1;
    }
    out
}

/// Runs the `weft` binary with `WEFT_CLUSTER` set; returns (success, stdout, stderr).
pub fn weft(cluster: &LocalCluster, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(WEFT)
        .args(args)
        .env("WEFT_CLUSTER", cluster.cluster_file())
        .output()
        .expect("running weft");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The Linux value of a POSIX ACL: version 2, then (tag, perm, id) entries.
pub fn acl_value(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}
