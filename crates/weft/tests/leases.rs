//! Metadata leases against adversaries (issue 33, docs/format.md §31): two FUSE mounts of one cluster, each holding
//! leases, and a native client take turns at random changes (create, append, truncate, chmod, utimes, rename,
//! link, unlink; the native client makes all but appends and truncates), and after every change both mounts are
//! checked against a model: what a stat, a listing and a read return; so is the native client, which holds leases
//! too and answers its lookups from its own cache (`weft_client::meta_cache`). A lease promises more
//! than the kernel's timeouts do: a change is recalled from the other mount before its call returns, so that mount's
//! next look sees it, with no timeout to run out. Seeded: a failure prints its seed, the steps before it and the
//! command that replays it (`WEFT_LEASE_SEED=N`; `WEFT_LEASE_SEEDS=N` runs seeds 1..=N, `WEFT_LEASE_OPS` the steps).
//!
//! It can fail: `WEFT_LEASE_OFF=1` mounts without leases (`--lease-timeout-ms 0`, the kernel's 1 s timeouts
//! alone), and the first seed fails within a few steps on a stale stat of the other mount.
//!
//! The second test stops, then kills, a mount while a change waits for its acknowledgement: the change completes
//! once that mount's lease ran out, and the service revokes it.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use common::mount::*;
use common::scrape::{parse, scrape, sum};
use common::*;

/// The directories the exerciser works in (under `x/`), and the names it uses in each.
const DIRS: [&str; 3] = ["x", "x/d1", "x/d2"];
const NAMES: [&str; 4] = ["p", "q", "r", "s"];
const MODES: [u32; 5] = [0o600, 0o640, 0o644, 0o755, 0o700];
/// The service's lease: long, so that no acknowledgement on a loaded machine misses it (a revoked mount may serve
/// what it held until it learns, which is the protocol's bound, not what this test checks).
const LEASE_TOML: &str = "lease_ms = 60000\n";

/// SplitMix64: every choice of a run comes from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
}

/// A file of the model: its bytes, mode, the inode number the mounts gave it, and its mtime when a utimes set it
/// last (a write stamps the present, which the model does not know).
#[derive(Clone)]
struct File {
    data: Vec<u8>,
    mode: u32,
    ino: u64,
    mtime: Option<i64>,
}

/// What the two mounts must show: names to file ids, and the files.
#[derive(Default)]
struct Model {
    names: BTreeMap<String, usize>,
    files: BTreeMap<usize, File>,
    next_id: usize,
}

impl Model {
    fn nlink(&self, id: usize) -> u64 {
        self.names.values().filter(|&&i| i == id).count() as u64
    }

    fn listing(&self, dir: &str) -> BTreeSet<String> {
        let children = DIRS.iter().filter_map(|d| d.strip_prefix(&format!("{dir}/"))).filter(|c| !c.contains('/'));
        let files = self.names.keys().filter_map(|p| p.strip_prefix(&format!("{dir}/"))).filter(|c| !c.contains('/'));
        children.chain(files).map(str::to_string).collect()
    }

    fn forget(&mut self, path: &str) {
        if let Some(id) = self.names.remove(path)
            && self.nlink(id) == 0
        {
            self.files.remove(&id);
        }
    }
}

/// One step's change, as drawn.
#[derive(Debug, Clone)]
enum Change {
    Create { path: String, len: usize },
    Append { path: String, len: usize },
    Truncate { path: String, len: usize },
    Chmod { path: String, mode: u32 },
    Utimes { path: String, mtime: i64 },
    Rename { from: String, to: String },
    Link { from: String, to: String },
    Unlink { path: String },
}

impl Change {
    /// A change drawn from the model's state: mostly on a name that exists (a create, on one that does not), one
    /// time in eight on any name, so the errors are drawn too.
    fn draw(rng: &mut Rng, step: u64, m: &Model) -> Change {
        let all: Vec<String> = DIRS.iter().flat_map(|d| NAMES.iter().map(move |n| format!("{d}/{n}"))).collect();
        let (present, absent): (Vec<String>, Vec<String>) = all.iter().cloned().partition(|p| m.names.contains_key(p));
        let from = |rng: &mut Rng, want: &[String]| {
            if want.is_empty() || rng.below(8) == 0 { rng.pick(&all).clone() } else { rng.pick(want).clone() }
        };
        let len = rng.below(3000);
        match rng.below(16) {
            0..=3 => Change::Create { path: from(rng, &absent), len },
            4 | 5 => Change::Append { path: from(rng, &present), len: len / 4 + 1 },
            6 | 7 => Change::Truncate { path: from(rng, &present), len: rng.below(4000) },
            8 => Change::Chmod { path: from(rng, &present), mode: *rng.pick(&MODES) },
            9 => Change::Utimes { path: from(rng, &present), mtime: 1_000_000 + step as i64 },
            10 | 11 => Change::Rename { from: from(rng, &present), to: rng.pick(&all).clone() },
            12 => Change::Link { from: from(rng, &present), to: from(rng, &absent) },
            _ => Change::Unlink { path: from(rng, &present) },
        }
    }

