//! Random-operation exercisers (issue 30): every layout (plain, mirror 2, ec 4+2 at two stripe units, ec 2+1)
//! through every access path (the FUSE mount with its default options, `--direct-io` and `--writeback-cache`, and
//! the native client) runs seeded fsx-style op sequences (`fsx/mod.rs`), each read compared with a model; every
//! redundant layout runs them again with a data server whose disk fills (native client and mount).
//! A failure prints the seed and the command that replays it; `make soak` runs the same tests with many more ops
//! (`WEFT_FSX_OPS`) and seeds (`WEFT_FSX_SEEDS`); `WEFT_FSX_LAYOUTS=ec42-64k,plain` runs only those layouts.

use crate::common;
use crate::fsx;

use common::mount::Mount;
use common::*;
use fsx::{NativeFile, PathFile, Plan, run};
use weft_client::Client;
use weft_proto::{DataRedundancy, ROOT_INO};

/// The directories every cluster gets: name, stripe unit, stripe count (0: all servers), redundancy.
const LAYOUTS: [(&str, u32, u32, DataRedundancy); 5] = [
    ("plain", 64 << 10, 0, DataRedundancy::Plain),
    ("mirror2", 64 << 10, 0, DataRedundancy::Mirror { n: 2 }),
    ("ec42-64k", 64 << 10, 0, DataRedundancy::Ec { k: 4, m: 2 }),
    ("ec42-16k", 16 << 10, 0, DataRedundancy::Ec { k: 4, m: 2 }),
    ("ec21-32k", 32 << 10, 0, DataRedundancy::Ec { k: 2, m: 1 }),
];

/// Seeds each layout runs in `make test`; `WEFT_FSX_SEED` replays one, `WEFT_FSX_SEEDS=N` runs seeds 1..=N.
fn seeds() -> Vec<u64> {
    if let Ok(n) = std::env::var("WEFT_FSX_SEEDS") {
        return (1..=n.parse::<u64>().expect("WEFT_FSX_SEEDS is a number")).collect();
    }
    Plan::seeds(&[7, 1, 2])
}

/// The layouts a test runs: all, or those `WEFT_FSX_LAYOUTS` names (comma-separated directory names).
fn layouts() -> Vec<(&'static str, u32, u32, DataRedundancy)> {
    let only = std::env::var("WEFT_FSX_LAYOUTS").ok();
    LAYOUTS.into_iter().filter(|(dir, ..)| only.as_deref().is_none_or(|o| o.split(',').any(|n| n == *dir))).collect()
}

fn plan(seed: u64, unit: u32, mmap: bool) -> Plan {
    // Three and a half rows of the widest ec layout, so truncates and writes cross row and unit edges.
    let file_bytes_max = u64::from(unit) * 4 * 3 + u64::from(unit) * 2;
    Plan { seed, ops: Plan::ops(300), file_bytes_max, op_bytes_max: (u64::from(unit) * 2).min(96 << 10), mmap }
}

async fn cluster(name: &str) -> (TestCluster, Client) {
    let cl = start(name, 6).await;
    let client = cl.client().await;
    for (dir, unit, count, redundancy) in LAYOUTS {
        let d = client.mkdir(ROOT_INO, dir, 0o777).await.unwrap();
        client.set_layout_with(d.ino, unit, count, redundancy).await.unwrap();
    }
    (cl, client)
}

