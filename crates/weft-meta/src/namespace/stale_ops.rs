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
            return Err(werr(ErrorCode::Invalid, format!("stale rows {}..{} of inode {}: empty", r.start, r.end, r.ino)));
        }
        let (per_slot_max, entries_max) = (self.stale_ranges_per_slot_max, self.stale_entries_max);
        self.store.write(|t| {
            let inode = load(t, r.ino)?;
            let Some(layout) = inode.layout.as_ref().filter(|l| l.redundancy != DataRedundancy::Plain) else {
                return Err(werr(ErrorCode::Invalid, format!("inode {} has no redundant layout: nothing to mark stale", r.ino)));
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
        self.store.write(|t| {
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
