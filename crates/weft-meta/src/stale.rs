//! The stale-range table's rules (docs/format.md §18), pure: what a `MarkStale` and a `ClearStale` do to the
//! ranges of one (file, slot), and how the record is stored. The namespace runs them inside its transactions.
//!
//! Why sequence numbers: the healer lists a range, copies its rows, then clears it. A degraded write of an
//! overlapping row in between marks it again; that mark merges into the range under a *new* `seq`, so the
//! healer's clear (which names the seq it listed) no longer matches and clears nothing: the new mark is never lost.
//! A clear may cover part of a range (the healer clears a whole-slot range batch by batch), so a long heal makes
//! progress even while new writes arrive: what is cleared is gone, what is left keeps its seq.
//!
//! Invariants: an entry's ranges are sorted, non-empty, neither overlapping nor touching; a seq names one mark
//! (the pieces a partial clear left of it share it, and no other range has it); an entry has at most `ranges_max` ranges (more collapse to the whole slot,
//! `[0, u64::MAX)`).

use weft_proto::msg::StaleRange;

use crate::error::MetaError;

/// The end of a range that reaches the end of the file whatever its size: a whole slot.
pub const WHOLE: u64 = u64::MAX;
/// Default most ranges one (file, slot) keeps before collapsing to the whole slot.
pub const DEFAULT_STALE_RANGES_PER_SLOT_MAX: usize = 64;
/// Default most (file, slot) entries in the table; a mark past it is refused with `NoSpace`.
pub const DEFAULT_STALE_ENTRIES_MAX: u64 = 1 << 20;

/// Version byte of a stored entry.
const STALE_V1: u8 = 1;

/// Adds rows `[start, end)` (non-empty) under the fresh sequence number `seq` (greater than any given before).
/// Ranges overlapping or touching it merge into one range with `seq`; past `ranges_max` ranges the entry
/// collapses to the whole slot. Returns the range that now covers the mark.
pub fn mark(ranges: &mut Vec<StaleRange>, start: u64, end: u64, seq: u64, ranges_max: usize) -> StaleRange {
    assert!(start < end, "a stale mark covers at least one row");
    let (mut lo, mut hi) = (start, end);
    // Touching ranges merge too (`r.end == start`), so the list stays as short as the rows allow.
    ranges.retain(|r| {
        let meets = r.start <= end && start <= r.end;
        if meets {
            lo = lo.min(r.start);
            hi = hi.max(r.end);
        }
        !meets
    });
    let merged = StaleRange { start: lo, end: hi, seq };
    let at = ranges.partition_point(|r| r.start < lo);
    ranges.insert(at, merged);
    if ranges.len() > ranges_max.max(1) {
        ranges.clear();
        let whole = StaleRange { start: 0, end: WHOLE, seq };
        ranges.push(whole);
        return whole;
    }
    merged
}

/// Removes rows `[start, end)` from the range numbered `seq`, if that range still exists and covers them; the
/// rest of it stays, under the same seq. `false`: the range was marked again (new seq) or is gone; nothing
/// changed.
pub fn clear(ranges: &mut Vec<StaleRange>, start: u64, end: u64, seq: u64) -> bool {
    if start >= end {
        return false;
    }
    let Some(i) = ranges.iter().position(|r| r.seq == seq && r.start <= start && end <= r.end) else {
        return false;
    };
    let r = ranges[i];
    ranges.remove(i);
    // The right part first, so both land at `i` in order.
    if end < r.end {
        ranges.insert(i, StaleRange { start: end, end: r.end, seq });
    }
    if r.start < start {
        ranges.insert(i, StaleRange { start: r.start, end: start, seq });
    }
    true
}

/// Whether `ranges` obeys the invariants (sorted, non-empty, apart): a loaded record is checked. Pieces of one
/// range split by a clear share its seq.
pub fn is_well_formed(ranges: &[StaleRange]) -> bool {
    ranges.iter().all(|r| r.start < r.end) && ranges.windows(2).all(|w| w[0].end < w[1].start)
}

/// A stored entry: version 1, then the postcard `Vec<StaleRange>`.
pub fn encode(ranges: &[StaleRange]) -> Result<Vec<u8>, MetaError> {
    let mut out = vec![STALE_V1];
    out.extend(postcard::to_stdvec(ranges).map_err(|e| MetaError::Corrupt(format!("encoding stale ranges: {e}")))?);
    Ok(out)
}

