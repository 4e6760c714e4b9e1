//! `weft bench nfs --pnfs` (issue 15): for 1, 2 and 4 data servers, each a fresh local cluster (a plain layout
//! striped over all of them in 1 MiB units, every data server serving pNFS on `nfs_listen`, the gateway with
//! `--pnfs on`), the same NFSv4.1 client ([`super::client41`]) writes then reads a `--size` file in 1 MiB records
//! two ways: through pNFS (OPEN, LAYOUTGET, GETDEVICEINFO, then READ/WRITE at the data servers in parallel, each
//! stripe unit at the server the layout names, [`WINDOW`] requests in flight per server; COMMIT at each data
//! server, LAYOUTCOMMIT, LAYOUTRETURN, CLOSE) and through the gateway only (the same READ/WRITE, at the gateway,
//! [`WINDOW`] in flight; COMMIT, CLOSE). Writes are UNSTABLE; a COMMIT whose verifier differs from the writes'
//! fails the run. Every byte is read back and checked once per way, outside the timing.
//!
//! CPU is read from /proc per process before and after each timed run: the client (this process), the gateway,
//! the MDS and the data servers, each per GiB moved (the target: the gateway's near zero with pNFS).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use weft_nfs::nfs4::layout::{FileLayout, IOMODE_READ, IOMODE_RW};
use weft_nfs::nfs4::state::Stateid;

use super::RECORD_BYTES;
use super::client41::{Session, UNSTABLE4};
use crate::ceilings;
use crate::common::Loads;

/// Requests in flight per server (data server, or the gateway on the gateway-only path).
pub const WINDOW: u32 = 8;
/// The stripe unit of the bench's files: one record per unit, so each 1 MiB request goes to one server.
pub const STRIPE_UNIT: u32 = 1 << 20;

/// Where the bytes of a file offset go: which target (stripe index) and the offset sent to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Striping {
    pub unit: u64,
    pub count: u64,
    pub first: u64,
    pub pattern_offset: u64,
    pub dense: bool,
}

impl Striping {
    /// A files layout's striping (RFC 8881 §13.4: stripe unit number, first stripe index, pattern offset).
    pub fn of(l: &FileLayout) -> Striping {
        Striping {
            unit: u64::from(l.stripe_unit),
            count: l.fhs.len() as u64,
            first: u64::from(l.first_stripe_index),
            pattern_offset: l.pattern_offset,
            dense: l.dense,
        }
    }

    /// One target that takes file offsets (the gateway), pieces of at most a record.
    pub fn single() -> Striping {
        Striping { unit: RECORD_BYTES as u64, count: 1, first: 0, pattern_offset: 0, dense: false }
    }

    /// (stripe index, offset sent to it) of file offset `off`: sparse layouts send the file offset, dense ones
    /// the offset in the server's packed object.
    pub fn place(&self, off: u64) -> (usize, u64) {
        let rel = off.saturating_sub(self.pattern_offset);
        let su = rel / self.unit;
        let index = ((su + self.first) % self.count) as usize;
        let sent = if self.dense { (su / self.count) * self.unit + rel % self.unit } else { off };
        (index, sent)
    }

    /// `[off, off + len)` cut at stripe-unit and record boundaries, so each piece goes to one server and lies in
    /// one record.
    pub fn pieces(&self, off: u64, len: u64) -> Vec<(u64, u32)> {
        let mut out = Vec::new();
        let (mut at, end) = (off, off + len);
        while at < end {
            let rel = at.saturating_sub(self.pattern_offset);
            let unit_end = at + (self.unit - rel % self.unit);
            let record_end = (at / RECORD_BYTES as u64 + 1) * RECORD_BYTES as u64;
            let next = end.min(unit_end).min(record_end);
            out.push((at, (next - at) as u32));
            at = next;
        }
        out
    }
}

/// One piece of the file at one target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub file_off: u64,
    pub sent_off: u64,
    pub len: u32,
}

