//! The stale-range ops (130–132, docs/format.md §18) as namespace transactions; the range rules are
//! [`crate::stale`]'s. `trusted` says the caller proved the cluster key (the service decides, from `CallCtx`).

use weft_proto::msg::{ClearStaleReq, ListStaleReq, MarkStaleReq, STALE_PAGE_MAX, StaleEntry, StaleRange};
use weft_proto::{DataRedundancy, ErrorCode, WireError};

use super::{Namespace, load, may, werr};
use crate::clock::Clock;
use crate::perm::{Cred, Mask};
use crate::stale;
use crate::store::{MetaStore, MetaTxn};

/// A page of `ListStale`: the entries, whether more follow, and the table's entry count.
pub struct StalePage {
    pub entries: Vec<StaleEntry>,
    pub more: bool,
    pub total_entries: u64,
}

impl<S: MetaStore, C: Clock> Namespace<S, C> {
    /// `MarkStale`: the caller must be the cluster key or hold write access to the file; the slot must be one of
    /// its layout's and the layout redundant. Full table (`stale_entries_max` entries, and this is a new one):
    /// `NoSpace`, so the degraded write fails instead of being acknowledged unrecorded.
    pub fn mark_stale(&self, cred: &Cred, trusted: bool, r: &MarkStaleReq) -> Result<StaleRange, WireError> {
        if r.start >= r.end {
            return Err(werr(
                ErrorCode::Invalid,
                format!("stale rows {}..{} of inode {}: empty", r.start, r.end, r.ino),
            ));
        }
        let (per_slot_max, entries_max) = (self.stale_ranges_per_slot_max, self.stale_entries_max);
        self.write_rerunnable(|t| {
            let inode = load(t, r.ino)?;
            let Some(layout) = inode.layout.as_ref().filter(|l| l.redundancy != DataRedundancy::Plain) else {
                return Err(werr(
                    ErrorCode::Invalid,
                    format!("inode {} has no redundant layout: nothing to mark stale", r.ino),
                ));
            };
            if r.slot as usize >= layout.servers.len() {
                return Err(werr(
                    ErrorCode::Invalid,
                    format!("slot {} is not in inode {}'s layout of {} servers", r.slot, r.ino, layout.servers.len()),
                ));
            }
            if !trusted {
                may(t, cred, &inode, Mask::WRITE)?;
            }
            let mut ranges = t.get_stale(r.ino, r.slot)?.unwrap_or_default();
            if ranges.is_empty() && t.count_stale()? >= entries_max {
                return Err(werr(
                    ErrorCode::NoSpace,
                    format!(
                        "the stale-range table is full ({entries_max} entries, stale_entries_max): cannot record what \
                         slot {} of inode {} missed",
                        r.slot, r.ino
                    ),
                ));
            }
            let seq = t.next_stale_seq()?;
            let covering = stale::mark(&mut ranges, r.start, r.end, seq, per_slot_max);
            t.put_stale(r.ino, r.slot, &ranges)?;
            Ok(covering)
        })
    }

    /// `ListStale`: a page in key order (one file's entries with `ino`).
    pub fn list_stale(&self, r: &ListStaleReq) -> Result<StalePage, WireError> {
        let limit = if r.limit == 0 { STALE_PAGE_MAX } else { r.limit.min(STALE_PAGE_MAX) } as usize;
        let after = match (r.ino, r.after) {
            (_, Some(a)) => Some(a),
            (Some(ino), None) => ino.checked_sub(1).map(|p| (p, u32::MAX)),
            (None, None) => None,
        };
        self.store.read(|t: &mut dyn MetaTxn| {
            // One more than asked, to know whether more follow.
            let mut rows = t.list_stale(after, limit + 1)?;
            if let Some(ino) = r.ino {
                rows.retain(|(i, _, _)| *i == ino);
            }
            let more = rows.len() > limit;
            rows.truncate(limit);
            let entries = rows.into_iter().map(|(ino, slot, ranges)| StaleEntry { ino, slot, ranges }).collect();
            Ok(StalePage { entries, more, total_entries: t.count_stale()? })
        })
    }

    /// `ClearStale` (cluster key only): `false` when the listed range changed meanwhile (nothing cleared).
    pub fn clear_stale(&self, trusted: bool, r: &ClearStaleReq) -> Result<bool, WireError> {
        if !trusted {
            return Err(werr(ErrorCode::Permission, "clearing stale ranges needs the cluster key (the healer's)"));
        }
        self.write_rerunnable(|t| {
            let Some(mut ranges) = t.get_stale(r.ino, r.slot)? else { return Ok(false) };
            if !stale::clear(&mut ranges, r.start, r.end, r.seq) {
                return Ok(false);
            }
            if ranges.is_empty() {
                t.del_stale(r.ino, r.slot)?;
            } else {
                t.put_stale(r.ino, r.slot, &ranges)?;
            }
            Ok(true)
        })
    }
}

