//! Tests of the journal framing, the redo records and the recovery scan (torn tails, damage in the middle, LSN
//! gaps, recycled segments), and of replay through `RedbStore` (determinism, checkpoints, back-pressure).

use super::*;

const SEG: u64 = 7;

/// A segment `seq` holding entries `(lsn, synced_lsn, payload)`, then `slack` zero bytes.
fn segment(seq: u64, entries: &[(u64, u64, &[u8])], slack: usize) -> Vec<u8> {
    let first = entries.first().map_or(1, |e| e.0);
    let mut out = encode_seg_header(seq, first).to_vec();
    for &(lsn, synced, payload) in entries {
        encode_entry(&mut out, seq, lsn, synced, payload);
    }
    out.resize(out.len() + slack, 0);
    out
}

fn lsns(r: &ScanResult) -> Vec<u64> {
    r.replay.iter().map(|e| e.lsn).collect()
}

/// Byte offset of entry `i` (0-based) in a segment built by `segment` with `payload_len`-byte payloads.
fn entry_off(i: usize, payload_len: usize) -> usize {
    SEG_HEADER_BYTES + i * (ENTRY_HEADER_BYTES + payload_len)
}

#[test]
fn entries_round_trip_and_reject_damage() {
    let mut buf = Vec::new();
    encode_entry(&mut buf, SEG, 42, 40, b"payload");
    let (e, n) = decode_entry(&buf, SEG).unwrap();
    assert_eq!((e.lsn, e.synced_lsn, e.payload, n), (42, 40, &b"payload"[..], buf.len()));
    assert_eq!(decode_entry(&buf, SEG + 1), Err(EntryError::OtherSegment));
    assert_eq!(decode_entry(&buf[..buf.len() - 1], SEG), Err(EntryError::Short));
    assert_eq!(decode_entry(&buf[..10], SEG), Err(EntryError::Short));
    assert_eq!(decode_entry(&[0u8; 100], SEG), Err(EntryError::Zeros));
    assert_eq!(decode_entry(&[0u8; 3], SEG), Err(EntryError::Zeros));
    for i in 4..buf.len() {
        let mut bad = buf.clone();
        bad[i] ^= 0x10;
        assert!(decode_entry(&bad, SEG).is_err(), "a flipped bit at {i} went unnoticed");
    }
    let mut bad = buf.clone();
    bad[0] = b'X';
    assert_eq!(decode_entry(&bad, SEG), Err(EntryError::BadMagic));
    let mut huge = buf.clone();
    huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(decode_entry(&huge, SEG), Err(EntryError::TooLong));
}

#[test]
fn segment_headers_round_trip() {
    let h = encode_seg_header(9, 1234);
    assert_eq!(decode_seg_header(&h).unwrap(), Some((9, 1234)));
    assert_eq!(decode_seg_header(&[0u8; 64]).unwrap(), None);
    assert_eq!(decode_seg_header(&h[..10]).unwrap(), None);
    let mut bad = h;
    bad[12] ^= 1;
    assert!(decode_seg_header(&bad).is_err());
}

#[test]
fn redo_records_round_trip_and_reject_garbage() {
    let records = [
        Redo::PutInode { ino: 5, record: b"\x01abc" },
        Redo::DelInode { ino: 6 },
        Redo::PutDirent { parent: 1, name: "héllo", ino: 5, kind: 0 },
        Redo::DelDirent { parent: 1, name: "" },
        Redo::PutServer { id: 3, addr: "127.0.0.1:9" },
        Redo::PutServerPhase { id: 3, phase: 4 },
        Redo::PutOrphan { ino: 6, record: b"" },
        Redo::DelOrphan { ino: 6 },
        Redo::PutCounter { key: 1, value: u64::MAX },
        Redo::PutXattr { ino: 7, name: "user.x", value: b"\0v" },
        Redo::PutXattr { ino: 7, name: "user.empty", value: b"" },
        Redo::DelXattr { ino: 7, name: "user.x" },
    ];
    let mut buf = Vec::new();
    for r in &records {
        encode_redo(&mut buf, r);
    }
    assert_eq!(decode_redo(&buf).unwrap(), records);
    // Every proper prefix that cuts a record is refused, never half-applied.
    let whole = decode_redo(&buf).unwrap().len();
    for cut in 0..buf.len() {
        if let Ok(v) = decode_redo(&buf[..cut]) {
            assert!(v.len() < whole);
        }
    }
    assert!(decode_redo(&[99]).is_err());
    // A name that is not UTF-8.
    let mut bad = Vec::new();
    encode_redo(&mut bad, &Redo::DelDirent { parent: 1, name: "ab" });
    let n = bad.len();
    bad[n - 1] = 0xff;
    assert!(decode_redo(&bad).is_err());
}