    /// The paths whose look may change.
    fn paths(&self) -> Vec<&str> {
        match self {
            Change::Rename { from, to } | Change::Link { from, to } => vec![from, to],
            Change::Create { path, .. }
            | Change::Append { path, .. }
            | Change::Truncate { path, .. }
            | Change::Chmod { path, .. }
            | Change::Utimes { path, .. }
            | Change::Unlink { path } => vec![path],
        }
    }
}

fn errno(r: std::io::Result<impl Sized>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.raw_os_error().expect("an OS error"),
    }
}

/// Bytes of step `step`'s write.
fn bytes(step: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (step as usize * 31 + i * 7) as u8).collect()
}

/// Makes change `c` (step `step`) through the mount at `root`; the errno it got.
fn fs_change(root: &Path, c: &Change, step: u64) -> i32 {
    let at = |p: &str| root.join(p);
    match c {
        Change::Create { path, len } => errno((|| {
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(at(path))?;
            f.write_all(&bytes(step, *len))
        })()),
        Change::Append { path, len } => errno(
            std::fs::OpenOptions::new().append(true).open(at(path)).and_then(|mut f| f.write_all(&bytes(step, *len))),
        ),
        Change::Truncate { path, len } => {
            errno(std::fs::OpenOptions::new().write(true).open(at(path)).and_then(|f| f.set_len(*len as u64)))
        }
        Change::Chmod { path, mode } => {
            errno(std::fs::set_permissions(at(path), std::fs::Permissions::from_mode(*mode)))
        }
        Change::Utimes { path, mtime } => {
            let t = SystemTime::UNIX_EPOCH + Duration::from_secs(*mtime as u64);
            let times = std::fs::FileTimes::new().set_modified(t).set_accessed(t);
            errno(std::fs::OpenOptions::new().write(true).open(at(path)).and_then(|f| f.set_times(times)))
        }
        Change::Rename { from, to } => errno(std::fs::rename(at(from), at(to))),
        Change::Link { from, to } => errno(std::fs::hard_link(at(from), at(to))),
        Change::Unlink { path } => errno(std::fs::remove_file(at(path))),
    }
}

/// The third actor: the native client, which has no kernel of its own and goes by inode and name.
struct Native {
    rt: tokio::runtime::Handle,
    client: weft_client::Client,
    /// The inode of each of [`DIRS`].
    dirs: BTreeMap<&'static str, u64>,
}

impl Native {
    fn split<'p>(&self, path: &'p str) -> (u64, &'p str) {
        let (dir, name) = path.rsplit_once('/').expect("a path in a directory");
        (self.dirs[dir], name)
    }

    /// Makes change `c` (step `step`) through the native client: the errno it got, or `None` for a change it
    /// does not make (appends and truncates: the mounts make those).
    fn change(&self, c: &Change, step: u64) -> Option<i32> {
        use weft_proto::{SetAttrs, TimeSet};
        let c2 = &self.client;
        let ino = |path: &str| {
            let (dir, name) = self.split(path);
            let name = name.to_string();
            async move { c2.lookup(dir, &name).await.map(|a| a.ino) }
        };
        if matches!(c, Change::Append { .. } | Change::Truncate { .. }) {
            return None;
        }
        let r = self.rt.block_on(async {
            match c {
                Change::Create { path, len } => {
                    let (dir, name) = self.split(path);
                    let f = c2.create(dir, name, 0o644, true).await?;
                    let f = c2.open_ino(f.ino, weft_client::OpenMode::Write).await?;
                    f.write_at(0, bytes::Bytes::from(bytes(step, *len))).await?;
                    f.close().await
                }
                Change::Chmod { path, mode } => {
                    let set = SetAttrs { mode: Some(*mode), ..Default::default() };
                    c2.setattr(ino(path).await?, set).await.map(drop)
                }
                Change::Utimes { path, mtime } => {
                    let t = Some(TimeSet::AtNs(mtime * 1_000_000_000));
                    c2.setattr(ino(path).await?, SetAttrs { atime: t, mtime: t, ..Default::default() }).await.map(drop)
                }
                Change::Rename { from, to } => {
                    let ((sd, sn), (dd, dn)) = (self.split(from), self.split(to));
                    c2.rename(sd, sn, dd, dn, 0).await
                }
                Change::Link { from, to } => {
                    let (dd, dn) = self.split(to);
                    c2.link(ino(from).await?, dd, dn).await.map(drop)
                }
                Change::Unlink { path } => {
                    let (dir, name) = self.split(path);
                    c2.unlink(dir, name).await
                }
                _ => unreachable!("a change of data: {c:?}"),
            }
        });
        Some(match r {
            Ok(()) => 0,
            Err(e) => match e.code() {
                Some(weft_proto::ErrorCode::NotFound) => libc::ENOENT,
                Some(weft_proto::ErrorCode::Exists) => libc::EEXIST,
                _ => panic!("native client: {c:?}: {e}"),
            },
        })
    }
}