#[cfg(test)]
mod tests {
    use weft_proto::msg::{CreateReq, RegisterServerReq, SetLayoutReq};
    use weft_proto::{Layout, ROOT_INO, Request, Response, SpaceStat};

    use super::*;
    use crate::test_stores::{TestStore, on_every_store};
    use crate::{ManualClock, RedbStore};

    /// A namespace with three servers and a `mirror 2` root, over `store`; returns it and a file created by root
    /// with mode 0644 (others may not write it).
    fn with_file<S: MetaStore>(store: S) -> (Namespace<S, ManualClock>, u64) {
        let ns = Namespace::new(store, ManualClock::new(1), crate::DEFAULT_LIVENESS_MS).unwrap();
        for id in 1..=3 {
            let space = SpaceStat { bytes_total: 100, bytes_free: 50, objects: 0 };
            ns.execute(&Request::RegisterServer(RegisterServerReq { id, addr: format!("ds{id}:1"), space })).unwrap();
        }
        let policy = Layout {
            stripe_unit: 4096,
            stripe_count: 2,
            servers: Vec::new(),
            redundancy: DataRedundancy::Mirror { n: 2 },
            generation: 0,
        };
        ns.execute(&Request::SetLayout(SetLayoutReq { ino: ROOT_INO, layout: policy })).unwrap();
        let create = CreateReq { parent: ROOT_INO, name: "f".into(), mode: 0o644, exclusive: true };
        let Ok(Response::Create(a)) = ns.execute(&Request::Create(create)) else { panic!("create") };
        (ns, a.ino)
    }

    fn mark(ino: u64, slot: u32, start: u64, end: u64) -> MarkStaleReq {
        MarkStaleReq { ino, slot, start, end }
    }

    fn all<S: MetaStore>(ns: &Namespace<S, ManualClock>) -> Vec<StaleEntry> {
        ns.list_stale(&ListStaleReq { ino: None, after: None, limit: 0 }).unwrap().entries
    }

    fn marks_need_write_access_or_the_cluster_key_and_a_slot_of_a_redundant_layout<S: TestStore>() {
        let (ns, ino) = with_file(S::fresh());
        let other = Cred::new(1000, 1000, Vec::new());
        let err = ns.mark_stale(&other, false, &mark(ino, 0, 0, 1)).unwrap_err();
        assert_eq!(err.code, ErrorCode::Permission);
        assert!(all(&ns).is_empty(), "a refused mark records nothing");
        // The cluster key (trusted) may, whoever it asserts; and so may root.
        ns.mark_stale(&other, true, &mark(ino, 0, 0, 1)).unwrap();
        ns.mark_stale(&Cred::root(), false, &mark(ino, 1, 5, 9)).unwrap();
        assert_eq!(ns.mark_stale(&Cred::root(), false, &mark(ino, 2, 0, 1)).unwrap_err().code, ErrorCode::Invalid);
        assert_eq!(ns.mark_stale(&Cred::root(), false, &mark(ino, 0, 3, 3)).unwrap_err().code, ErrorCode::Invalid);
        assert_eq!(ns.mark_stale(&Cred::root(), false, &mark(ROOT_INO, 0, 0, 1)).unwrap_err().code, ErrorCode::Invalid);
        let e = all(&ns);
        assert_eq!(e.iter().map(|e| (e.ino, e.slot)).collect::<Vec<_>>(), [(ino, 0), (ino, 1)]);
    }

    fn clears_are_for_the_cluster_key_and_match_the_listed_seq<S: TestStore>() {
        let (ns, ino) = with_file(S::fresh());
        let r = ns.mark_stale(&Cred::root(), false, &mark(ino, 0, 0, 10)).unwrap();
        let clear = |start, end, seq| ClearStaleReq { ino, slot: 0, start, end, seq };
        assert_eq!(ns.clear_stale(false, &clear(0, 10, r.seq)).unwrap_err().code, ErrorCode::Permission);
        // A mark between list and clear: the clear misses, the rows stay stale.
        ns.mark_stale(&Cred::root(), false, &mark(ino, 0, 3, 4)).unwrap();
        assert!(!ns.clear_stale(true, &clear(0, 10, r.seq)).unwrap());
        let now = all(&ns)[0].ranges[0];
        assert_eq!((now.start, now.end), (0, 10));
        assert!(ns.clear_stale(true, &clear(0, 4, now.seq)).unwrap());
        assert!(ns.clear_stale(true, &clear(4, 10, now.seq)).unwrap());
        assert!(all(&ns).is_empty(), "an entry with no range left is deleted");
        assert_eq!(ns.list_stale(&ListStaleReq { ino: None, after: None, limit: 0 }).unwrap().total_entries, 0);
    }

