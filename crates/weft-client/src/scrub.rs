//! Scrub (docs/format.md §20): walks the files under a path and, for every chunk of every file, verifies its
//! checksums on its data server (op `VerifyObject`, which checks blocks against the sidecar without sending them);
//! for `ec k+m` files also every stripe row's parity (the row's `k + m` chunks read, the data re-encoded, the
//! parity compared), for `mirror n` files that the copies agree. `weft scrub` runs it once; `weft meta` runs it in
//! the background, rate-limited (`scrub_mib_per_s`).
//!
//! What is repaired, and from what (the rule):
//! - a chunk that fails its checksum (or whose server lost bytes past its object's end) is rewritten from the
//!   others: an ec row decoded from any `k` intact chunks, a mirror block from a copy that passes;
//! - an ec parity chunk that disagrees with intact data is rewritten from the data: data chunks that pass their
//!   checksums and hold the row's bytes inside their objects are the truth;
//! - an ec data chunk whose object ends early (its tail lost with its checksums in a crash, so it reads as zeros
//!   that no checksum vouches for) is rebuilt from the others when the row's parity says so with a check to spare.
//!
//! Invariant: scrub never rewrites a chunk that passes its checksum from data it has not verified (zeros past an
//! object's end are not verified data); an ambiguous row is reported, never guessed.
//! Invariant: every unrepairable finding is reported (file, offset, server) and makes `weft scrub` exit non-zero;
//! nothing is silently zeroed.
//!
//! Memory is bounded: one directory page per level of the walk, one batch of verified ranges and one stripe row of
//! chunks at a time, and at most [`FINDINGS_MAX`] findings kept (the rest only counted).

use std::time::{Duration, Instant};

use bytes::BytesMut;
use weft_proto::msg::{VERIFY_BYTES_MAX, VerifyReq, VerifyResp};
use weft_proto::{DataRedundancy, FileKind, Layout, Request, Response};

use crate::ec_codec::{Codec, is_chunk_loss, km};
use crate::handle::File;
use crate::handle::repair_io;
use crate::striped::Io;
use crate::striped::read_on;
use crate::{Client, ClientError, OpenMode};

/// Checksum block of the data servers' sidecars (§5): the unit verify answers in.
const BLOCK_BYTES: u64 = 4096;

/// Findings kept in a report; past it they are only counted.
pub const FINDINGS_MAX: usize = 1000;

/// Bytes of one mirror window or one batch of ec rows verified at once.
const WINDOW_BYTES: u64 = 8 << 20;

/// How a scrub runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScrubOptions {
    /// Rewrite what can be repaired (`false`: `--dry-run`, report only).
    pub repair: bool,
    /// Most MiB per second verified and read (0: as fast as the servers go).
    pub rate_mib_per_s: u64,
}

impl Default for ScrubOptions {
    fn default() -> ScrubOptions {
        ScrubOptions { repair: true, rate_mib_per_s: 0 }
    }
}

/// One inconsistency found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub path: String,
    pub ino: u64,
    pub file_offset: u64,
    /// The data server holding the chunk (`u32::MAX` when none: a file-level failure).
    pub server: u32,
    pub what: String,
    pub repaired: bool,
    /// Repairable, but left as found (`--dry-run`).
    pub dry_run: bool,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match (self.repaired, self.dry_run) {
            (true, _) => "repaired",
            (false, true) => "repairable (dry run)",
            (false, false) => "UNREPAIRABLE",
        };
        write!(f, "{state}: {} (inode {}) at file offset {}", self.path, self.ino, self.file_offset)?;
        if self.server != u32::MAX {
            write!(f, ", data server {}", self.server)?;
        }
        write!(f, ": {}", self.what)
    }
}