impl Native {
    /// What a lookup of `path` through the native client (from its lease cache while it holds leases) disagrees
    /// with in the model, if anything.
    /// Directory `dir`'s attributes as the MDS holds them now (never from a cache), as [`dir_stat`] shows them.
    fn dir_at_mds(&self, dir: &str) -> DirStat {
        let a = self.rt.block_on(self.client.getattr_at_mds(self.dirs[dir])).expect("getattr at the MDS");
        (a.mode & 0o7777, u64::from(a.nlink), a.size, a.mtime_ns, a.ctime_ns)
    }

    fn look(&self, m: &Model, path: &str) -> Option<String> {
        let (dir, name) = self.split(path);
        let got = self.rt.block_on(self.client.lookup(dir, name));
        let Some(&id) = m.names.get(path) else {
            return match got {
                Ok(a) => {
                    Some(format!("native: {path} is ino {} of {} bytes; the model has no such name", a.ino, a.size))
                }
                Err(e) if weft_client::is_not_found(&e) => None,
                Err(e) => Some(format!("native: lookup {path}: {e}")),
            };
        };
        let f = &m.files[&id];
        let a = match got {
            Ok(a) => a,
            Err(e) => return Some(format!("native: lookup {path}: {e}; the model has ino {}", f.ino)),
        };
        let want = (f.ino, f.data.len() as u64, f.mode, m.nlink(id), f.mtime);
        let got = (a.ino, a.size, a.mode & 0o7777, u64::from(a.nlink), f.mtime.map(|_| a.mtime_ns / 1_000_000_000));
        (got != want)
            .then(|| format!("native: lookup {path}: (ino, size, mode, nlink, mtime) {got:?}, the model {want:?}"))
    }
}

/// Applies change `c` (step `step`) to the model; the errno it expects. `ino_of` tells a new file's inode number.
fn model_change(m: &mut Model, c: &Change, step: u64, ino_of: impl Fn(&str) -> u64) -> i32 {
    let found = |m: &Model, p: &str| m.names.get(p).copied();
    let edit = |m: &mut Model, p: &str, f: &mut dyn FnMut(&mut File)| match found(m, p) {
        Some(id) => {
            f(m.files.get_mut(&id).unwrap());
            0
        }
        None => libc::ENOENT,
    };
    match c {
        Change::Create { path, len } => {
            if found(m, path).is_some() {
                return libc::EEXIST;
            }
            let id = m.next_id;
            m.next_id += 1;
            m.files.insert(id, File { data: bytes(step, *len), mode: 0o644, ino: ino_of(path), mtime: None });
            m.names.insert(path.clone(), id);
            0
        }
        Change::Append { path, len } => edit(m, path, &mut |f| {
            f.data.extend_from_slice(&bytes(step, *len));
            f.mtime = None;
        }),
        Change::Truncate { path, len } => edit(m, path, &mut |f| {
            f.data.resize(*len, 0);
            f.mtime = None;
        }),
        Change::Chmod { path, mode } => edit(m, path, &mut |f| f.mode = *mode),
        Change::Utimes { path, mtime } => edit(m, path, &mut |f| f.mtime = Some(*mtime)),
        Change::Rename { .. } | Change::Link { .. } | Change::Unlink { .. } => model_names(m, c),
    }
}

/// [`model_change`] of the changes of names.
fn model_names(m: &mut Model, c: &Change) -> i32 {
    let found = |m: &Model, p: &str| m.names.get(p).copied();
    match c {
        Change::Rename { from, to } => {
            let Some(id) = found(m, from) else { return libc::ENOENT };
            // Two names of one file: rename does nothing (POSIX).
            if found(m, to) != Some(id) {
                m.forget(to);
                m.names.remove(from);
                m.names.insert(to.clone(), id);
            }
            0
        }
        Change::Link { from, to } => {
            let Some(id) = found(m, from) else { return libc::ENOENT };
            if found(m, to).is_some() {
                return libc::EEXIST;
            }
            m.names.insert(to.clone(), id);
            0
        }
        Change::Unlink { path } => {
            if found(m, path).is_none() {
                return libc::ENOENT;
            }
            m.forget(path);
            0
        }
        _ => unreachable!("not a change of names: {c:?}"),
    }
}

