//! Gathering an ec file's writes into whole stripe rows (issue 32): the pure state of what one open file holds
//! and what it must send, with no I/O (the caller, [`crate::ec`], sends the [`Job`]s it hands out).
//!
//! Why: a write that covers a row only partly pays a read–modify–write (the row's old chunks read, its parity
//! recomputed); a sequential writer's records rarely match a row (`k × unit`, 4 MiB for `ec 4+2` at the default
//! 1 MiB unit), so without gathering every `cp`, `dd` and checkpoint paid it on every record. HDFS's striped
//! output stream, Ceph's EC stripe cache and DAOS buffer whole stripes the same way.
//!
//! The rules:
//! - Bytes of a row are held (by reference: the writer's own buffers, sliced; pieces under
//!   [`HELD_COPY_BYTES_MAX`] are copied, so small writes pin no large buffers) until the row is whole; then it is
//!   handed out as a [`Job::Whole`] and encoded once, with no read.
//! - Whole rows (completed, or covered whole by one write) wait *ready* until a run of consecutive ones reaches
//!   [`WHOLE_RUN_BYTES`] (at the default unit one row is that much: it goes at once), so small units send several
//!   rows per request. A write to a ready row makes it held again.
//! - Bounded: past [`GATHER_ROWS_MAX`] rows or [`GATHER_BYTES_MAX`] bytes held, the row touched least recently is
//!   handed out as it is (and a row past [`HELD_SEGMENTS_MAX`] pieces at once) ([`Job::Partial`]: its runs of held bytes, each a read–modify–write), as are all rows at
//!   [`Gather::drain`] (fsync, close, a read, a truncate).
//! - A row handed out is *sending* until the caller reports it [`Gather::sent`]: a write touching it waits
//!   ([`Added::Wait`]), so bytes written later never land before bytes written earlier to the same row.
//!
//! Invariant: a row is held, ready or sending, never two of them; held rows are never whole, ready ones always.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use bytes::{Bytes, BytesMut};

/// Most rows one open file holds partly written.
pub(crate) const GATHER_ROWS_MAX: usize = 8;
/// Most bytes one open file holds (at least one row's bytes are held, whatever a row's size).
pub(crate) const GATHER_BYTES_MAX: u64 = 64 << 20;
/// Held pieces shorter than this are copied rather than referenced: a small write's buffer may be much larger than
/// the write (the FUSE mount's pooled write buffers have the capacity of its largest write), and a row of 4 KiB
/// writes would otherwise pin a thousand of them.
pub(crate) const HELD_COPY_BYTES_MAX: usize = 64 << 10;
/// Most separate pieces one held row keeps: a row written a byte here and there is handed out (read-modify-write)
/// at this many, so what a held row costs beyond its bytes stays bounded.
pub(crate) const HELD_SEGMENTS_MAX: usize = 4096;
/// Whole rows are handed out in runs of consecutive rows of at least this many bytes (one row at least): at small
/// stripe units a row write is three round trips for little data, and a run goes in requests of several rows.
pub(crate) const WHOLE_RUN_BYTES: u64 = 4 << 20;

/// Writes the caller sends now.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Job {
    /// Whole rows from `first` on: `k` chunks of `unit` bytes per row, row after row.
    Whole { first: u64, chunks: Vec<Bytes> },
    /// Row `row`, only partly held: its runs of held bytes as `(file offset, bytes)`, ascending, apart.
    Partial { row: u64, runs: Vec<(u64, Bytes)> },
}

impl Job {
    /// The rows this job writes.
    pub(crate) fn rows(&self, k: u64) -> Range<u64> {
        match self {
            Job::Whole { first, chunks } => *first..*first + chunks.len() as u64 / k,
            Job::Partial { row, .. } => *row..*row + 1,
        }
    }
}

/// What [`Gather::add`] decided.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Added {
    /// A row the write touches is being sent: wait until it is [`Gather::sent`], then add again.
    Wait,
    /// Held; send these jobs (possibly none), then report each [`Gather::sent`].
    Send(Vec<Job>),
}

/// One row's held bytes: non-overlapping segments by offset in the row.
#[derive(Default)]
struct Held {
    segs: BTreeMap<u64, Bytes>,
    bytes: u64,
    /// When it was last written to ([`Gather`]'s clock): the least recent is handed out first.
    touched: u64,
}