#[test]
fn scan_replays_after_the_checkpoint_in_order() {
    let s = segment(SEG, &[(1, 0, b"a"), (2, 0, b"b"), (3, 1, b"c"), (4, 3, b"d")], 500);
    assert_eq!(lsns(&scan(&[(SEG, &s)], 0).unwrap()), [1, 2, 3, 4]);
    assert_eq!(lsns(&scan(&[(SEG, &s)], 2).unwrap()), [3, 4]);
    assert_eq!(lsns(&scan(&[(SEG, &s)], 4).unwrap()), Vec::<u64>::new());
    let r = scan(&[(SEG, &s)], 3).unwrap();
    assert_eq!(&s[r.replay[0].range.clone()], b"d");
    // Across segments: a segment's unused zeros before the next segment are not a tail.
    let t = segment(SEG + 1, &[(5, 4, b"e"), (6, 4, b"f")], 100);
    assert_eq!(lsns(&scan(&[(SEG, &s), (SEG + 1, &t)], 2).unwrap()), [3, 4, 5, 6]);
    // Nothing at all.
    assert_eq!(scan(&[], 17).unwrap(), ScanResult::default());
}

#[test]
fn a_torn_tail_is_dropped() {
    let full = segment(SEG, &[(1, 0, b"aaaa"), (2, 1, b"bbbb"), (3, 1, b"cccc")], 0);
    // Cut anywhere inside entry 3: entries 1 and 2 survive.
    for cut in entry_off(2, 4) + 1..full.len() {
        let r = scan(&[(SEG, &full[..cut])], 0).unwrap();
        assert_eq!(lsns(&r), [1, 2], "cut at {cut}");
    }
    // A bad CRC in the last entry.
    let mut bad = full.clone();
    let n = bad.len();
    bad[n - 1] ^= 1;
    assert_eq!(lsns(&scan(&[(SEG, &bad)], 0).unwrap()), [1, 2]);
    // Power loss mid-batch: entry 2 torn, entry 3 (written in the same unsynced batch, synced_lsn 1) intact.
    let mut torn = full.clone();
    torn[entry_off(1, 4) + ENTRY_HEADER_BYTES] ^= 1;
    let r = scan(&[(SEG, &torn)], 0).unwrap();
    assert_eq!((lsns(&r), r.dropped), (vec![1], 1));
}

#[test]
fn a_damaged_acknowledged_entry_followed_by_good_ones_is_refused() {
    // Entry 3 says entry 2 was durable when it was written: losing 2 would lose an acknowledged change.
    let mut s = segment(SEG, &[(1, 0, b"aaaa"), (2, 1, b"bbbb"), (3, 2, b"cccc")], 64);
    s[entry_off(1, 4) + ENTRY_HEADER_BYTES + 1] ^= 0x40;
    let err = scan(&[(SEG, &s)], 0).unwrap_err();
    assert!(err.to_string().contains("entry 2 is damaged"), "{err}");
    // Even when the damage hits the length field (the scan resynchronises on the next entry).
    let mut s = segment(SEG, &[(1, 0, b"aaaa"), (2, 1, b"bbbb"), (3, 2, b"cccc")], 64);
    s[entry_off(1, 4) + 5] = 0x7f;
    assert!(scan(&[(SEG, &s)], 0).is_err());
    // Or when the good entry is in the next segment.
    let mut s = segment(SEG, &[(1, 0, b"aaaa"), (2, 1, b"bbbb")], 64);
    s[entry_off(1, 4) + ENTRY_HEADER_BYTES] ^= 1;
    let t = segment(SEG + 1, &[(3, 2, b"c")], 0);
    assert!(scan(&[(SEG, &s), (SEG + 1, &t)], 0).is_err());
    // Damage already covered by the checkpoint does not matter.
    assert_eq!(lsns(&scan(&[(SEG, &s), (SEG + 1, &t)], 2).unwrap()), [3]);
}