/// What a look at `path` through the mount at `root` disagrees with in the model, if anything.
fn look(root: &Path, m: &Model, path: &str, read: bool) -> Option<String> {
    let st = std::fs::metadata(root.join(path));
    let Some(&id) = m.names.get(path) else {
        return st
            .ok()
            .map(|s| format!("{path} exists (ino {}, {} bytes); the model has no such name", s.ino(), s.len()));
    };
    let f = &m.files[&id];
    let s = match st {
        Ok(s) => s,
        Err(e) => return Some(format!("stat {path}: {e}; the model has ino {} of {} bytes", f.ino, f.data.len())),
    };
    let want = (f.ino, f.data.len() as u64, f.mode, m.nlink(id));
    let got = (s.ino(), s.len(), s.mode() & 0o7777, s.nlink());
    if got != want {
        let show = |(ino, size, mode, nlink): (u64, u64, u32, u64)| {
            format!("ino {ino}, {size} bytes, mode {mode:o}, nlink {nlink}")
        };
        return Some(format!("stat {path}: {}; the model: {}", show(got), show(want)));
    }
    if let Some(t) = f.mtime
        && s.mtime() != t
    {
        return Some(format!("stat {path}: mtime {}, the model {t}", s.mtime()));
    }
    if read {
        match std::fs::read(root.join(path)) {
            Ok(b) if b == f.data => {}
            Ok(b) => {
                let at = b.iter().zip(&f.data).position(|(x, y)| x != y).unwrap_or(b.len().min(f.data.len()));
                return Some(format!(
                    "read {path}: {} bytes, the model {}; first difference at {at}",
                    b.len(),
                    f.data.len()
                ));
            }
            Err(e) => return Some(format!("read {path}: {e}")),
        }
    }
    None
}

/// A directory's mode, link count, size, mtime and ctime (ns).
type DirStat = (u32, u64, u64, i64, i64);

/// What a stat of directory `dir` shows through the mount at `root`.
fn dir_stat(root: &Path, dir: &str) -> DirStat {
    let s = std::fs::metadata(root.join(dir)).unwrap();
    let ns = |sec: i64, nsec: i64| sec * 1_000_000_000 + nsec;
    (s.mode() & 0o7777, s.nlink(), s.len(), ns(s.mtime(), s.mtime_nsec()), ns(s.ctime(), s.ctime_nsec()))
}

fn list(root: &Path, dir: &str) -> BTreeSet<String> {
    std::fs::read_dir(root.join(dir)).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
}

/// Makes change `c` through actor `by` (0, 1: the mounts at `roots`; 2: the native client, for the changes it
/// makes) and in the model; returns the actor that made it and (the errno the model expects, the one it got).
fn apply(roots: &[PathBuf; 2], native: &Native, by: usize, m: &mut Model, c: &Change, step: u64) -> (usize, i32, i32) {
    let got = if by == 2 { native.change(c, step) } else { None };
    let (by, got) = match got {
        Some(got) => (2, got),
        None => (by % 2, fs_change(&roots[by % 2], c, step)),
    };
    let want = model_change(m, c, step, |p| std::fs::metadata(roots[0].join(p)).map_or(0, |s| s.ino()));
    (by, want, got)
}

/// One seed: `ops` changes, each through an actor drawn at random (mount A, mount B, the native client), each
/// followed by looks through both mounts.
fn run_seed(roots: &[PathBuf; 2], native: &Native, seed: u64, ops: u64) {
    let mut rng = Rng(seed);
    let mut m = Model::default();
    let mut trail: Vec<String> = Vec::new();
    let mut applied = 0;
    let fail = |trail: &[String], why: String| -> ! {
        let start = trail.len().saturating_sub(12);
        panic!(
            "leases exerciser, seed {seed}: {why}\nlast steps:\n  {}\nreplay: WEFT_LEASE_SEED={seed} cargo test --release \
             --features weft/fault-injection -p weft --test integration leases::",
            trail[start..].join("\n  ")
        )
    };
    for step in 0..ops {
        let c = Change::draw(&mut rng, step, &m);
        let (by, want, got) = apply(roots, native, rng.below(3), &mut m, &c, step);
        trail.push(format!("step {step}: {} {c:?}", ["mount A", "mount B", "the native client"][by]));
        if want != got {
            fail(&trail, format!("errno {got}, the model {want}"));
        }
        applied += u64::from(got == 0);
        // Both mounts, another's first: the change must already be there, with no timeout run out.
        for who in [(by + 1) % 2, by % 2] {
            let r = &roots[who];
            for p in c.paths() {
                let read = rng.below(3) == 0;
                if let Some(why) = look(r, &m, p, read) {
                    fail(&trail, format!("through mount {}: {why}", ["A", "B"][who]));
                }
            }
            let dir = *rng.pick(&DIRS);
            if list(r, dir) != m.listing(dir) {
                fail(&trail, format!("listing {dir}: {:?}, the model {:?}", list(r, dir), m.listing(dir)));
            }
            // A directory's attributes are the MDS's: a mount's own creates answer them from the create's reply
            // (op 147), any other change of its own or anyone else's drops that.
            let (got, want) = (dir_stat(r, dir), native.dir_at_mds(dir));
            if got != want {
                fail(&trail, format!("stat {dir}: (mode, nlink, size, mtime, ctime) {got:?}, the MDS {want:?}"));
            }
        }
        // And the native client, which answers from its own lease cache (its own changes drop what they touched).
        for p in c.paths() {
            if let Some(why) = native.look(&m, p) {
                fail(&trail, why);
            }
        }
    }
    // Not vacuous: most steps drawn change something (a fifth fail on a missing or existing name, by design).
    assert!(applied >= ops / 2, "seed {seed}: only {applied} of {ops} changes applied");
    // Every name, through both, at the end.
    for r in roots {
        for p in m.names.keys() {
            if let Some(why) = look(r, &m, p, true) {
                fail(&trail, format!("at the end: {why}"));
            }
        }
    }
}