impl Held {
    /// A whole row's chunks (`unit` bytes each) as segments, to be written over.
    fn of_chunks(chunks: Vec<Bytes>, unit: u64) -> Held {
        let mut h = Held::default();
        for (j, c) in chunks.into_iter().enumerate() {
            h.keep(j as u64 * unit, c);
        }
        h
    }

    /// Puts `data` at row offset `at`, over whatever it overlaps (kept parts are slices: no copy).
    fn put(&mut self, at: u64, data: Bytes) {
        let end = at + data.len() as u64;
        let over: Vec<u64> =
            self.segs.range(..end).rev().take_while(|(s, b)| **s + b.len() as u64 > at).map(|(s, _)| *s).collect();
        for s in over {
            let b = self.segs.remove(&s).expect("listed above");
            self.bytes -= b.len() as u64;
            let e = s + b.len() as u64;
            if s < at {
                self.keep(s, b.slice(..(at - s) as usize));
            }
            if e > end {
                self.keep(end, b.slice((end - s) as usize..));
            }
        }
        self.keep(at, data);
    }

    fn keep(&mut self, at: u64, b: Bytes) {
        self.bytes += b.len() as u64;
        let old = self.segs.insert(at, b);
        debug_assert!(old.is_none(), "segments do not overlap");
    }

    /// The bytes of row offsets `[lo, hi)`, all held: a slice when one segment holds them, else a copy.
    fn span(&self, lo: u64, hi: u64) -> Bytes {
        let (s, b) = self.segs.range(..=lo).next_back().expect("the span is held");
        if s + b.len() as u64 >= hi {
            return b.slice((lo - s) as usize..(hi - s) as usize);
        }
        let mut out = BytesMut::with_capacity((hi - lo) as usize);
        for (s, b) in self.segs.range(*s..hi) {
            let from = lo.saturating_sub(*s) as usize;
            let to = ((hi - s) as usize).min(b.len());
            out.extend_from_slice(&b[from..to]);
        }
        assert_eq!(out.len() as u64, hi - lo, "a span of held bytes has no gap");
        out.freeze()
    }

    /// Runs of adjacent segments: `(row offset, bytes)`, a copy only where a run has several segments.
    fn runs(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for (s, b) in &self.segs {
            let e = s + b.len() as u64;
            match out.last_mut() {
                Some((_, end)) if *end == *s => *end = e,
                _ => out.push((*s, e)),
            }
        }
        out
    }
}

/// What one open ec file holds of its writes, and which rows are being sent.
pub(crate) struct Gather {
    unit: u64,
    k: u64,
    held: BTreeMap<u64, Held>,
    held_bytes: u64,
    /// Whole rows not handed out yet: `k` chunks each.
    ready: BTreeMap<u64, Vec<Bytes>>,
    sending: BTreeSet<u64>,
    clock: u64,
    rows_max: usize,
    bytes_max: u64,
    /// Rows per run of whole rows handed out together.
    run_rows: usize,
    /// Held pieces shorter than this are copied ([`HELD_COPY_BYTES_MAX`]).
    copy_below: usize,
}

impl Gather {
    /// For rows of `k` chunks of `unit` bytes, with the default bounds.
    pub(crate) fn new(unit: u64, k: u64) -> Gather {
        let run_rows = (WHOLE_RUN_BYTES / (unit * k)).max(1) as usize;
        Gather {
            copy_below: HELD_COPY_BYTES_MAX,
            ..Gather::with_bounds(unit, k, GATHER_ROWS_MAX, GATHER_BYTES_MAX, run_rows)
        }
    }

    pub(crate) fn with_bounds(unit: u64, k: u64, rows_max: usize, bytes_max: u64, run_rows: usize) -> Gather {
        assert!(unit > 0 && k > 0 && rows_max > 0 && run_rows > 0, "a row has bytes, and one may be held");
        let (held, ready, sending) = (BTreeMap::new(), BTreeMap::new(), BTreeSet::new());
        Gather { unit, k, held, held_bytes: 0, ready, sending, clock: 0, rows_max, bytes_max, run_rows, copy_below: 0 }
    }

    fn row_bytes(&self) -> u64 {
        self.unit * self.k
    }