/// Reads a stored entry; anything malformed (unknown version, trailing bytes, broken invariants) is `Corrupt`.
pub fn decode(what: &str, bytes: &[u8]) -> Result<Vec<StaleRange>, MetaError> {
    match bytes.split_first() {
        Some((&STALE_V1, body)) => {
            let (ranges, rest): (Vec<StaleRange>, _) =
                postcard::take_from_bytes(body).map_err(|e| MetaError::Corrupt(format!("{what}: {e}")))?;
            if !rest.is_empty() {
                return Err(MetaError::Corrupt(format!("{what}: {} trailing bytes", rest.len())));
            }
            if ranges.is_empty() || !is_well_formed(&ranges) {
                return Err(MetaError::Corrupt(format!("{what}: ranges empty, unsorted or overlapping")));
            }
            Ok(ranges)
        }
        Some((v, _)) => Err(MetaError::Corrupt(format!("{what}: unknown stale record version {v}"))),
        None => Err(MetaError::Corrupt(format!("{what}: empty stale record"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(start: u64, end: u64, seq: u64) -> StaleRange {
        StaleRange { start, end, seq }
    }

    #[test]
    fn a_mark_into_an_empty_entry_is_one_range() {
        let mut v = Vec::new();
        assert_eq!(mark(&mut v, 3, 5, 1, 8), r(3, 5, 1));
        assert_eq!(v, [r(3, 5, 1)]);
    }

    #[test]
    fn disjoint_marks_stay_apart_and_sorted() {
        let mut v = Vec::new();
        mark(&mut v, 10, 12, 1, 8);
        mark(&mut v, 0, 2, 2, 8);
        mark(&mut v, 5, 6, 3, 8);
        assert_eq!(v, [r(0, 2, 2), r(5, 6, 3), r(10, 12, 1)]);
        assert!(is_well_formed(&v));
    }

    #[test]
    fn overlapping_and_touching_marks_merge_under_the_new_seq() {
        let mut v = vec![r(0, 2, 1), r(5, 6, 2), r(10, 12, 3)];
        // Touches [0, 2) and overlaps [5, 6): both merge; [10, 12) stays.
        assert_eq!(mark(&mut v, 2, 6, 4, 8), r(0, 6, 4));
        assert_eq!(v, [r(0, 6, 4), r(10, 12, 3)]);
        // A mark inside a range still renews its seq: the rows changed after whoever listed it.
        assert_eq!(mark(&mut v, 11, 12, 5, 8), r(10, 12, 5));
        assert_eq!(v, [r(0, 6, 4), r(10, 12, 5)]);
        // One mark spanning everything.
        assert_eq!(mark(&mut v, 0, 100, 6, 8), r(0, 100, 6));
        assert_eq!(v, [r(0, 100, 6)]);
    }

    #[test]
    fn past_the_cap_an_entry_collapses_to_the_whole_slot() {
        let mut v = Vec::new();
        for i in 0..3 {
            mark(&mut v, i * 10, i * 10 + 1, i + 1, 3);
        }
        assert_eq!(v.len(), 3);
        assert_eq!(mark(&mut v, 100, 101, 9, 3), r(0, WHOLE, 9));
        assert_eq!(v, [r(0, WHOLE, 9)]);
        // A whole slot absorbs every later mark (and renews its seq).
        assert_eq!(mark(&mut v, 5, 6, 10, 3), r(0, WHOLE, 10));
        assert_eq!(v.len(), 1);
    }

    #[test]
    fn a_clear_of_the_listed_seq_removes_exactly_its_rows() {
        let mut v = vec![r(0, 10, 1), r(20, 30, 2)];
        assert!(clear(&mut v, 0, 10, 1));
        assert_eq!(v, [r(20, 30, 2)]);
        // The middle: both ends stay, same seq.
        assert!(clear(&mut v, 22, 25, 2));
        assert_eq!(v, [r(20, 22, 2), r(25, 30, 2)]);
        // A seq shared by two pieces: a clear must lie inside one piece.
        assert!(!clear(&mut v, 21, 26, 2));
        assert!(clear(&mut v, 20, 22, 2));
        assert_eq!(v, [r(25, 30, 2)]);
        assert!(clear(&mut v, 25, 30, 2));
        assert!(v.is_empty());
    }

    #[test]
    fn batch_clears_eat_a_whole_slot_from_the_front() {
        let mut v = vec![r(0, WHOLE, 7)];
        assert!(clear(&mut v, 0, 64, 7));
        assert!(clear(&mut v, 64, 128, 7));
        assert_eq!(v, [r(128, WHOLE, 7)]);
        assert!(clear(&mut v, 128, WHOLE, 7));
        assert!(v.is_empty());
    }

    #[test]
    fn a_mark_between_list_and_clear_is_never_lost() {
        // The healer lists [0, 10) seq 1 and copies its rows; a degraded write marks row 4 meanwhile.
        let mut v = Vec::new();
        let listed = mark(&mut v, 0, 10, 1, 8);
        mark(&mut v, 4, 5, 2, 8);
        assert!(!clear(&mut v, listed.start, listed.end, listed.seq), "the range changed: nothing cleared");
        assert_eq!(v, [r(0, 10, 2)]);
        // A mark of other rows during a batch heal of a whole slot: the healed batch goes, the rest is renewed.
        let mut v = vec![r(0, WHOLE, 3)];
        assert!(clear(&mut v, 0, 64, 3));
        mark(&mut v, 10, 11, 4, 8);
        mark(&mut v, 100, 101, 5, 8);
        assert_eq!(v, [r(10, 11, 4), r(64, WHOLE, 5)]);
        assert!(!clear(&mut v, 64, 128, 3), "seq 3 is gone");
    }

    #[test]
    fn clears_that_do_not_fit_change_nothing() {
        let mut v = vec![r(5, 10, 1)];
        for (s, e, q) in [(5, 10, 2), (4, 10, 1), (5, 11, 1), (7, 7, 1), (8, 6, 1)] {
            assert!(!clear(&mut v, s, e, q), "{s}..{e} seq {q}");
            assert_eq!(v, [r(5, 10, 1)]);
        }
    }

    #[test]
    fn records_round_trip_and_bad_ones_are_corrupt() {
        let v = vec![r(0, 2, 1), r(5, WHOLE, 9)];
        assert_eq!(decode("t", &encode(&v).unwrap()).unwrap(), v);
        let overlapping = encode(&[r(0, 5, 1), r(3, 8, 2)]).unwrap();
        let touching = encode(&[r(0, 3, 1), r(3, 8, 2)]).unwrap();
        let empty = encode(&[]).unwrap();
        let mut trailing = encode(&v).unwrap();
        trailing.push(0);
        for bad in [&[][..], &[2, 0], &[1, 5], &overlapping, &touching, &empty, &trailing] {
            assert!(matches!(decode("t", bad), Err(MetaError::Corrupt(_))), "{bad:?}");
        }
    }
}