/// What a scrub saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScrubReport {
    pub files: u64,
    /// File bytes covered (sizes of the files scrubbed).
    pub bytes: u64,
    /// Chunks checked: stripe units of each object (ec: every chunk of every row; mirror: of every copy).
    pub chunks: u64,
    pub inconsistencies: u64,
    pub repaired: u64,
    pub unrepairable: u64,
    /// Repairable, left as found (`--dry-run`).
    pub dry_run: u64,
    /// The first [`FINDINGS_MAX`] findings.
    pub findings: Vec<Finding>,
}

impl ScrubReport {
    fn found(&mut self, f: Finding) {
        self.inconsistencies += 1;
        if f.dry_run {
            self.dry_run += 1;
        } else if f.repaired {
            self.repaired += 1;
            tracing::info!(path = %f.path, ino = f.ino, file_offset = f.file_offset, server = f.server, "scrub repaired: {}", f.what);
        } else {
            self.unrepairable += 1;
            tracing::warn!(path = %f.path, ino = f.ino, file_offset = f.file_offset, server = f.server, "scrub cannot repair: {}", f.what);
        }
        if self.findings.len() < FINDINGS_MAX {
            self.findings.push(f);
        }
    }

    /// Adds another report's counts and findings (the background scrubber sums passes).
    pub fn add(&mut self, o: &ScrubReport) {
        self.files += o.files;
        self.bytes += o.bytes;
        self.chunks += o.chunks;
        self.inconsistencies += o.inconsistencies;
        self.repaired += o.repaired;
        self.unrepairable += o.unrepairable;
        self.dry_run += o.dry_run;
    }
}

/// Paces a scrub to a rate: after each piece of work, waits until the bytes done so far fit the rate.
struct Pace {
    start: Instant,
    bytes: u64,
    bytes_per_s: u64,
}

impl Pace {
    fn new(rate_mib_per_s: u64) -> Pace {
        Pace { start: Instant::now(), bytes: 0, bytes_per_s: rate_mib_per_s.saturating_mul(1 << 20) }
    }

    async fn done(&mut self, bytes: u64) {
        self.bytes += bytes;
        if self.bytes_per_s == 0 {
            return;
        }
        let due = Duration::from_secs_f64(self.bytes as f64 / self.bytes_per_s as f64);
        let spent = self.start.elapsed();
        if due > spent {
            // A rate limit is a wait by nature: scrub yields the disks to the clients.
            tokio::time::sleep(due - spent).await;
        }
    }
}

/// One directory being walked: where its next page starts.
struct Frame {
    ino: u64,
    path: String,
    after: String,
}

/// Scrubs every regular file under `path` (a file or a directory) of `client`'s cluster.
pub async fn scrub_path(client: &Client, path: &str, opts: ScrubOptions) -> Result<ScrubReport, ClientError> {
    let top = client.resolve(path).await?;
    let mut report = ScrubReport::default();
    let mut pace = Pace::new(opts.rate_mib_per_s);
    let root_path = if path.is_empty() { "/".to_string() } else { path.to_string() };
    if top.kind != FileKind::Dir {
        if top.kind == FileKind::File {
            scrub_ino(client, top.ino, &root_path, opts, &mut pace, &mut report).await;
        }
        return Ok(report);
    }
    // Depth-first, one page of entries per directory on the stack.
    let mut stack =
        vec![Frame { ino: top.ino, path: root_path.trim_end_matches('/').to_string(), after: String::new() }];
    while let Some(frame) = stack.last_mut() {
        let page = match client.readdir_page(frame.ino, &frame.after, weft_proto::READDIR_ENTRIES_MAX).await {
            Ok(p) => p,
            Err(e) => {
                // Removed while walked, or not readable by this caller: skip it, say so.
                tracing::warn!(path = %frame.path, "scrub skips a directory: {e}");
                stack.pop();
                continue;
            }
        };
        let eof = page.eof || page.entries.is_empty();
        if let Some(last) = page.entries.last() {
            frame.after = last.name.clone();
        }
        let dir_path = frame.path.clone();
        if eof {
            stack.pop();
        }
        for e in page.entries {
            if e.name == "." || e.name == ".." {
                continue;
            }
            let p = format!("{dir_path}/{}", e.name);
            match e.kind {
                FileKind::File => scrub_ino(client, e.ino, &p, opts, &mut pace, &mut report).await,
                FileKind::Dir => stack.push(Frame { ino: e.ino, path: p, after: String::new() }),
                _ => {}
            }
        }
    }
    Ok(report)
}