/// The pieces of a `size`-byte file per target, in file order.
pub fn plan(s: &Striping, size: u64) -> Vec<Vec<Piece>> {
    let mut per = vec![Vec::new(); s.count as usize];
    for (file_off, len) in s.pieces(0, size) {
        let (i, sent_off) = s.place(file_off);
        per[i].push(Piece { file_off, sent_off, len });
    }
    per
}

/// Where a request goes: a session, the filehandle there, the stateid to send.
#[derive(Clone)]
pub struct Target {
    pub session: Arc<Session>,
    pub fh: Vec<u8>,
    pub stateid: Stateid,
}

/// The expected bytes of `[off, off + len)` of the bench's file (inside one record): the record's index in its
/// first 8 bytes, the seeded pattern after (what `super::stamp` writes).
fn expected(pattern: &[u8], off: u64, len: u32) -> (Vec<u8>, &[u8]) {
    let record = off / RECORD_BYTES as u64;
    let ro = (off % RECORD_BYTES as u64) as usize;
    let end = ro + len as usize;
    let stamp = record.to_le_bytes();
    let head = if ro < 8 { stamp[ro..end.min(8)].to_vec() } else { Vec::new() };
    (head, &pattern[ro.max(8).min(end)..end])
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Io {
    Write,
    Read { verify: bool },
}

/// Moves the whole file: each target's pieces by [`WINDOW`] workers, all targets at once. Writes are UNSTABLE and
/// each target is then COMMITted; a verifier that differs from its writes' fails.
pub async fn transfer(targets: &[Target], s: &Striping, size: u64, io: Io, pattern: Arc<Vec<u8>>) -> Result<()> {
    let per = plan(s, size);
    if per.len() != targets.len() {
        bail!("the layout has {} stripe indices for {} targets", per.len(), targets.len());
    }
    let mut set = tokio::task::JoinSet::new();
    for (t, pieces) in targets.iter().zip(per) {
        let pieces = Arc::new(pieces);
        let next = Arc::new(AtomicUsize::new(0));
        let verifiers = Arc::new(std::sync::Mutex::new(None::<[u8; 8]>));
        let mut workers: tokio::task::JoinSet<Result<()>> = tokio::task::JoinSet::new();
        for _ in 0..WINDOW {
            let (t, pieces, next, pattern, verifiers) =
                (t.clone(), pieces.clone(), next.clone(), pattern.clone(), verifiers.clone());
            workers.spawn(async move {
                loop {
                    let Some(p) = pieces.get(next.fetch_add(1, Ordering::Relaxed)).copied() else { return Ok(()) };
                    one(&t, p, io, &pattern, &verifiers).await?;
                }
            });
        }
        let t = t.clone();
        set.spawn(async move {
            while let Some(r) = workers.join_next().await {
                r??;
            }
            if io == Io::Write {
                let v = t.session.commit(&t.fh).await?;
                let w = *verifiers.lock().expect("verifiers");
                if w.is_some_and(|w| w != v) {
                    bail!("{}: COMMIT's verifier differs from the WRITEs' (the server restarted?)", t.session.server());
                }
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    Ok(())
}

async fn one(
    t: &Target,
    p: Piece,
    io: Io,
    pattern: &[u8],
    verifiers: &std::sync::Mutex<Option<[u8; 8]>>,
) -> Result<()> {
    let (head, rest) = expected(pattern, p.file_off, p.len);
    match io {
        Io::Write => {
            let (count, _committed, verf) =
                t.session.write(&t.fh, &t.stateid, p.sent_off, UNSTABLE4, &[&head, rest]).await?;
            if count != p.len {
                bail!("{}: WRITE at file offset {} wrote {count} of {} bytes", t.session.server(), p.file_off, p.len);
            }
            let mut v = verifiers.lock().expect("verifiers");
            if v.is_some_and(|v| v != verf) {
                bail!("{}: WRITE at file offset {} changed the write verifier", t.session.server(), p.file_off);
            }
            *v = Some(verf);
        }
        Io::Read { verify } => {
            let (res, _eof, range) = t.session.read(&t.fh, &t.stateid, p.sent_off, p.len).await?;
            if range.len() != p.len as usize {
                bail!(
                    "{}: READ at file offset {} returned {} of {} bytes",
                    t.session.server(),
                    p.file_off,
                    range.len(),
                    p.len
                );
            }
            let got = &res.bytes()[range];
            if verify && (got[..head.len()] != head[..] || got[head.len()..] != *rest) {
                bail!("{}: the {} bytes at file offset {} came back different", t.session.server(), p.len, p.file_off);
            }
        }
    }
    Ok(())
}

/// One figure of one way (pNFS or gateway-only) at one server count.
#[derive(Debug, Clone)]
pub struct PFig {
    /// `pnfs` or `gateway`.
    pub path: &'static str,
    pub servers: u32,
    pub op: &'static str,
    pub samples: Vec<f64>,
    pub client_cpu: Vec<f64>,
    pub gateway_cpu: Vec<f64>,
    pub mds_cpu: Vec<f64>,
    pub ds_cpu: Vec<f64>,
    pub loads: Loads,
    pub verified_bytes: Option<u64>,
}

impl PFig {
    pub fn new(path: &'static str, servers: u32, op: &'static str) -> PFig {
        PFig {
            path,
            servers,
            op,
            samples: vec![],
            client_cpu: vec![],
            gateway_cpu: vec![],
            mds_cpu: vec![],
            ds_cpu: vec![],
            loads: Loads::default(),
            verified_bytes: None,
        }
    }
}

/// The processes whose CPU is counted apart.
struct Pids {
    gateway: Vec<u32>,
    mds: Vec<u32>,
    ds: Vec<u32>,
}

fn cpu(pids: &[u32]) -> f64 {
    pids.iter().filter_map(|&p| ceilings::process_cpu_seconds(p)).sum()
}

/// The client side of one cluster: the gateway's session, the bench directory, data-server sessions by address.
struct Bench {
    gw: Arc<Session>,
    dir: Vec<u8>,
    ds: HashMap<SocketAddr, Arc<Session>>,
    cred: (u32, u32),
    pattern: Arc<Vec<u8>>,
}

impl Bench {
    async fn ds_targets(&mut self, l: &FileLayout, open: &Stateid) -> Result<Vec<Target>> {
        let addrs = self.gw.getdeviceinfo(&l.device).await?;
        if addrs.len() != l.fhs.len() {
            bail!("GETDEVICEINFO names {} stripe indices, the layout {}", addrs.len(), l.fhs.len());
        }
        let mut out = Vec::new();
        for (i, (a, fh)) in addrs.iter().zip(&l.fhs).enumerate() {
            let addr = *a.first().with_context(|| format!("stripe index {i} has no data-server address"))?;
            if !self.ds.contains_key(&addr) {
                let owner = format!("weft-bench-{}-ds-{addr}", std::process::id());
                let s = Session::open("data server", addr, owner.as_bytes(), true, WINDOW, self.cred).await?;
                self.ds.insert(addr, Arc::new(s));
            }
            out.push(Target { session: self.ds[&addr].clone(), fh: fh.clone(), stateid: *open });
        }
        Ok(out)
    }

    async fn write(&mut self, path: &str, name: &str, size: u64) -> Result<()> {
        let (open, fh) = self.gw.open_file(&self.dir, name, true).await?;
        if path == "pnfs" {
            let (lsid, l) = self.gw.layoutget(&fh, &open, IOMODE_RW).await?;
            let targets = self.ds_targets(&l, &open).await?;
            transfer(&targets, &Striping::of(&l), size, Io::Write, self.pattern.clone()).await?;
            self.gw.layoutcommit(&fh, &lsid, size - 1).await?;
            self.gw.layoutreturn(&fh, &lsid).await?;
        } else {
            let t = Target { session: self.gw.clone(), fh: fh.clone(), stateid: open };
            transfer(&[t], &Striping::single(), size, Io::Write, self.pattern.clone()).await?;
        }
        self.gw.close(&fh, &open).await
    }

    async fn read(&mut self, path: &str, name: &str, size: u64, verify: bool) -> Result<()> {
        let (open, fh) = self.gw.open_file(&self.dir, name, false).await?;
        let io = Io::Read { verify };
        if path == "pnfs" {
            let (lsid, l) = self.gw.layoutget(&fh, &open, IOMODE_READ).await?;
            let targets = self.ds_targets(&l, &open).await?;
            transfer(&targets, &Striping::of(&l), size, io, self.pattern.clone()).await?;
            self.gw.layoutreturn(&fh, &lsid).await?;
        } else {
            let t = Target { session: self.gw.clone(), fh: fh.clone(), stateid: open };
            transfer(&[t], &Striping::single(), size, io, self.pattern.clone()).await?;
        }
        self.gw.close(&fh, &open).await
    }
}

/// A fresh cluster of `servers` data servers with pNFS on; both ways measured `runs` times.
pub async fn measure_cluster(base: &Path, servers: u32, size: u64, runs: usize) -> Result<Vec<PFig>> {
    let dir = base.join(format!("weft-pnfs-{servers}"));
    let mut opts = weft_launch::LaunchOptions::new(crate::weft_exe()?, &dir, servers);
    opts.log_filter = "warn".into();
    opts.ds_nfs = true;
    let mut cluster = weft_launch::LocalCluster::start(opts).await?;
    let r = async {
        let client = cluster.client().await?;
        let d = client.mkdir(1, "bench", 0o777).await?;
        client.set_layout(d.ino, STRIPE_UNIT, servers).await?;
        client.close().await;
        let o = weft_launch::NfsOptions {
            root_squash: false,
            extra_args: ["--pnfs", "on", "--nfs4-grace-ms", "0"].iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let mut g = cluster.start_nfs(&o).await?;
        let all = cluster.pids();
        let n = servers as usize;
        if all.len() < n + 1 {
            bail!("the cluster reports {} processes for {servers} data servers", all.len());
        }
        let pids = Pids {
            gateway: g.pid().into_iter().collect(),
            mds: all[..all.len() - n].to_vec(),
            ds: all[all.len() - n..].to_vec(),
        };
        let r = measure(&g, &pids, servers, size, runs).await;
        g.stop().await;
        r
    }
    .await;
    cluster.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    r
}

async fn measure(g: &weft_launch::NfsGateway, pids: &Pids, servers: u32, size: u64, runs: usize) -> Result<Vec<PFig>> {
    let cred = effective_ids();
    let addr: SocketAddr = g.addr().parse().with_context(|| format!("the gateway's address {}", g.addr()))?;
    let owner = format!("weft-bench-{}-gw-{servers}", std::process::id());
    let gw = Session::open("gateway", addr, owner.as_bytes(), false, WINDOW, cred).await?;
    if gw.flags & weft_nfs::nfs4::consts::EXCHGID4_FLAG_USE_PNFS_MDS == 0 {
        bail!("the gateway at {addr} is no pNFS metadata server (EXCHANGE_ID flags {:#x})", gw.flags);
    }
    let dir = gw.lookup_path(&["bench"]).await?;
    let mut b = Bench {
        gw: Arc::new(gw),
        dir,
        ds: HashMap::new(),
        cred,
        pattern: Arc::new(super::pattern(RECORD_BYTES, 0x5eed)),
    };
    let paths = ["pnfs", "gateway"];
    // Warm-up (sessions to the data servers, the servers' first allocations): a small file each way.
    let warm = size.min(16 << 20);
    for p in paths {
        b.write(p, "warm", warm).await?;
        b.read(p, "warm", warm, true).await?;
        b.gw.remove(&b.dir, "warm").await?;
    }
    let gib = size as f64 / (1u64 << 30) as f64;
    let me = [std::process::id()];
    let mut figs: Vec<PFig> =
        paths.iter().flat_map(|p| [PFig::new(p, servers, "write"), PFig::new(p, servers, "read")]).collect();
    for _ in 0..runs {
        for f in figs.iter_mut() {
            let name = format!("seq-{}", f.path);
            if f.op == "write" {
                b.gw.remove(&b.dir, &name).await?;
            }
            f.loads.start();
            let before = [cpu(&me), cpu(&pids.gateway), cpu(&pids.mds), cpu(&pids.ds)];
            let t = Instant::now();
            if f.op == "write" {
                b.write(f.path, &name, size).await?;
            } else {
                b.read(f.path, &name, size, false).await?;
            }
            let secs = t.elapsed().as_secs_f64();
            let after = [cpu(&me), cpu(&pids.gateway), cpu(&pids.mds), cpu(&pids.ds)];
            f.loads.end();
            let d = |i: usize| (after[i] - before[i]).max(0.0) / gib;
            f.samples.push(gib * 1024.0 / secs);
            f.client_cpu.push(d(0));
            f.gateway_cpu.push(d(1));
            f.mds_cpu.push(d(2));
            f.ds_cpu.push(d(3));
        }
    }
    // Once, untimed: every byte of each file, read the way it was written, is what was written.
    for f in figs.iter_mut().filter(|f| f.op == "read") {
        let name = format!("seq-{}", f.path);
        b.read(f.path, &name, size, true).await.with_context(|| format!("verifying {name}"))?;
        f.verified_bytes = Some(size);
        b.gw.remove(&b.dir, &name).await?;
    }
    Ok(figs)
}

/// The effective uid and gid (from /proc/self/status: no FFI), sent as AUTH_SYS; root if unreadable.
fn effective_ids() -> (u32, u32) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(2))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("Uid:"), field("Gid:"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(unit: u32, n: usize, first: u32, dense: bool) -> FileLayout {
        FileLayout {
            device: [0; 16],
            stripe_unit: unit,
            dense,
            first_stripe_index: first,
            pattern_offset: 0,
            fhs: vec![vec![]; n],
        }
    }

    #[test]
    fn stripes_go_to_the_server_the_layout_names() {
        // Sparse, 4 servers, 1 MiB units: unit k to server k % 4 at its file offset.
        let s = Striping::of(&layout(1 << 20, 4, 0, false));
        assert_eq!(s.place(0), (0, 0));
        assert_eq!(s.place(5 << 20), (1, 5 << 20));
        assert_eq!(s.place((7 << 20) + 3), (3, (7 << 20) + 3));
        // Dense: the offset in the server's packed object; a first stripe index rotates.
        let d = Striping::of(&layout(65536, 3, 1, true));
        assert_eq!(d.place(0), (1, 0));
        assert_eq!(d.place(65536 * 4 + 10), (2, 65536 + 10));
        // Pieces cut at units and records; a plan covers the file once, in order, per server.
        let s = Striping::of(&layout(65536, 2, 0, false));
        assert_eq!(s.pieces(65000, 1000), vec![(65000, 536), (65536, 464)]);
        let size = 3 * (1u64 << 20) + 100;
        let p = plan(&s, size);
        assert_eq!(p.len(), 2);
        let total: u64 = p.iter().flatten().map(|x| u64::from(x.len)).sum();
        assert_eq!(total, size);
        assert!(p[0].iter().all(|x| s.place(x.file_off).0 == 0 && x.sent_off == x.file_off));
        assert!(p[1].iter().all(|x| (x.file_off / 65536) % 2 == 1));
        let big = Striping::of(&layout(4 << 20, 2, 0, false));
        assert!(big.pieces(0, 8 << 20).iter().all(|&(o, l)| l == 1 << 20 && o % (1 << 20) == 0), "records too");
        let one = plan(&Striping::single(), size);
        assert_eq!((one.len(), one[0].len()), (1, 4));
        assert_eq!(one[0][3], Piece { file_off: 3 << 20, sent_off: 3 << 20, len: 100 });
    }

    #[test]
    fn expected_bytes_carry_the_record_stamp() {
        let pattern = super::super::pattern(RECORD_BYTES, 1);
        let mut rec = pattern.clone();
        super::super::stamp(&mut rec, 5);
        let base = 5 * RECORD_BYTES as u64;
        for (ro, len) in [(0usize, 100u32), (3, 10), (8, 50), (100, 1000), (0, RECORD_BYTES as u32)] {
            let (h, r) = expected(&pattern, base + ro as u64, len);
            let mut got = h.clone();
            got.extend_from_slice(r);
            assert_eq!(got, rec[ro..ro + len as usize], "at {ro}+{len}");
        }
    }
}