/// Every layout and seed through a FUSE mount started with `options`.
async fn through_the_mount(name: &str, options: &[&str], mmap: bool) {
    let (cl, _client) = cluster(name).await;
    let m = Mount::start(&cl, &test_dir(&format!("{name}-mnt")), options);
    for (dir, unit, _, _) in layouts() {
        for seed in seeds() {
            let mut f = PathFile::create(m.path(&format!("{dir}/f{seed}")));
            run(&format!("{name} {dir}"), plan(seed, unit, mmap), &mut f).await;
        }
    }
    drop(m);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsx_on_the_mount() {
    through_the_mount("fsx-mount", &[], true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsx_on_the_mount_with_direct_io() {
    // A direct-io mount maps files only through the kernel's own paths, which FUSE refuses for shared mappings
    // on older kernels: no mmap ops here.
    through_the_mount("fsx-direct", &["--direct-io"], false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsx_on_the_mount_with_writeback_cache() {
    through_the_mount("fsx-writeback", &["--writeback-cache"], true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsx_through_the_native_client() {
    let (_cl, client) = cluster("fsx-native").await;
    for (dir, unit, _, _) in layouts() {
        for seed in seeds() {
            let mut f = NativeFile::create(client.clone(), &format!("/{dir}/f{seed}")).await;
            run(&format!("native {dir}"), plan(seed, unit, false), &mut f).await;
        }
    }
}

/// What the mount's exerciser found once on `mirror 2` (seed 1, op 289, under load): the asynchronous RELEASE of
/// a closed descriptor commits the size it read before a truncate through the other descriptor, and the MDS keeps
/// the largest committed size, so the cut length came back (and the kernel kept the cut bytes' pages). Here the
/// commit reads the size, then waits for its `Fsync` (held 1.5 s by the data servers: `delay-fsync`) while the
/// truncate runs: the truncate waits for the commit, and the size is the truncate's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_that_read_the_size_before_a_truncate_does_not_undo_it() {
    let mut cl = start("commit-truncate", 2).await;
    cl.set_env(vec![("WEFT_FAULT".into(), "delay-fsync:1500:1".into())]);
    for i in 0..2 {
        cl.restart_data_server(i).await.unwrap();
    }
    cl.set_env(Vec::new());
    let c = cl.client().await;
    let d = c.mkdir(ROOT_INO, "m", 0o755).await.unwrap();
    c.set_layout_with(d.ino, 64 << 10, 0, DataRedundancy::Mirror { n: 2 }).await.unwrap();
    let f = c.create_path("/m/f", 0o644, true, false).await.unwrap();
    let (long, short) = (400u64 << 10, 100u64 << 10);
    f.write_at(0, bytes::Bytes::from(vec![0x11; long as usize])).await.unwrap();
    // `join!` polls the commit first: it reads the size (400 KiB) and sends its `Fsync`s before the truncate starts.
    let (committed, truncated) = tokio::join!(f.commit(), f.truncate(short));
    committed.unwrap();
    truncated.unwrap();
    assert!(cl.log("data0").contains("delay the next fsyncs"), "the fault was armed");
    let other = cl.client().await;
    assert_eq!(other.resolve("/m/f").await.unwrap().size, short, "the truncate's size, not the commit's");
    f.close().await.unwrap();
    assert_eq!(other.resolve("/m/f").await.unwrap().size, short, "and after the close");
}

/// Issue 30 item 6: a data server whose disk fills mid-run. Every redundant layout tolerates a lost server, so a
/// full one is one: its chunks that do not fit are recorded stale (a degraded write) and read from the others,
/// and no write, truncate or read the exerciser makes fails or returns a wrong byte. Data server 2 keeps its
/// objects on a 384 KiB tmpfs, which the first files fill. (It found that a full tmpfs killed its data server:
/// a mapped read of a hole there faults in a page, and with none left the process gets SIGBUS. Objects on a
/// memory-backed file system are now read with copies, never mapped.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsx_with_a_full_data_server_through_the_native_client() {
    let (cl, client, _fs) = cluster_with_a_small_disk("fsx-full").await;
    for (dir, unit, _, _) in redundant_layouts() {
        for seed in seeds() {
            let mut f = NativeFile::create(client.clone(), &format!("/{dir}/f{seed}")).await;
            run(&format!("full-server {dir}"), plan(seed, unit, false), &mut f).await;
        }
    }
    // The disk is full: a file too big for it is written degraded, its copy on server 2 stale, read back whole.
    let big = vec![0x5a; 1 << 20];
    let f = client.create_path("/mirror2/big", 0o644, true, false).await.unwrap();
    f.write_at(0, bytes::Bytes::from(big.clone())).await.unwrap();
    f.close().await.unwrap();
    let ino = client.resolve("/mirror2/big").await.unwrap().ino;
    assert!(!client.list_stale(Some(ino), None, 16).await.unwrap().entries.is_empty(), "server 2's copy is stale");
    let f = client.open("/mirror2/big", weft_client::OpenMode::Read).await.unwrap();
    assert!(f.read_at(0, bytes::BytesMut::zeroed(big.len())).await.unwrap()[..] == big[..]);
    server_2_is_alive(&cl);
}

/// The exercisers' cluster, with data server 2's objects on a 384 KiB tmpfs (unmounted when the handle drops).
async fn cluster_with_a_small_disk(name: &str) -> (TestCluster, Client, common::tmpfs::Tmpfs) {
    let (mut cl, client) = cluster(name).await;
    cl.stop_data_server(2).await;
    let fs = common::tmpfs::Tmpfs::mount(&cl.data_root(2), "384k");
    cl.restart_data_server(2).await.unwrap();
    (cl, client, fs)
}

fn redundant_layouts() -> impl Iterator<Item = (&'static str, u32, u32, DataRedundancy)> {
    layouts().into_iter().filter(|(_, _, _, r)| *r != DataRedundancy::Plain)
}

/// Data server 2 still runs and listens: a dead server's degraded writes would pass every other check. (A killed
/// child keeps its `/proc` entry until reaped: the state letter tells a zombie.)
fn server_2_is_alive(cl: &TestCluster) {
    let pid = cl.data_pid(2).expect("data server 2 was started");
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let running = state.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z'));
    let listening = std::os::unix::net::UnixStream::connect(cl.data_root(2).join("weft-data.sock")).is_ok();
    assert!(running && listening, "data server 2 is alive after its disk filled: {state}");
}

/// The full data server of the test above, through the FUSE mount (its default options, mmap ops included).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsx_with_a_full_data_server_on_the_mount() {
    full_server_through_the_mount("fsx-full-mnt", &[], true).await;
}

/// And through the mount's other data paths: every write straight to the servers, and the kernel's write-back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsx_with_a_full_data_server_on_the_mount_with_direct_io_and_with_writeback_cache() {
    full_server_through_the_mount("fsx-full-direct", &["--direct-io"], false).await;
    full_server_through_the_mount("fsx-full-writeback", &["--writeback-cache"], true).await;
}

async fn full_server_through_the_mount(name: &str, options: &[&str], mmap: bool) {
    let (cl, _client, _fs) = cluster_with_a_small_disk(name).await;
    let m = Mount::start(&cl, &test_dir(&format!("{name}-mnt")), options);
    for (dir, unit, _, _) in redundant_layouts() {
        for seed in seeds() {
            let mut f = PathFile::create(m.path(&format!("{dir}/f{seed}")));
            run(&format!("full-server mount {options:?} {dir}"), plan(seed, unit, mmap), &mut f).await;
        }
    }
    drop(m);
    server_2_is_alive(&cl);
}