#[test]
fn lsn_gaps_are_corruption() {
    let s = segment(SEG, &[(1, 0, b"a"), (2, 1, b"b"), (4, 2, b"d")], 0);
    let err = scan(&[(SEG, &s)], 0).unwrap_err();
    assert!(err.to_string().contains("LSN 4 follows 2"), "{err}");
    // A journal that starts after the checkpoint's LSN + 1 lost entries too.
    let s = segment(SEG, &[(5, 4, b"e")], 0);
    assert!(scan(&[(SEG, &s)], 3).is_err());
    // Going backwards.
    let s = segment(SEG, &[(1, 0, b"a"), (2, 1, b"b"), (2, 1, b"b")], 0);
    assert!(scan(&[(SEG, &s)], 0).is_err());
    // A segment missing between two others.
    let a = segment(SEG, &[(1, 0, b"a")], 10);
    let c = segment(SEG + 2, &[(3, 2, b"c")], 10);
    assert!(scan(&[(SEG, &a), (SEG + 2, &c)], 0).is_err());
}

#[test]
fn stale_entries_of_a_recycled_segment_are_ignored() {
    // The file held segment 3 with entries 1..=6; it was recycled as segment 9 and only entries 10, 11 written.
    let mut file = segment(3, &[(1, 0, b"old-1"), (2, 1, b"old-2"), (3, 2, b"old-3"), (4, 3, b"old-4")], 0);
    let new = segment(9, &[(10, 9, b"n"), (11, 10, b"m")], 0);
    file[..new.len()].copy_from_slice(&new);
    let r = scan(&[(9, &file)], 9).unwrap();
    assert_eq!((lsns(&r), r.dropped), (vec![10, 11], 0));
}

#[test]
fn scan_never_panics_on_garbage() {
    let s = segment(SEG, &[(1, 0, b"aaaa"), (2, 1, b"bbbb"), (3, 2, b"cccc")], 40);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..2000 {
        let mut d = s.clone();
        for _ in 0..3 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let i = (x as usize) % d.len();
            d[i] = (x >> 32) as u8;
        }
        let cut = (x as usize >> 8) % (d.len() + 1);
        let _ = scan(&[(SEG, &d[..cut])], (x >> 40) % 4);
    }
}

// ---- Through RedbStore -----------------------------------------------------------------------------------------

use crate::RedbStore;
use crate::store::{Inode, MetaStore};
use weft_proto::FileKind;

struct TempDir(PathBuf);
impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("weft-journal-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        TempDir(p)
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn small() -> JournalConfig {
    JournalConfig {
        segment_bytes: 64 << 10,
        journal_bytes_max: 256 << 10,
        checkpoint_bytes: 128 << 10,
        checkpoint_interval_ms: 3_600_000,
    }
}

fn inode(ino: u64, size: u64) -> Inode {
    Inode {
        ino,
        kind: FileKind::File,
        mode: 0o644,
        uid: 1,
        gid: 2,
        nlink: 1,
        size,
        atime_ns: 0,
        mtime_ns: 0,
        ctime_ns: 0,
        parent: 0,
        layout: None,
        target: String::new(),
        rdev: 0,
        data_version: 1,
        sole_name: Some((1, format!("f{ino}"))),
    }
}

/// Every table's content, for comparing stores.
fn dump(s: &RedbStore) -> String {
    s.read(|t| {
        let mut out = format!("inodes {} ", t.count_inodes()?);
        out += &format!("{:?} ", t.list_dirents(1, "", usize::MAX)?);
        for (_, ino, _) in t.list_dirents(1, "", usize::MAX)? {
            out += &format!("{:?} ", t.get_inode(ino)?);
        }
        out += &format!("{:?} {:?} {:?}", t.list_servers()?, t.list_server_phases()?, t.list_orphans(usize::MAX)?);
        Ok::<_, MetaError>(out)
    })
    .unwrap()
}

/// A deterministic mix of every mutation.
fn workload(s: &RedbStore, n: u64) {
    s.write(|t| t.put_server(1, "a:1")).unwrap();
    s.write(|t| t.put_server_phase(1, 3)).unwrap();
    for i in 0..n {
        s.write(|t| {
            let ino = t.next_ino()?;
            t.put_inode(&inode(ino, i))?;
            t.put_dirent(1, &format!("f{i:05}"), ino, FileKind::File)
        })
        .unwrap();
        if i % 3 == 0 {
            s.write(|t| {
                let (ino, _) = t.get_dirent(1, &format!("f{i:05}"))?.expect("just created");
                t.del_dirent(1, &format!("f{i:05}"))?;
                t.del_inode(ino)?;
                t.put_orphan(
                    ino,
                    &weft_proto::Layout {
                        stripe_unit: 1 << 16,
                        stripe_count: 1,
                        servers: vec![1],
                        redundancy: weft_proto::DataRedundancy::Plain,
                        generation: 0,
                    },
                )
            })
            .unwrap();
        }
        if i % 9 == 0 {
            s.write(|t| match t.list_orphans(1)?.first() {
                Some((ino, _)) => t.del_orphan(*ino),
                None => Ok(()),
            })
            .unwrap();
        }
    }
}

/// Copies a store directory as a crash would leave it: taken while the store is open, so redb's file holds only
/// its last durable commit's state (plus whatever non-durable pages) and the journal what was synced.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to.join("journal")).unwrap();
    std::fs::copy(from.join("meta.redb"), to.join("meta.redb")).unwrap();
    for e in std::fs::read_dir(from.join("journal")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, to.join("journal").join(p.file_name().unwrap())).unwrap();
    }
}