fn seeds() -> Vec<u64> {
    if let Some(s) = std::env::var("WEFT_LEASE_SEED").ok().and_then(|s| s.parse().ok()) {
        return vec![s];
    }
    match std::env::var("WEFT_LEASE_SEEDS").ok().and_then(|s| s.parse::<u64>().ok()) {
        Some(n) => (1..=n).collect(),
        None => vec![1, 2, 3],
    }
}

/// A cluster of one data server on the embedded store (services that share PostgreSQL grant no leases), its
/// metrics served, with `meta_toml` in the MDS's config.
async fn leased_cluster(name: &str, meta_toml: &str) -> TestCluster {
    start_with(name, 1, |o| {
        o.postgres = false;
        o.metrics = true;
        o.meta_extra_toml.push_str(meta_toml);
    })
    .await
}

/// A mount of `cl` in `test_dir(name)` that serves its metrics; returns it and where they are.
fn mount_with_metrics(cl: &TestCluster, name: &str) -> (Mount, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let at = format!("127.0.0.1:{port}");
    (Mount::start(cl, &test_dir(name), &["--metrics-listen", &at]), at)
}

/// The sum of the samples of metric `name` that carry `labels`, at the metrics endpoint `at`.
async fn metric(at: &str, name: &str, labels: &[&str]) -> f64 {
    sum(&parse(&scrape(at).await.unwrap()), name, labels)
}

/// Whether the mount whose metrics are at `at` holds leases now.
async fn leasing(at: &str) -> bool {
    metric(at, "weft_fuse_lease_epoch_live", &[]).await == 1.0
}

/// The MDS's gauge `name`.
async fn mds_gauge(cl: &TestCluster, name: &str) -> f64 {
    let meta = cl.metrics_addrs().into_iter().find(|(role, _)| role == "meta").unwrap().1;
    metric(&meta, name, &[]).await
}

#[tokio::test(flavor = "multi_thread")]
async fn two_leased_mounts_agree_with_a_model_after_every_change() {
    let cl = leased_cluster("leases-exerciser", LEASE_TOML).await;
    let off = std::env::var("WEFT_LEASE_OFF").is_ok_and(|v| v == "1");
    let extra: &[&str] = if off { &["--lease-timeout-ms", "0"] } else { &[] };
    let a = Mount::start(&cl, &test_dir("leases-exerciser-a"), extra);
    let b = Mount::start(&cl, &test_dir("leases-exerciser-b"), extra);
    if !off {
        members::wait_for("both lease channels", || async { mds_gauge(&cl, "weft_mds_lease_holders").await == 2.0 })
            .await;
    }
    let ops = std::env::var("WEFT_LEASE_OPS").ok().and_then(|s| s.parse().ok()).unwrap_or(300);
    let client = cl.client().await;
    if !off {
        client.hold_leases();
        members::wait_for("the native client's lease channel", || async {
            mds_gauge(&cl, "weft_mds_lease_holders").await == 3.0
        })
        .await;
    }
    for seed in seeds() {
        let roots = [a.path(&format!("s{seed}")), b.path(&format!("s{seed}"))];
        let mut dirs = BTreeMap::new();
        for d in DIRS {
            std::fs::create_dir_all(roots[0].join(d)).unwrap();
            dirs.insert(d, client.resolve(&format!("/s{seed}/{d}")).await.unwrap().ino);
        }
        let native = Native { rt: tokio::runtime::Handle::current(), client: client.clone(), dirs };
        let r = roots.clone();
        tokio::task::spawn_blocking(move || run_seed(&r, &native, seed, ops)).await.unwrap();
    }
    if !off {
        assert!(mds_gauge(&cl, "weft_mds_lease_recalls").await > 0.0, "the mounts held leases and had them recalled");
        assert_eq!(mds_gauge(&cl, "weft_mds_lease_revocations").await, 0.0, "every recall was acknowledged");
        let (_, hits, _) = client.lease_cache_counts().unwrap();
        assert!(hits > 0, "the native client answered some lookups from its lease cache");
    }
}