/// Scrubs one file; a failure to open it or to reach its servers is a finding (unrepairable), except a file
/// removed meanwhile.
async fn scrub_ino(
    client: &Client,
    ino: u64,
    path: &str,
    opts: ScrubOptions,
    pace: &mut Pace,
    report: &mut ScrubReport,
) {
    let file = match client.open_ino(ino, OpenMode::Read).await {
        Ok(f) => f,
        Err(e) if crate::is_not_found(&e) => return,
        Err(e) => {
            report.found(Finding {
                path: path.into(),
                ino,
                file_offset: 0,
                server: u32::MAX,
                what: format!("cannot open: {e}"),
                repaired: false,
                dry_run: false,
            });
            return;
        }
    };
    report.files += 1;
    report.bytes += file.size();
    let mut s = FileScrub { file: &file, path, opts, report };
    let r = match file.layout().redundancy {
        DataRedundancy::Plain => s.plain(pace).await,
        DataRedundancy::Mirror { .. } => s.mirror(pace).await,
        _ => s.ec(pace).await,
    };
    if let Err(e) = r {
        s.report.found(Finding {
            path: path.into(),
            ino,
            file_offset: 0,
            server: u32::MAX,
            what: format!("scrub failed: {e}"),
            repaired: false,
            dry_run: false,
        });
    }
    let _ = file.close().await;
}

/// Asks server `server` to verify `[offset, offset + len)` of the file's object, `len` ≤ [`VERIFY_BYTES_MAX`].
async fn verify(file: &File, server: u32, offset: u64, len: u64) -> Result<VerifyResp, ClientError> {
    let ino = file.attr.ino;
    let make = |cap| Request::VerifyObject(VerifyReq { ino, offset, len, cap });
    match crate::capability::call_with_capability(&file.client, server, &file.caps, make).await? {
        Response::VerifyObject(v) => Ok(v),
        other => Err(ClientError::Protocol(format!("VerifyObject answered {:?}", other.op()))),
    }
}

/// [`verify`] of a range of any length, in pieces; bad blocks of all pieces, and the object's length.
async fn verify_all(file: &File, server: u32, offset: u64, len: u64) -> Result<(u64, Vec<u64>), ClientError> {
    let mut bad = Vec::new();
    let mut obj_len = 0;
    let end = offset + len;
    let mut at = offset;
    while at < end {
        let n = (end - at).min(VERIFY_BYTES_MAX);
        let v = verify(file, server, at, n).await?;
        obj_len = v.object_len;
        bad.extend(v.bad);
        if v.bad_more {
            // More than a response lists: every block of the rest of this piece counts as bad.
            let from = bad.last().map_or(at, |b| b + BLOCK_BYTES);
            let mut b = from;
            while b < at + n && bad.len() < crate::scrub::FINDINGS_MAX * 64 {
                bad.push(b);
                b += BLOCK_BYTES;
            }
        }
        at += n;
    }
    Ok((obj_len, bad))
}

/// The file offset of object offset `object_offset` in the object at `server_index` of a plain `layout`.
fn plain_file_offset(layout: &Layout, server_index: usize, object_offset: u64) -> u64 {
    let unit = u64::from(layout.stripe_unit);
    let count = u64::from(layout.stripe_count);
    let stripe = (object_offset / unit) * count + server_index as u64;
    stripe * unit + object_offset % unit
}

struct FileScrub<'a> {
    file: &'a File,
    path: &'a str,
    opts: ScrubOptions,
    report: &'a mut ScrubReport,
}