#[test]
fn replay_rebuilds_exactly_what_was_acknowledged() {
    let dir = TempDir::new("replay");
    let crashed = TempDir::new("replay-crashed");
    let want;
    // No checkpoint by size during the run, so the copy below races with nothing.
    let cfg = JournalConfig { journal_bytes_max: 64 << 20, checkpoint_bytes: 32 << 20, ..small() };
    {
        let s = RedbStore::open_with(&dir.0, cfg.clone()).unwrap();
        workload(&s, 600);
        want = dump(&s);
        // Snapshot without a checkpoint since open: everything must come back from the journal.
        copy_dir(&dir.0, &crashed.0);
        let (bytes, segments) = s.journal_usage().unwrap();
        assert!(segments > 1 && bytes > 64 << 10, "the workload should span segments ({bytes} B, {segments})");
    }
    let s = RedbStore::open_with(&crashed.0, cfg.clone()).unwrap();
    assert_eq!(dump(&s), want);
    // Replay is deterministic: the same journal replayed again yields the same state.
    drop(s);
    let again = TempDir::new("replay-again");
    copy_dir(&crashed.0, &again.0);
    assert_eq!(dump(&RedbStore::open_with(&again.0, cfg).unwrap()), want);
}

#[test]
fn checkpoints_free_segments_and_back_pressure_bounds_the_journal() {
    let dir = TempDir::new("bounded");
    let cfg = small();
    let s = RedbStore::open_with(&dir.0, cfg.clone()).unwrap();
    let big = vec![b'x'; 8 << 10];
    for i in 0..200u64 {
        s.write(|t| t.put_inode(&Inode { target: String::from_utf8(big.clone()).unwrap(), ..inode(i + 10, i) }))
            .unwrap();
        let (bytes, _) = s.journal_usage().unwrap();
        // Writers wait for a checkpoint at the limit; one transaction may overshoot it.
        assert!(bytes <= cfg.journal_bytes_max + (16 << 10), "journal grew to {bytes} B");
    }
    s.checkpoint().unwrap();
    let (bytes, segments) = s.journal_usage().unwrap();
    assert_eq!(segments, 1, "a checkpoint covering everything leaves only the active segment ({bytes} B)");
    let files = std::fs::read_dir(dir.0.join("journal")).unwrap().count();
    assert!(files <= 1 + SPARES_MAX + 1, "{files} journal files left");
    assert_eq!(s.read(|t| t.count_inodes()).unwrap(), 200);
    drop(s);
    let s = RedbStore::open_with(&dir.0, cfg).unwrap();
    assert_eq!(s.read(|t| t.get_inode(209)).unwrap().unwrap().size, 199);
}

#[test]
fn a_store_refuses_to_open_over_a_damaged_acknowledged_entry() {
    let dir = TempDir::new("damaged");
    let crashed = TempDir::new("damaged-crashed");
    {
        let s = RedbStore::open_with(&dir.0, small()).unwrap();
        for i in 0..5 {
            s.write(|t| t.put_inode(&inode(100 + i, i))).unwrap();
        }
        copy_dir(&dir.0, &crashed.0);
    }
    // Flip a payload byte of the second entry: entries 3.. were written after 2 was durable.
    let seg = std::fs::read_dir(crashed.0.join("journal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| decode_seg_header(&std::fs::read(p).unwrap()).unwrap().is_some())
        .unwrap();
    let mut data = std::fs::read(&seg).unwrap();
    let (_, n) = decode_entry(&data[SEG_HEADER_BYTES..], decode_seg_header(&data).unwrap().unwrap().0).unwrap();
    data[SEG_HEADER_BYTES + n + ENTRY_HEADER_BYTES + 3] ^= 0x20;
    std::fs::write(&seg, &data).unwrap();
    let err = RedbStore::open_with(&crashed.0, small()).unwrap_err();
    assert!(err.to_string().contains("refusing to start"), "{err}");
}