/// A mount that stops answering (SIGSTOP), then dies (SIGKILL), while a change made elsewhere waits for it to
/// acknowledge a recall: the change completes once the mount's lease ran out (the service's `lease_ms`, 2 s
/// here), the stopped mount is revoked and comes back with a new epoch, and the dead one is dropped.
#[tokio::test(flavor = "multi_thread")]
async fn a_change_waits_for_a_stopped_or_killed_mount_only_until_its_lease_ends() {
    let cl = leased_cluster("leases-stopped", "lease_ms = 2000\n").await;
    let a = Mount::start(&cl, &test_dir("leases-stopped-a"), &[]);
    let (b, b_metrics) = mount_with_metrics(&cl, "leases-stopped-b");
    members::wait_for("both lease channels", || async { mds_gauge(&cl, "weft_mds_lease_holders").await == 2.0 }).await;
    members::wait_for("B's lease channel", || leasing(&b_metrics)).await;
    std::fs::write(a.path("f"), b"x").unwrap();
    std::fs::write(a.path("g"), b"y").unwrap();
    // B takes a lease on f.
    assert_eq!(std::fs::metadata(b.path("f")).unwrap().len(), 1);
    let pid = b.child.id().to_string();
    let signal = |sig: &str| assert!(std::process::Command::new("kill").args([sig, &pid]).status().unwrap().success());
    let chmod = |p: PathBuf, mode: u32| {
        tokio::task::spawn_blocking(move || std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)))
    };
    signal("-STOP");
    chmod(a.path("f"), 0o600).await.unwrap().expect("a chmod while the other mount is stopped");
    assert!(mds_gauge(&cl, "weft_mds_lease_revocations").await >= 1.0, "the stopped mount was revoked");
    signal("-CONT");
    // B comes back, learns it was revoked (dropping what it held), and takes leases anew: on g, now.
    let f = b.path("f");
    members::wait_for("the chmod through B", || {
        let f = f.clone();
        async move {
            tokio::task::spawn_blocking(move || std::fs::metadata(f).unwrap().mode() & 0o7777).await.unwrap() == 0o600
        }
    })
    .await;
    members::wait_for("B's new epoch", || leasing(&b_metrics)).await;
    assert_eq!(std::fs::metadata(b.path("g")).unwrap().len(), 1);
    signal("-KILL");
    chmod(a.path("g"), 0o600).await.unwrap().expect("a chmod while the other mount is dead");
    assert_eq!(std::fs::metadata(a.path("g")).unwrap().mode() & 0o7777, 0o600);
    members::wait_for("the dead mount dropped", || async { mds_gauge(&cl, "weft_mds_lease_holders").await == 1.0 })
        .await;
    let _ = std::process::Command::new("fusermount3").arg("-uz").arg(&b.dir).status();
}