    /// Nothing held and nothing being sent.
    pub(crate) fn is_idle(&self) -> bool {
        self.holds_nothing() && self.sending.is_empty()
    }

    /// Nothing held nor ready (rows may still be being sent).
    pub(crate) fn holds_nothing(&self) -> bool {
        self.held.is_empty() && self.ready.is_empty()
    }

    /// Takes a write of `data` at file offset `offset`.
    pub(crate) fn add(&mut self, offset: u64, data: &Bytes) -> Added {
        if data.is_empty() {
            return Added::Send(Vec::new());
        }
        let rb = self.row_bytes();
        let end = offset + data.len() as u64;
        let rows = offset / rb..(end - 1) / rb + 1;
        if self.sending.range(rows.clone()).next().is_some() {
            return Added::Wait;
        }
        self.clock += 1;
        let mut whole: Vec<(u64, Vec<Bytes>)> = Vec::new();
        let mut crowded = Vec::new();
        for r in rows {
            let (lo, hi) = ((r * rb).max(offset), ((r + 1) * rb).min(end));
            let piece = data.slice((lo - offset) as usize..(hi - offset) as usize);
            if hi - lo == rb && !self.held.contains_key(&r) {
                self.ready.remove(&r);
                whole.push((r, self.chunks_of(&piece)));
                continue;
            }
            if let Some(chunks) = self.ready.remove(&r) {
                self.held.insert(r, Held::of_chunks(chunks, self.unit));
                self.held_bytes += rb;
            }
            let piece = if piece.len() < self.copy_below { Bytes::copy_from_slice(&piece) } else { piece };
            let h = self.held.entry(r).or_default();
            let before = h.bytes;
            h.put(lo - r * rb, piece);
            h.touched = self.clock;
            self.held_bytes = self.held_bytes - before + h.bytes;
            if h.bytes == rb {
                let h = self.held.remove(&r).expect("just put");
                self.held_bytes -= h.bytes;
                whole.push((r, (0..self.k).map(|j| h.span(j * self.unit, (j + 1) * self.unit)).collect()));
            } else if h.segs.len() > HELD_SEGMENTS_MAX {
                crowded.push(r);
            }
        }
        self.ready.extend(whole);
        let mut jobs = self.hand_out_runs(false);
        jobs.extend(crowded.into_iter().map(|r| self.hand_out(r)));
        while self.held.len() > self.rows_max || (self.held_bytes > self.bytes_max && self.held.len() > 1) {
            let oldest = *self.held.iter().min_by_key(|(_, h)| h.touched).expect("rows are held").0;
            jobs.push(self.hand_out(oldest));
        }
        for j in &jobs {
            self.sending.extend(j.rows(self.k));
        }
        self.check();
        Added::Send(jobs)
    }

    /// Every held row, handed out as it is (they are all partial: whole rows are never held), and every ready one.
    pub(crate) fn drain(&mut self) -> Vec<Job> {
        let rows: Vec<u64> = self.held.keys().copied().collect();
        let mut jobs: Vec<Job> = rows.into_iter().map(|r| self.hand_out(r)).collect();
        jobs.extend(self.hand_out_runs(true));
        for j in &jobs {
            self.sending.extend(j.rows(self.k));
        }
        self.check();
        jobs
    }

    /// The caller has sent (or failed to send) `job`'s rows: writes to them go on.
    pub(crate) fn sent(&mut self, rows: Range<u64>) {
        for r in rows {
            let was = self.sending.remove(&r);
            assert!(was, "row {r} reported sent was not being sent");
        }
    }

    /// Ready rows as jobs of consecutive rows: every run of at least `run_rows` rows, or with `all` (or past twice
    /// that many ready) every run.
    fn hand_out_runs(&mut self, all: bool) -> Vec<Job> {
        let per = self.run_rows;
        let all = all || self.ready.len() > 2 * per;
        let mut runs: Vec<Vec<u64>> = Vec::new();
        for &r in self.ready.keys() {
            match runs.last_mut() {
                Some(run) if *run.last().expect("non-empty") + 1 == r => run.push(r),
                _ => runs.push(vec![r]),
            }
        }
        let ready = &mut self.ready;
        let runs = runs.into_iter().filter(|run| all || run.len() >= per);
        runs.map(|run| Job::Whole {
            first: run[0],
            chunks: run.iter().flat_map(|r| ready.remove(r).expect("ready")).collect(),
        })
        .collect()
    }