impl FileScrub<'_> {
    fn finding(&mut self, file_offset: u64, server: u32, what: String, repaired: bool) {
        let f = Finding {
            path: self.path.into(),
            ino: self.file.attr.ino,
            file_offset,
            server,
            what,
            repaired,
            dry_run: false,
        };
        self.report.found(f);
    }

    /// A repairable finding left as found (`--dry-run`).
    fn dry(&mut self, file_offset: u64, server: u32, what: String) {
        let f = Finding {
            path: self.path.into(),
            ino: self.file.attr.ino,
            file_offset,
            server,
            what,
            repaired: false,
            dry_run: true,
        };
        self.report.found(f);
    }

    /// A plain file: every object verified; a bad block has no other copy, so it is reported.
    async fn plain(&mut self, pace: &mut Pace) -> Result<(), ClientError> {
        let layout = self.file.layout();
        let size = self.file.size();
        let unit = u64::from(layout.stripe_unit);
        for (i, &server) in layout.servers.iter().enumerate() {
            let len = layout.object_size(size, i as u32);
            self.report.chunks += len.div_ceil(unit);
            let (_, bad) = verify_all(self.file, server, 0, len).await?;
            for b in bad {
                let at = plain_file_offset(&layout, i, b);
                self.finding(
                    at,
                    server,
                    format!("block at object offset {b} fails its checksum (no redundancy)"),
                    false,
                );
            }
            pace.done(len).await;
        }
        Ok(())
    }

    /// A mirrored file: every copy verified; bad blocks rewritten from a copy that passes; copies compared.
    async fn mirror(&mut self, pace: &mut Pace) -> Result<(), ClientError> {
        let layout = self.file.layout();
        let n = layout.servers.len();
        let size = self.file.size();
        let unit = u64::from(layout.stripe_unit);
        let io = self.file.io();
        let mut repair: Option<Io> = None;
        let mut w = 0;
        while w < size {
            let len = WINDOW_BYTES.min(size - w);
            let wlen = len.div_ceil(BLOCK_BYTES) * BLOCK_BYTES;
            let mut lens = vec![0u64; n];
            let mut bad: Vec<Vec<u64>> = vec![Vec::new(); n];
            for c in 0..n {
                let (l, b) = verify_all(self.file, layout.servers[c], w, wlen).await?;
                lens[c] = l;
                bad[c] = b;
                self.report.chunks += len.div_ceil(unit);
            }
            // Copies in a stale range (§18) missed writes: the healer's, neither judged nor used here.
            let stale = crate::stale::stale_slots(self.file, w / unit, (w + wlen).div_ceil(unit)).await?;
            // Read every copy's window; blocks that failed are ignored in the comparison below.
            let mut copies = Vec::with_capacity(n);
            for (c, bad_c) in bad.iter().enumerate() {
                copies.push(read_window(&io, &layout.data_view(c), w, wlen, bad_c).await?);
            }
            let mut b = w;
            while b < w + wlen {
                let i = (b - w) as usize..(b - w + BLOCK_BYTES) as usize;
                // Copies whose block passes its checksum and lies inside their object: verified bytes.
                let verified: Vec<usize> =
                    (0..n).filter(|&c| !stale.contains(&c) && !bad[c].contains(&b) && lens[c] > b).collect();
                let truth = verified.first().map(|&g| &copies[g][i.clone()]);
                if verified.iter().any(|&c| Some(&copies[c][i.clone()]) != truth) {
                    self.finding(b, u32::MAX, "mirror copies that all pass their checksums disagree".into(), false);
                    b += BLOCK_BYTES;
                    continue;
                }
                for c in (0..n).filter(|c| !stale.contains(c)) {
                    let wrong =
                        bad[c].contains(&b) || (lens[c] <= b && truth.is_some_and(|t| copies[c][i.clone()] != *t));
                    if wrong {
                        let what = if bad[c].contains(&b) {
                            "block fails its checksum"
                        } else {
                            "block lost past the copy's end"
                        };
                        self.mirror_fix(&mut repair, c, b, what, verified.first().copied()).await?;
                    }
                }
                b += BLOCK_BYTES;
            }
            pace.done(len * n as u64).await;
            w += len;
        }
        Ok(())
    }

    /// Copy `c`'s block at `b` is wrong (`what`): copied again from copy `truth` (one that passes) through `repair`
    /// (made on first use) under the copies' write fences (`mirror_fence::copy_range`, which reads it again once
    /// fenced, so a write racing the scrub is never undone), or reported.
    async fn mirror_fix(
        &mut self,
        repair: &mut Option<Io>,
        c: usize,
        b: u64,
        what: &str,
        truth: Option<usize>,
    ) -> Result<(), ClientError> {
        let layout = self.file.layout();
        let server = layout.servers[c];
        let Some(t) = truth else {
            self.finding(b, server, format!("{what}, and no copy passes"), false);
            return Ok(());
        };
        if !self.opts.repair {
            self.dry(b, server, format!("{what}: not rewritten"));
            return Ok(());
        }
        if repair.is_none() {
            *repair = Some(repair_io(self.file).await?);
        }
        let r = repair.as_ref().expect("set above");
        match crate::mirror_fence::copy_range(self.file, r, (c, &[t]), b, b + BLOCK_BYTES).await {
            Ok(()) => self.finding(b, server, format!("{what}: rewritten from another copy"), true),
            Err(e) => self.finding(b, server, format!("{what}: rewriting failed: {e}"), false),
        }
        Ok(())
    }

    /// An ec file: per batch of rows, every chunk verified; per row, the chunks read and checked against parity.
    async fn ec(&mut self, pace: &mut Pace) -> Result<(), ClientError> {
        let layout = self.file.layout();
        let (k, m) = km(&layout).expect("an ec layout");
        let unit = u64::from(layout.stripe_unit);
        let row_bytes = unit * k as u64;
        let size = self.file.size();
        let rows_total = size.div_ceil(row_bytes);
        let batch = (WINDOW_BYTES / unit).max(1);
        let codec = Codec::new(k, m)?;
        let io = self.file.io();
        let mut r = 0;
        while r < rows_total {
            let rows = batch.min(rows_total - r);
            // Per chunk server: its object's length and bad blocks in this batch (None: the server failed).
            let mut lens: Vec<Option<u64>> = vec![None; k + m];
            let mut bad: Vec<Vec<u64>> = vec![Vec::new(); k + m];
            for i in 0..k + m {
                match verify_all(self.file, layout.servers[i], r * unit, rows * unit).await {
                    Ok((l, b)) => {
                        lens[i] = Some(l);
                        bad[i] = b;
                    }
                    Err(e) if is_chunk_loss(&e) => {
                        let at = r * row_bytes;
                        self.finding(at, layout.servers[i], format!("chunk server unavailable: {e}"), false);
                    }
                    Err(e) => return Err(e),
                }
            }
            for row in r..r + rows {
                self.ec_row(&codec, &io, row, &lens, &bad).await?;
            }
            pace.done(rows * unit * (k + m) as u64).await;
            r += rows;
        }
        Ok(())
    }

    /// One ec row: see the module's rules.
    async fn ec_row(
        &mut self,
        codec: &Codec,
        io: &Io,
        row: u64,
        lens: &[Option<u64>],
        bad: &[Vec<u64>],
    ) -> Result<(), ClientError> {
        let (k, m) = (codec.k, codec.m);
        let unit = u64::from(self.file.layout().stripe_unit);
        let r = RowAt { k, unit, at: row * unit, file_at: row * unit * k as u64 };
        self.report.chunks += (k + m) as u64;
        // A chunk in a stale range (§18) missed writes and is the healer's: its row is not judged here (stale data
        // would pass its checksums and look like the truth).
        if !crate::stale::stale_slots(self.file, row, row + 1).await?.is_empty() {
            return Ok(());
        }
        // The row's stored length (§16): data chunk j keeps `row_len - j·unit` of it, parity `min(row_len, unit)`.
        let row_len = self.file.size().saturating_sub(r.file_at).min(unit * k as u64);
        let keep = |i: usize| if i < k { row_len.saturating_sub(i as u64 * unit).min(unit) } else { row_len.min(unit) };
        let (shards, missing) = self.read_row(io, &r, lens, bad).await?;
        // A chunk whose object ends before its stored bytes in this row: its zeros there are not verified.
        let short: Vec<usize> =
            (0..k + m).filter(|&i| shards[i].is_some() && lens[i].is_some_and(|l| l < r.at + keep(i))).collect();
        let unavailable = (0..k + m).filter(|&i| lens[i].is_none()).count();
        let present = (0..k + m).filter(|&i| shards[i].is_some()).count();
        if present < k {
            let why = |i: usize| {
                format!(
                    "{} fails its checksum and only {present} of the row's chunks pass (need {k})",
                    chunk_name(i, k)
                )
            };
            self.chunk_findings(&r, &missing, why);
            return Ok(());
        }
        if missing.is_empty() && unavailable == 0 {
            return self.ec_row_whole(codec, &r, shards, &short).await;
        }
        self.ec_row_rebuild(codec, &r, shards, &missing).await
    }

    /// The chunks of one ec row that read and pass their checksums (`None`: unavailable or missing), and those
    /// missing (bad checksums, or a server lost while reading).
    async fn read_row(
        &mut self,
        io: &Io,
        r: &RowAt,
        lens: &[Option<u64>],
        bad: &[Vec<u64>],
    ) -> Result<(Vec<Option<Vec<u8>>>, Vec<usize>), ClientError> {
        let layout = self.file.layout();
        let mut shards: Vec<Option<Vec<u8>>> = vec![None; lens.len()];
        let mut missing = Vec::new();
        for i in (0..lens.len()).filter(|&i| lens[i].is_some()) {
            if bad[i].iter().any(|&b| b >= r.at && b < r.at + r.unit) {
                missing.push(i);
                continue;
            }
            match read_on(io, &object_of(&layout, i), r.at, r.unit).await {
                Ok(b) => shards[i] = Some(b.to_vec()),
                Err(e) if is_chunk_loss(&e) => missing.push(i),
                Err(e) => return Err(e),
            }
        }
        Ok((shards, missing))
    }

    /// A finding (not repaired) for each chunk of `which` in row `r`, saying `why`.
    fn chunk_findings(&mut self, r: &RowAt, which: &[usize], why: impl Fn(usize) -> String) {
        let servers = self.file.layout().servers.clone();
        for &i in which {
            self.finding(chunk_file_offset(r.file_at, i, r.k, r.unit), servers[i], why(i), false);
        }
    }

    /// An ec row whose every chunk read and passes its checksums: parity that disagrees with the data is rewritten
    /// from it, unless a data chunk ends early on its server (`short`), which is rebuilt when a chunk to spare
    /// confirms it, else reported.
    async fn ec_row_whole(
        &mut self,
        codec: &Codec,
        r: &RowAt,
        shards: Vec<Option<Vec<u8>>>,
        short: &[usize],
    ) -> Result<(), ClientError> {
        let (k, m) = (codec.k, codec.m);
        let data: Vec<&[u8]> = shards[..k].iter().map(|s| s.as_deref().expect("present")).collect();
        let parity = codec.encode(&data);
        let wrong: Vec<usize> =
            (0..m).filter(|&p| shards[k + p].as_deref() != Some(&parity[p][..])).map(|p| k + p).collect();
        if wrong.is_empty() {
            return Ok(());
        }
        let short_data: Vec<usize> = short.iter().copied().filter(|&i| i < k).collect();
        if short_data.is_empty() {
            // Data that passes its checksums is the truth: the disagreeing parity is rewritten from it.
            for i in wrong {
                let bytes = parity[i - k].clone();
                self.rewrite(i, r.at, r.file_at, bytes, "parity disagrees with the row's data").await?;
            }
            return Ok(());
        }
        // A data chunk ends early: its tail may be lost. Rebuild it from the others when a chunk to spare confirms
        // the result; otherwise the row is ambiguous.
        if short_data.len() < m {
            let mut trial = shards.clone();
            for &i in &short_data {
                trial[i] = None;
            }
            if codec.reconstruct(&mut trial).is_ok() {
                let data: Vec<&[u8]> = trial[..k].iter().map(|s| s.as_deref().expect("rebuilt")).collect();
                let re = codec.encode(&data);
                let consistent =
                    (0..m).all(|p| short_data.contains(&(k + p)) || trial[k + p].as_deref() == Some(&re[p][..]));
                if consistent {
                    for &i in &short_data {
                        if trial[i] != shards[i] {
                            let bytes = trial[i].take().expect("rebuilt");
                            self.rewrite(i, r.at, r.file_at, bytes, "bytes lost past the chunk's object end").await?;
                        }
                    }
                    return Ok(());
                }
            }
        }
        let why = |i: usize| {
            format!(
                "parity disagrees with the row, and data chunk {i} ends early on its server (lost bytes?): cannot \
                 tell which is right"
            )
        };
        self.chunk_findings(r, &short_data, why);
        Ok(())
    }

    /// An ec row with chunks `missing` (bad checksums): rebuilt from the rest, checked against any chunk to spare
    /// first.
    async fn ec_row_rebuild(
        &mut self,
        codec: &Codec,
        r: &RowAt,
        shards: Vec<Option<Vec<u8>>>,
        missing: &[usize],
    ) -> Result<(), ClientError> {
        let (k, m) = (codec.k, codec.m);
        let mut rebuilt = shards.clone();
        if let Err(e) = codec.reconstruct(&mut rebuilt) {
            self.finding(r.file_at, u32::MAX, format!("decoding the row failed: {e}"), false);
            return Ok(());
        }
        let data: Vec<&[u8]> = rebuilt[..k].iter().map(|s| s.as_deref().expect("rebuilt")).collect();
        let re = codec.encode(&data);
        if (0..m).any(|p| shards[k + p].as_ref().is_some_and(|s| s[..] != re[p][..])) {
            let why = |i: usize| {
                format!("{} fails its checksum and the surviving chunks disagree with each other", chunk_name(i, k))
            };
            self.chunk_findings(r, missing, why);
            return Ok(());
        }
        for &i in missing {
            let bytes = rebuilt[i].take().expect("rebuilt");
            debug_assert_eq!(bytes.len() as u64, r.unit);
            self.rewrite(i, r.at, r.file_at, bytes, "chunk fails its checksum").await?;
        }
        Ok(())
    }

    /// Rewrites chunk `i` of the row at object offset `at` with `bytes` (a whole stripe unit: whole checksum
    /// blocks, so no bad byte of a partly rewritten block is kept), or reports it in a dry run.
    async fn rewrite(
        &mut self,
        i: usize,
        at: u64,
        file_at: u64,
        bytes: Vec<u8>,
        what: &str,
    ) -> Result<(), ClientError> {
        let layout = &self.file.layout();
        let (k, _) = km(layout).expect("an ec layout");
        let server = layout.servers[i];
        let off = chunk_file_offset(file_at, i, k, u64::from(layout.stripe_unit));
        let chunk = chunk_name(i, k);
        if !self.opts.repair {
            self.dry(off, server, format!("{chunk}: {what}: not rewritten"));
            return Ok(());
        }
        // Through the versioned row path (§17), not a plain write: the chunk is rebuilt by the version rule from
        // the others and written compare-and-set with the row's parity, so its record vouches for its bytes and a
        // writer racing the scrub is never undone. `bytes` (what this scrub computed) must be what that yields.
        let _ = (at, bytes);
        let io = repair_io(self.file).await?;
        let (k, m) = km(layout).expect("an ec layout");
        let row = file_at / (u64::from(layout.stripe_unit) * k as u64);
        match crate::ec_rows::heal_row(self.file, &io, &Codec::new(k, m)?, row, i, self.file.size()).await {
            Ok(()) => self.finding(off, server, format!("{chunk}: {what}: rewritten"), true),
            Err(e) => self.finding(off, server, format!("{chunk}: {what}: rewriting failed: {e}"), false),
        }
        Ok(())
    }
}