    fn the_table_is_bounded_per_slot_and_in_entries<S: TestStore>() {
        let (ns, ino) = with_file(S::fresh());
        let ns = ns.with_stale_limits(2, 1);
        for i in 0..3 {
            ns.mark_stale(&Cred::root(), false, &mark(ino, 0, i * 10, i * 10 + 1)).unwrap();
        }
        let e = all(&ns);
        assert_eq!((e[0].ranges.len(), e[0].ranges[0].start, e[0].ranges[0].end), (1, 0, u64::MAX), "whole slot");
        // A second entry is past `stale_entries_max = 1`; the existing one still takes marks.
        let err = ns.mark_stale(&Cred::root(), false, &mark(ino, 1, 0, 1)).unwrap_err();
        assert_eq!(err.code, ErrorCode::NoSpace);
        assert!(err.message.contains("stale_entries_max"), "{}", err.message);
        ns.mark_stale(&Cred::root(), false, &mark(ino, 0, 0, 1)).unwrap();
    }

    fn listing_pages_and_filters_by_file<S: TestStore>() {
        let (ns, ino) = with_file(S::fresh());
        let create = CreateReq { parent: ROOT_INO, name: "g".into(), mode: 0o644, exclusive: true };
        let Ok(Response::Create(g)) = ns.execute(&Request::Create(create)) else { panic!("create") };
        for (i, s) in [(ino, 0), (ino, 1), (g.ino, 1)] {
            ns.mark_stale(&Cred::root(), false, &mark(i, s, 0, 1)).unwrap();
        }
        let page = ns.list_stale(&ListStaleReq { ino: None, after: None, limit: 2 }).unwrap();
        assert_eq!((page.entries.len(), page.more, page.total_entries), (2, true, 3));
        let rest = ns.list_stale(&ListStaleReq { ino: None, after: Some((ino, 1)), limit: 2 }).unwrap();
        assert_eq!((rest.entries.len(), rest.more, rest.entries[0].ino), (1, false, g.ino));
        let one = ns.list_stale(&ListStaleReq { ino: Some(g.ino), after: None, limit: 0 }).unwrap();
        assert_eq!(one.entries.iter().map(|e| (e.ino, e.slot)).collect::<Vec<_>>(), [(g.ino, 1)]);
    }

    on_every_store!(
        marks_need_write_access_or_the_cluster_key_and_a_slot_of_a_redundant_layout,
        clears_are_for_the_cluster_key_and_match_the_listed_seq,
        the_table_is_bounded_per_slot_and_in_entries,
        listing_pages_and_filters_by_file
    );

    #[test]
    fn stale_ranges_survive_a_restart_through_the_journal() {
        let dir = std::env::temp_dir().join(format!("weft-meta-stale-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (ino, seq) = {
            let (ns, ino) = with_file(RedbStore::open(&dir).unwrap());
            let r = ns.mark_stale(&Cred::root(), false, &mark(ino, 1, 2, 7)).unwrap();
            ns.mark_stale(&Cred::root(), false, &mark(ino, 0, 0, 1)).unwrap();
            assert!(ns.clear_stale(true, &ClearStaleReq { ino, slot: 0, start: 0, end: 1, seq: r.seq + 1 }).unwrap());
            (ino, r.seq)
        };
        let ns = Namespace::new(RedbStore::open(&dir).unwrap(), ManualClock::new(1), 1000).unwrap();
        let e = all(&ns);
        assert_eq!(e.len(), 1);
        assert_eq!(
            (e[0].ino, e[0].slot, e[0].ranges[..].to_vec()),
            (ino, 1, vec![StaleRange { start: 2, end: 7, seq }])
        );
        // Sequence numbers keep counting after a restart: a new mark never reuses one.
        let r = ns.mark_stale(&Cred::root(), false, &mark(ino, 0, 0, 1)).unwrap();
        assert!(r.seq > seq + 1, "{r:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