    fn hand_out(&mut self, row: u64) -> Job {
        let h = self.held.remove(&row).expect("a held row");
        self.held_bytes -= h.bytes;
        let base = row * self.row_bytes();
        let runs = h.runs().into_iter().map(|(lo, hi)| (base + lo, h.span(lo, hi))).collect();
        Job::Partial { row, runs }
    }

    /// A whole row's `k` chunks, sliced from one buffer that holds it.
    fn chunks_of(&self, row: &Bytes) -> Vec<Bytes> {
        let u = self.unit as usize;
        (0..self.k as usize).map(|j| row.slice(j * u..(j + 1) * u)).collect()
    }

    fn check(&self) {
        debug_assert_eq!(self.held_bytes, self.held.values().map(|h| h.bytes).sum::<u64>(), "held bytes add up");
        debug_assert!(self.held.keys().all(|r| !self.sending.contains(r)), "a row is held or sending, not both");
        debug_assert!(
            self.ready.keys().all(|r| !self.sending.contains(r) && !self.held.contains_key(r)),
            "a ready row is neither held nor sending"
        );
        debug_assert!(self.held.values().all(|h| h.bytes < self.row_bytes() && h.bytes > 0), "held rows are partial");
        debug_assert!(self.held.values().all(|h| h.segs.len() <= HELD_SEGMENTS_MAX), "held rows have bounded pieces");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(seed: u8, n: usize) -> Bytes {
        Bytes::from((0..n).map(|i| seed.wrapping_add(i as u8)).collect::<Vec<u8>>())
    }

    fn jobs(a: Added) -> Vec<Job> {
        match a {
            Added::Send(j) => j,
            Added::Wait => panic!("unexpected wait"),
        }
    }

    /// The file bytes a job writes, `(offset, bytes)`.
    fn written(j: &Job, unit: u64, k: u64) -> Vec<(u64, Vec<u8>)> {
        match j {
            Job::Whole { first, chunks } => {
                let mut all = Vec::new();
                chunks.iter().for_each(|c| all.extend_from_slice(c));
                vec![(first * unit * k, all)]
            }
            Job::Partial { runs, .. } => runs.iter().map(|(o, b)| (*o, b.to_vec())).collect(),
        }
    }

    #[test]
    fn sequential_records_make_whole_rows_with_no_copy_when_aligned_to_chunks() {
        let mut g = Gather::with_bounds(4, 2, 8, 64, 1); // rows of 8 bytes, sent one by one
        let src = bytes(1, 16);
        assert_eq!(jobs(g.add(0, &src.slice(0..4))), vec![]);
        let j = jobs(g.add(4, &src.slice(4..8)));
        assert_eq!(j, vec![Job::Whole { first: 0, chunks: vec![src.slice(0..4), src.slice(4..8)] }]);
        // The chunks are the writer's buffers, not copies.
        let Job::Whole { chunks, .. } = &j[0] else { unreachable!() };
        assert_eq!(chunks[0].as_ptr(), src.slice(0..4).as_ptr());
        assert!(!g.is_idle(), "row 0 is being sent");
        assert_eq!(g.add(2, &bytes(9, 1)), Added::Wait, "a write to a row being sent waits");
        g.sent(0..1);
        assert!(g.is_idle());
    }

    #[test]
    fn small_and_unaligned_records_are_copied_into_whole_chunks() {
        let mut g = Gather::with_bounds(4, 2, 8, 64, 1);
        let src = bytes(7, 24);
        let mut out = Vec::new();
        // Records of 3 bytes: rows 0, 1 and 2 complete at offsets 8, 16, 24.
        for at in (0..24).step_by(3) {
            out.extend(jobs(g.add(at, &src.slice(at as usize..at as usize + 3))));
        }
        let got: Vec<(u64, Vec<u8>)> = out.iter().flat_map(|j| written(j, 4, 2)).collect();
        let rows: Vec<u64> = out.iter().map(|j| j.rows(2).start).collect();
        assert_eq!(rows, vec![0, 1, 2]);
        for (o, b) in got {
            assert_eq!(b, src[o as usize..o as usize + 8].to_vec());
        }
    }

    #[test]
    fn a_write_of_whole_rows_goes_at_once_and_its_ragged_ends_are_held() {
        let mut g = Gather::with_bounds(4, 2, 8, 64, 1);
        let src = bytes(3, 28);
        // [2, 30): row 0 partly (held), rows 1 and 2 whole (sent), row 3 partly (held).
        let j = jobs(g.add(2, &src));
        assert_eq!(j.len(), 1);
        assert_eq!(j[0].rows(2), 1..3);
        assert_eq!(written(&j[0], 4, 2), vec![(8, src[6..22].to_vec())]);
        g.sent(1..3);
        let mut d = g.drain();
        d.sort_by_key(|j| j.rows(2).start);
        assert_eq!(written(&d[0], 4, 2), vec![(2, src[..6].to_vec())]);
        assert_eq!(written(&d[1], 4, 2), vec![(24, src[22..].to_vec())]);
    }

    #[test]
    fn overwrites_inside_a_held_row_keep_the_last_bytes() {
        let mut g = Gather::with_bounds(4, 2, 8, 64, 1);
        assert_eq!(jobs(g.add(0, &Bytes::from_static(b"aaaaaa"))), vec![]);
        assert_eq!(jobs(g.add(2, &Bytes::from_static(b"bb"))), vec![]);
        assert_eq!(jobs(g.add(1, &Bytes::from_static(b"c"))), vec![]);
        let j = jobs(g.add(5, &Bytes::from_static(b"ddd")));
        assert_eq!(written(&j[0], 4, 2), vec![(0, b"acbbaddd".to_vec())]);
    }

    #[test]
    fn whole_rows_go_in_runs_and_a_write_to_a_ready_row_holds_it_again() {
        let mut g = Gather::with_bounds(4, 2, 8, 1 << 20, 3); // runs of 3 rows of 8 bytes
        let src = bytes(5, 40);
        assert_eq!(jobs(g.add(8, &src.slice(8..24))), vec![], "rows 1 and 2 wait for a third");
        assert_eq!(jobs(g.add(33, &Bytes::from_static(b"z"))), vec![], "row 4 partly");
        let j = jobs(g.add(24, &src.slice(24..32)));
        assert_eq!(j.iter().map(|j| j.rows(2)).collect::<Vec<_>>(), vec![1..4], "rows 1–3 in one job");
        g.sent(1..4);
        assert_eq!(jobs(g.add(0, &src.slice(0..8))), vec![], "row 0 alone waits");
        assert_eq!(jobs(g.add(3, &Bytes::from_static(b"q"))), vec![], "a write to ready row 0");
        let mut d = g.drain();
        d.sort_by_key(|j| j.rows(2).start);
        let mut want = src[0..8].to_vec();
        want[3] = b'q';
        assert_eq!(written(&d[0], 4, 2), vec![(0, want)], "row 0 whole again, with the new byte");
        assert_eq!(d[1].rows(2), 4..5);
    }

    #[test]
    fn small_held_pieces_are_copied_and_large_ones_referenced() {
        let mut g = Gather::new(1 << 20, 4);
        let (small, large) = (bytes(1, 4096), bytes(2, HELD_COPY_BYTES_MAX));
        assert_eq!(jobs(g.add(0, &small)), vec![]);
        assert_eq!(jobs(g.add(4096, &large)), vec![]);
        let Job::Partial { runs, .. } = &g.drain()[0] else { panic!("a partial row") };
        assert_eq!(runs.len(), 1);
        assert_eq!(&runs[0].1[..4096], &small[..]);
        assert_eq!(&runs[0].1[4096..], &large[..]);
        // Apart (a gap between them), each piece is a run of its own: the large one the writer's buffer itself.
        let mut g = Gather::new(1 << 20, 4);
        assert_eq!(jobs(g.add(8192, &large)), vec![]);
        assert_eq!(jobs(g.add(0, &small)), vec![]);
        let d = g.drain();
        let Job::Partial { runs, .. } = &d[0] else { panic!("a partial row") };
        assert_eq!(runs[1].1.as_ptr(), large.as_ptr(), "a large piece is the writer's buffer");
        assert_ne!(runs[0].1.as_ptr(), small.as_ptr(), "a small one is a copy");
    }

    #[test]
    fn a_row_written_a_byte_here_and_there_is_handed_out_at_its_piece_bound() {
        let mut g = Gather::new(16 << 10, 1);
        let one = Bytes::from_static(b"x");
        for i in 0..HELD_SEGMENTS_MAX as u64 {
            assert_eq!(jobs(g.add(2 * i, &one)), vec![], "piece {i} held");
        }
        let j = jobs(g.add(2 * HELD_SEGMENTS_MAX as u64, &one));
        assert_eq!(j.len(), 1, "the row past its bound is handed out");
        let Job::Partial { row: 0, runs } = &j[0] else { panic!("row 0, partial") };
        assert_eq!(runs.len(), HELD_SEGMENTS_MAX + 1);
        g.sent(0..1);
        assert!(g.is_idle());
    }

    #[test]
    fn gaps_are_handed_out_as_separate_runs() {
        let mut g = Gather::with_bounds(4, 2, 8, 64, 1);
        assert_eq!(jobs(g.add(9, &Bytes::from_static(b"xy"))), vec![]);
        assert_eq!(jobs(g.add(13, &Bytes::from_static(b"z"))), vec![]);
        assert_eq!(jobs(g.add(11, &Bytes::from_static(b"w"))), vec![]);
        let d = g.drain();
        assert_eq!(d, vec![Job::Partial { row: 1, runs: vec![(9, Bytes::from_static(b"xyw")), (13, "z".into())] }]);
        assert_eq!(g.add(10, &Bytes::from_static(b"q")), Added::Wait);
        g.sent(1..2);
        assert!(g.is_idle());
    }

    #[test]
    fn past_its_bounds_the_least_recently_written_row_is_handed_out() {
        let mut g = Gather::with_bounds(4, 2, 2, 1 << 20, 1);
        assert_eq!(jobs(g.add(0, &bytes(0, 1))), vec![]);
        assert_eq!(jobs(g.add(8, &bytes(0, 1))), vec![]);
        assert_eq!(jobs(g.add(1, &bytes(0, 1))), vec![], "row 0 is now the most recent");
        let j = jobs(g.add(16, &bytes(0, 1)));
        assert_eq!(j.iter().map(|j| j.rows(2).start).collect::<Vec<_>>(), vec![1]);
        // By bytes: at most 3 held bytes, and at least one row always held.
        let mut g = Gather::with_bounds(4, 2, 8, 3, 1);
        assert_eq!(jobs(g.add(0, &bytes(0, 5))), vec![], "one row over the byte bound stays");
        let j = jobs(g.add(8, &bytes(0, 1)));
        assert_eq!(j.iter().map(|j| j.rows(2).start).collect::<Vec<_>>(), vec![0]);
    }

    /// Random writes against a model: whatever the order of adds, drains and sends, the bytes handed out, applied
    /// in order, are the bytes written, and nothing stays held after a drain.
    #[test]
    fn random_writes_hand_out_exactly_what_was_written() {
        for seed in 0..200u64 {
            let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut next = |n: u64| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng % n
            };
            let (unit, k) = (1 + next(5), 1 + next(4));
            let mut g = Gather::with_bounds(unit, k, 1 + next(3) as usize, 1 + next(40), 1 + next(3) as usize);
            let size = 64u64;
            let (mut model, mut disk) = (vec![0u8; size as usize], vec![0u8; size as usize]);
            for step in 0..60u8 {
                let at = next(size - 1);
                let len = 1 + next((size - at).min(20));
                let data = bytes(step.wrapping_mul(31), len as usize);
                model[at as usize..(at + len) as usize].copy_from_slice(&data);
                let js = match g.add(at, &data) {
                    Added::Send(js) => js,
                    Added::Wait => unreachable!("every job is sent before the next add"),
                };
                let drained = if next(4) == 0 { g.drain() } else { Vec::new() };
                for j in js.iter().chain(&drained) {
                    for (o, b) in written(j, unit, k) {
                        disk[o as usize..o as usize + b.len()].copy_from_slice(&b);
                    }
                    g.sent(j.rows(k));
                }
            }
            for j in g.drain() {
                for (o, b) in written(&j, unit, k) {
                    disk[o as usize..o as usize + b.len()].copy_from_slice(&b);
                }
                g.sent(j.rows(k));
            }
            assert!(g.is_idle(), "seed {seed}");
            assert_eq!(disk, model, "seed {seed}");
        }
    }
}