/// How a finding names chunk `i` of a row: data chunk `j` or parity chunk `p`.
fn chunk_name(i: usize, k: usize) -> String {
    if i < k { format!("data chunk {i}") } else { format!("parity chunk {}", i - k) }
}

/// The file offset a chunk of the row at `file_at` stands for (a parity chunk: the row's start).
fn chunk_file_offset(file_at: u64, i: usize, k: usize, unit: u64) -> u64 {
    if i < k { file_at + i as u64 * unit } else { file_at }
}

/// Server `i`'s object of `layout` as a plain one-server file.
fn object_of(layout: &Layout, i: usize) -> Layout {
    Layout::plain(layout.stripe_unit, vec![layout.servers[i]])
}

/// `[w, w + len)` of a plain `layout` (one mirror copy), read block by block around the blocks in `bad` (which
/// read as zeros here: they are not compared).
async fn read_window(io: &Io, layout: &Layout, w: u64, len: u64, bad: &[u64]) -> Result<Vec<u8>, ClientError> {
    let mut out = vec![0u8; len as usize];
    let mut a = w;
    while a < w + len {
        // The next run of good blocks.
        while a < w + len && bad.contains(&a) {
            a += BLOCK_BYTES;
        }
        let mut b = a;
        while b < w + len && !bad.contains(&b) {
            b += BLOCK_BYTES;
        }
        if b > a {
            let got: BytesMut = read_on(io, layout, a, b - a).await?;
            out[(a - w) as usize..(b - w) as usize].copy_from_slice(&got);
        }
        a = b;
    }
    Ok(out)
}