/// A leased directory's listing (`FOPEN_CACHE_DIR`): B's kernel lists it again without asking the mount for
/// entries (nor B the MDS for the directory's attributes at each open), until a change through A recalls the
/// directory's attributes, which drops the listing: a create, an unlink, and a create followed by a utimes that
/// sets the mtime back (so the kernel's own mtime check cannot tell).
#[tokio::test(flavor = "multi_thread")]
async fn a_leased_listing_is_kept_by_the_kernel_until_a_change_elsewhere_drops_it() {
    let cl = leased_cluster("leases-listing", LEASE_TOML).await;
    let meta = cl.metrics_addrs().into_iter().find(|(role, _)| role == "meta").unwrap().1;
    let mds_getattrs = || metric(&meta, "weft_rpc_server_requests_total", &["op=\"GetAttr\""]);
    let a = Mount::start(&cl, &test_dir("leases-listing-a"), &[]);
    let (b, at) = mount_with_metrics(&cl, "leases-listing-b");
    members::wait_for("B's lease channel", || leasing(&at)).await;
    let listed = || async {
        let (plain, plus) = (r#"op="readdir""#, r#"op="readdirplus""#);
        metric(&at, "weft_fuse_requests_total", &[plain]).await + metric(&at, "weft_fuse_requests_total", &[plus]).await
    };
    std::fs::create_dir(a.path("d")).unwrap();
    for i in 0..50 {
        std::fs::write(a.path(&format!("d/f{i}")), b"x").unwrap();
    }
    let names = |p: PathBuf| {
        let mut v: Vec<String> =
            std::fs::read_dir(p).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    };
    let mut want: Vec<String> = (0..50).map(|i| format!("f{i}")).collect();
    want.sort();
    assert_eq!(names(b.path("d")), want);
    // Once more first: the kernel marks the atime stale after a listing it read from the mount, and glibc's
    // opendir(3) fstat()s, which then asks for the attributes once.
    assert_eq!(names(b.path("d")), want);
    let (before, asked) = (listed().await, mds_getattrs().await);
    for _ in 0..3 {
        assert_eq!(names(b.path("d")), want);
    }
    assert_eq!(listed().await, before, "B's kernel listed the leased directory three times from its cache");
    assert_eq!(mds_getattrs().await, asked, "and B opened it three times without asking the MDS");
    std::fs::write(a.path("d/new"), b"y").unwrap();
    want.push("new".into());
    want.sort();
    assert_eq!(names(b.path("d")), want, "a create through A");
    std::fs::remove_file(a.path("d/f7")).unwrap();
    want.retain(|n| n != "f7");
    assert_eq!(names(b.path("d")), want, "an unlink through A");
    let mtime = std::fs::metadata(a.path("d")).unwrap().modified().unwrap();
    std::fs::write(a.path("d/late"), b"z").unwrap();
    std::fs::File::open(a.path("d")).unwrap().set_modified(mtime).unwrap();
    want.push("late".into());
    want.sort();
    assert_eq!(names(b.path("d")), want, "a create through A, its mtime set back");
    assert!(listed().await > before, "the changes made B's kernel list again");
}

/// A mount's own creates answer the kernel's `GETATTR` of their directory from the create's reply (op 147,
/// docs/format.md §31) instead of asking the MDS, and what they answer is what the MDS holds: a stat of the
/// directory through the mount equals the MDS's after every create, and after the mount's own other changes
/// (mkdir, chmod, unlink, rename) and another client's create, which each drop what the creates left.
#[tokio::test(flavor = "multi_thread")]
async fn a_directorys_attributes_after_the_mounts_own_creates_need_no_round_trip_and_are_the_mdss() {
    let cl = leased_cluster("leases-dir-after-create", LEASE_TOML).await;
    let meta = cl.metrics_addrs().into_iter().find(|(role, _)| role == "meta").unwrap().1;
    let mds_getattrs = || metric(&meta, "weft_rpc_server_requests_total", &["op=\"GetAttr\""]);
    let (a, at) = mount_with_metrics(&cl, "leases-dir-after-create-a");
    members::wait_for("the mount's lease channel", || leasing(&at)).await;
    let native = cl.client().await;
    std::fs::create_dir(a.path("d")).unwrap();
    let d = std::fs::metadata(a.path("d")).unwrap().ino();
    let at_mds = || async {
        let x = native.getattr_at_mds(d).await.unwrap();
        (x.mode & 0o7777, u64::from(x.nlink), x.size, x.mtime_ns, x.ctime_ns)
    };
    let root = a.path("");
    const CREATES: usize = 20;
    let asked = mds_getattrs().await;
    for i in 0..CREATES {
        std::fs::OpenOptions::new().write(true).create_new(true).open(a.path(&format!("d/f{i}"))).unwrap();
        assert_eq!(dir_stat(&root, "d"), at_mds().await, "after create {i}");
    }
    // Each create made the kernel ask for the directory's attributes again (the stat above, and its own path
    // walk to the next create); without op 147 each is a GetAttr at the MDS. The comparisons' own calls aside:
    let asked = mds_getattrs().await - asked - CREATES as f64;
    assert!(asked < 3.0, "{asked} GetAttr calls at the MDS for {CREATES} creates and stats of their directory");
    std::fs::create_dir(a.path("d/sub")).unwrap();
    assert_eq!(dir_stat(&root, "d"), at_mds().await, "after the mount's own mkdir (nlink 3)");
    std::fs::OpenOptions::new().write(true).create_new(true).open(a.path("d/g")).unwrap();
    std::fs::set_permissions(a.path("d"), std::fs::Permissions::from_mode(0o750)).unwrap();
    assert_eq!(dir_stat(&root, "d"), at_mds().await, "after the mount's own chmod");
    std::fs::OpenOptions::new().write(true).create_new(true).open(a.path("d/h")).unwrap();
    std::fs::remove_file(a.path("d/f3")).unwrap();
    assert_eq!(dir_stat(&root, "d"), at_mds().await, "after the mount's own unlink");
    std::fs::OpenOptions::new().write(true).create_new(true).open(a.path("d/i")).unwrap();
    std::fs::rename(a.path("d/f4"), a.path("d/sub/f4")).unwrap();
    assert_eq!(dir_stat(&root, "d"), at_mds().await, "after the mount's own rename out of it");
    std::fs::OpenOptions::new().write(true).create_new(true).open(a.path("d/j")).unwrap();
    assert_eq!(dir_stat(&root, "d"), at_mds().await, "after one more create");
    native.create(d, "other", 0o644, true).await.unwrap();
    assert_eq!(dir_stat(&root, "d"), at_mds().await, "after another client's create (recalled)");
    assert_eq!(std::fs::read_dir(a.path("d")).unwrap().count(), CREATES - 2 + 6, "sub, g, h, i, j and other");
}

/// A mount answers the kernel's lookup of a missing name in a directory it made itself from the names it knows
/// (docs/format.md §31, "names a mount made"): creates there and lookups of missing names there ask the MDS no
/// `Lookup`. A name another client or mount adds (create, link, rename in) is seen at once, and the mount's own
/// unlink, rename, link, symlink and mkdir each leave every name as it is at the MDS.
#[tokio::test(flavor = "multi_thread")]
async fn names_missing_from_a_directory_the_mount_made_need_no_round_trip_and_others_names_are_seen() {
    let cl = leased_cluster("leases-missing", LEASE_TOML).await;
    let meta = cl.metrics_addrs().into_iter().find(|(role, _)| role == "meta").unwrap().1;
    let mds_lookups = || metric(&meta, "weft_rpc_server_requests_total", &["op=\"Lookup\""]);
    let (a, at) = mount_with_metrics(&cl, "leases-missing-a");
    let (b, bt) = mount_with_metrics(&cl, "leases-missing-b");
    members::wait_for("the mounts' lease channels", || async { leasing(&at).await && leasing(&bt).await }).await;
    let native = cl.client().await;
    let exists = |p: PathBuf| p.symlink_metadata().is_ok();
    let create = |p: PathBuf| std::fs::OpenOptions::new().write(true).create_new(true).open(p).map(drop);
    let ino = |p: PathBuf| std::fs::metadata(p).unwrap().ino();
    for d in ["d", "e", "g", "h"] {
        std::fs::create_dir(a.path(d)).unwrap();
    }
    const CREATES: usize = 20;
    let asked = mds_lookups().await;
    for i in 0..CREATES {
        create(a.path(&format!("d/f{i}"))).unwrap();
        assert!(!exists(a.path(&format!("d/missing{i}"))));
    }
    let asked = mds_lookups().await - asked;
    assert_eq!(asked, 0.0, "Lookup calls at the MDS for {CREATES} creates and lookups of missing names");
    assert!(matches!(create(a.path("d/f0")), Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists));

    // Others' names: a create by the native client and by the other mount, a link and a rename in.
    let (d, e, g) = (ino(a.path("d")), ino(a.path("e")), ino(a.path("g")));
    assert!(!exists(a.path("d/other")) && !exists(a.path("e/x")) && !exists(a.path("g/y")) && !exists(a.path("h/z")));
    native.create(d, "other", 0o644, true).await.unwrap();
    assert!(exists(a.path("d/other")), "a native client's create");
    native.link(ino(a.path("d/f0")), e, "x").await.unwrap();
    assert!(exists(a.path("e/x")), "a native client's link");
    native.rename(d, "f1", g, "y", 0).await.unwrap();
    assert!(exists(a.path("g/y")) && !exists(a.path("d/f1")), "a native client's rename");
    create(b.path("h/z")).unwrap();
    assert!(exists(a.path("h/z")), "the other mount's create");

    // A directory made elsewhere, listed whole through the mount under its lease: its names are known too.
    let l = native.mkdir(weft_proto::ROOT_INO, "listed", 0o755).await.unwrap().ino;
    native.create(l, "there", 0o644, true).await.unwrap();
    let mut listing: Vec<String> =
        std::fs::read_dir(a.path("listed")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    listing.sort();
    assert_eq!(listing, ["there"]);
    let asked = mds_lookups().await;
    for i in 0..CREATES {
        create(a.path(&format!("listed/f{i}"))).unwrap();
    }
    assert!(exists(a.path("listed/there")));
    assert_eq!(mds_lookups().await - asked, 0.0, "Lookup calls at the MDS for creates in a listed directory");
    native.create(l, "later", 0o644, true).await.unwrap();
    assert!(exists(a.path("listed/later")), "a native client's create after the listing");

    // The mount's own changes of names in a directory it made.
    std::fs::create_dir(a.path("k")).unwrap();
    let k = |n: &str| a.path(&format!("k/{n}"));
    create(k("a")).unwrap();
    std::fs::remove_file(k("a")).unwrap();
    assert!(!exists(k("a")), "unlinked");
    create(k("a")).unwrap();
    std::fs::rename(k("a"), k("b")).unwrap();
    assert!(!exists(k("a")) && exists(k("b")), "renamed");
    std::fs::hard_link(k("b"), k("c")).unwrap();
    std::fs::rename(k("b"), k("c")).unwrap();
    assert!(exists(k("b")) && exists(k("c")), "a rename between two links of one file removes nothing");
    std::os::unix::fs::symlink("b", k("s")).unwrap();
    std::fs::create_dir(k("sub")).unwrap();
    create(a.path("d/moved")).unwrap();
    std::fs::rename(a.path("d/moved"), k("moved")).unwrap();
    assert!(exists(k("s")) && exists(k("sub")) && exists(k("moved")), "symlink, mkdir, rename in");
    std::fs::remove_dir(k("sub")).unwrap();
    assert!(!exists(k("sub")), "removed");
    // An unlink of a file open here renames it aside (until its last close): the old name is gone, the file is not.
    let open = std::fs::File::open(k("c")).unwrap();
    std::fs::remove_file(k("c")).unwrap();
    assert!(!exists(k("c")));
    drop(open);
    let mut names: Vec<String> = native
        .readdir(ino(a.path("k")))
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .filter(|n| !n.starts_with(".weft-unlinked"))
        .collect();
    names.sort();
    assert_eq!(names, ["b", "moved", "s"], "the MDS's names");
    for n in ["a", "b", "c", "moved", "s", "sub", "t"] {
        assert_eq!(exists(k(n)), names.iter().any(|m| m == n), "k/{n} through the mount");
    }
}