/// Where one ec row of a scrubbed file is: `k` data chunks of `unit` bytes, at object offset `at` on each server
/// and file offset `file_at`.
struct RowAt {
    k: usize,
    unit: u64,
    at: u64,
    file_at: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_offsets_name_data_chunks_and_rows() {
        assert_eq!(chunk_file_offset(1 << 20, 2, 4, 65536), (1 << 20) + 2 * 65536);
        assert_eq!(chunk_file_offset(1 << 20, 5, 4, 65536), 1 << 20);
    }

    #[test]
    fn plain_offsets_map_back_to_the_file() {
        let l = Layout::plain(65536, vec![7, 8]);
        assert_eq!(plain_file_offset(&l, 1, 100), 65536 + 100);
        assert_eq!(plain_file_offset(&l, 0, 65536 + 5), 2 * 65536 + 5);
    }

    #[test]
    fn reports_count_and_keep_a_bounded_list() {
        let mut r = ScrubReport::default();
        for i in 0..FINDINGS_MAX + 5 {
            let f = Finding {
                path: "/f".into(),
                ino: 2,
                file_offset: i as u64,
                server: 1,
                what: "x".into(),
                repaired: i % 2 == 0,
                dry_run: false,
            };
            r.found(f);
        }
        assert_eq!(r.findings.len(), FINDINGS_MAX);
        assert_eq!(r.inconsistencies, (FINDINGS_MAX + 5) as u64);
        assert_eq!(r.repaired + r.unrepairable, r.inconsistencies);
    }
}
