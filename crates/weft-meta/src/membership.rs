//! Data server membership (docs/format.md §19): what the MDS believes of each data server, as pure functions of
//! its phase and how long it has been silent, plus the choice of a spare and the layout change that uses it.
//!
//! Why pure: every transition depends only on (phase, milliseconds of silence, the two timeouts), so the unit
//! tests below walk each one with numbers instead of sleeps; [`crate::Namespace`] holds the phases and feeds them
//! the MDS clock ([`crate::clock`]).
//!
//! The phases and their transitions:
//!
//! ```text
//!  Member ──silent > rebuild_after_ms──▶ Failed ──every redundant layout moved──▶ Replaced
//!    ▲  (reported Up, or Down when          │                                        │
//!    │   silent > liveness_ms)              └──────────── heartbeat ──────────┐      │ heartbeat
//!    │                                                                         ▼      ▼
//!  Spare ◀──────────── every object no current layout names deleted ────── Draining
//! ```
//!
//! A server heard again while only `Down` (a `Member` or `Spare` silent for less than `rebuild_after_ms`) stays in
//! its phase and is caught up by the healer (its stale ranges); it is never replaced. `Spare` and `Draining`
//! servers fall to `Failed` like members if they go silent for `rebuild_after_ms`.
//!
//! Invariant: a server is declared failed (and its slots moved) only after `rebuild_after_ms` without a heartbeat.
//! Invariant: a server is chosen as a spare only when up (`Member` or `Spare` and heard within `liveness_ms`), never
//! while `Draining`, so a drain never deletes an object that a layout chosen during the drain names.

use std::collections::{BTreeMap, BTreeSet};

use weft_proto::{DataRedundancy, Layout, ServerState};

/// Default silence after which a data server is declared failed and its slots in redundant layouts move to spares
/// (milliseconds): five minutes, long enough that a reboot or a network blip does not cost a full rebuild.
pub const DEFAULT_REBUILD_AFTER_MS: u64 = 5 * 60 * 1000;
/// Default interval of the membership task (milliseconds): each tick updates phases and scans one batch.
pub const DEFAULT_MEMBERSHIP_INTERVAL_MS: u64 = 1000;
/// Inodes examined per membership tick, so a large namespace never stalls the MDS (the scan resumes next tick).
pub const MEMBERSHIP_SCAN_BATCH: usize = 512;

/// What the MDS believes of one data server, beyond its heartbeat age.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Phase {
    /// A member in good standing: reported `Up`, or `Down` while silent for more than `liveness_ms`.
    #[default]
    Member,
    /// Silent for more than `rebuild_after_ms`: its slots in redundant layouts are being moved to spares.
    Failed,
    /// Failed, and a whole scan found no redundant layout naming it that could not be moved.
    Replaced,
    /// Came back after it failed: its objects of files whose layouts no longer name it are being deleted.
    Draining,
    /// Drained; a member again that holds none of its old slots.
    Spare,
}

impl Phase {
    /// The phase's code in the store (format §6 `server_phases`, §19).
    pub fn code(self) -> u8 {
        match self {
            Phase::Member => 0,
            Phase::Failed => 1,
            Phase::Replaced => 2,
            Phase::Draining => 3,
            Phase::Spare => 4,
        }
    }

    /// The phase a stored code names; `None` for a code this MDS does not know (the caller refuses to guess).
    pub fn from_code(code: u8) -> Option<Phase> {
        Some(match code {
            0 => Phase::Member,
            1 => Phase::Failed,
            2 => Phase::Replaced,
            3 => Phase::Draining,
            4 => Phase::Spare,
            _ => return None,
        })
    }
}

/// The two timeouts membership runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Silence after which a server is reported `Down`.
    pub liveness_ms: u64,
    /// Silence after which a server is declared `Failed`.
    pub rebuild_after_ms: u64,
}

/// The state reported for a server in `phase` silent for `silent_ms` (`ClusterInfo`, `weft status`).
pub fn state(phase: Phase, silent_ms: u64, t: Timing) -> ServerState {
    let fresh = silent_ms <= t.liveness_ms;
    match phase {
        Phase::Member if fresh => ServerState::Up,
        Phase::Spare if fresh => ServerState::Spare,
        Phase::Draining if fresh => ServerState::Draining,
        Phase::Member | Phase::Spare | Phase::Draining => ServerState::Down,
        Phase::Failed => ServerState::Failed,
        Phase::Replaced => ServerState::Replaced,
    }
}

/// The phase after a heartbeat: a failed or replaced server that returns is drained before it serves again.
pub fn on_heartbeat(phase: Phase) -> Phase {
    match phase {
        Phase::Failed | Phase::Replaced => Phase::Draining,
        p => p,
    }
}

/// The phase after time passed with the server silent for `silent_ms`.
pub fn on_tick(phase: Phase, silent_ms: u64, t: Timing) -> Phase {
    match phase {
        Phase::Member | Phase::Spare | Phase::Draining if silent_ms > t.rebuild_after_ms => Phase::Failed,
        p => p,
    }
}

/// The phase once a whole scan left no redundant layout naming the server (only a failed server becomes replaced).
pub fn on_replaced(phase: Phase) -> Phase {
    match phase {
        Phase::Failed => Phase::Replaced,
        p => p,
    }
}

/// The phase once every object the server held that no current layout names was deleted.
pub fn on_drained(phase: Phase) -> Phase {
    match phase {
        Phase::Draining => Phase::Spare,
        p => p,
    }
}

/// The spare for a slot of a layout naming `in_layout`: an up server not in the layout with the fewest slots
/// assigned (`load`, servers missing from it count 0), ties to the lowest id. Deterministic.
pub fn pick_spare(in_layout: &[u32], up: &BTreeSet<u32>, load: &BTreeMap<u32, u64>) -> Option<u32> {
    up.iter().copied().filter(|id| !in_layout.contains(id)).min_by_key(|id| (load.get(id).copied().unwrap_or(0), *id))
}

/// What moving a layout's failed slots to spares gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replacement {
    /// The new layout (generation + 1), or `None` when no slot could move.
    pub layout: Option<Layout>,
    /// The slots that moved: (index into `servers`, failed server, spare).
    pub moved: Vec<(u32, u32, u32)>,
    /// Failed servers still in the layout for want of a spare.
    pub unplaced: Vec<u32>,
}

/// Moves every slot of `layout` held by a server in `failed` to a spare ([`pick_spare`]), adding each spare's new
/// slot to `load`. Plain layouts are never changed (their bytes exist once: moving a slot would lose them).
pub fn replace_failed(
    layout: &Layout,
    failed: &BTreeSet<u32>,
    up: &BTreeSet<u32>,
    load: &mut BTreeMap<u32, u64>,
) -> Replacement {
    let mut out = Replacement { layout: None, moved: Vec::new(), unplaced: Vec::new() };
    if layout.redundancy == DataRedundancy::Plain || !layout.servers.iter().any(|s| failed.contains(s)) {
        return out;
    }
    let mut servers = layout.servers.clone();
    for slot in 0..servers.len() {
        let old = servers[slot];
        if !failed.contains(&old) {
            continue;
        }
        match pick_spare(&servers, up, load) {
            Some(spare) => {
                servers[slot] = spare;
                *load.entry(spare).or_insert(0) += 1;
                out.moved.push((slot as u32, old, spare));
            }
            None => out.unplaced.push(old),
        }
    }
    if !out.moved.is_empty() {
        out.layout = Some(Layout { servers, generation: layout.generation.saturating_add(1), ..layout.clone() });
    }
    out
}

/// Where the membership scan is: it walks every inode in batches ([`MEMBERSHIP_SCAN_BATCH`] per tick) while some
/// server is failed, and a server becomes `Replaced` at the end of a whole pass that began with it failed and found
/// no layout still naming it.
///
/// Why a scan and not a server → inodes index: an index is one more table every create, unlink and layout change
/// must keep exact in the same transaction, for an event (a server failing) that is rare; a bounded scan costs one
/// read of the inode table per failure, spread over ticks, and cannot disagree with the inodes.
#[derive(Debug, Default)]
pub struct Scan {
    /// The last inode examined in this pass (0: the pass starts at the beginning).
    pub after: u64,
    /// Servers failed when this pass began: only they can be declared replaced at its end.
    pub pass_failed: BTreeSet<u32>,
    /// Per failed server, files found in this pass still naming it (no spare).
    pub left: BTreeMap<u32, u64>,
    /// Slots per server counted in the last whole pass, plus spares assigned since: the load spares spread by.
    pub load: BTreeMap<u32, u64>,
    /// Slots per server counted so far in this pass.
    pub counting: BTreeMap<u32, u64>,
    /// Whether a pass is under way.
    pub running: bool,
}

impl Scan {
    /// Starts a pass over every inode with `failed` failed.
    pub fn begin(&mut self, failed: &BTreeSet<u32>) {
        self.after = 0;
        self.pass_failed = failed.clone();
        self.left.clear();
        self.counting.clear();
        self.running = true;
    }

    /// Counts a file's slots toward the next pass's load.
    pub fn count(&mut self, layout: &Layout) {
        for s in &layout.servers {
            *self.counting.entry(*s).or_insert(0) += 1;
        }
    }

    /// Ends the pass: returns the servers failed throughout it that no layout names any more.
    pub fn finish(&mut self, failed_now: &BTreeSet<u32>) -> Vec<u32> {
        self.running = false;
        self.load = std::mem::take(&mut self.counting);
        self.pass_failed
            .iter()
            .copied()
            .filter(|id| failed_now.contains(id) && self.left.get(id).copied().unwrap_or(0) == 0)
            .collect()
    }

    /// Files found so far in this pass that still name a failed server.
    pub fn pending(&self) -> u64 {
        self.left.values().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timing = Timing { liveness_ms: 5_000, rebuild_after_ms: 60_000 };

    #[test]
    fn phase_codes_round_trip_and_unknown_codes_are_refused() {
        for p in [Phase::Member, Phase::Failed, Phase::Replaced, Phase::Draining, Phase::Spare] {
            assert_eq!(Phase::from_code(p.code()), Some(p));
        }
        assert_eq!(Phase::from_code(5), None);
        assert_eq!(Phase::from_code(u8::MAX), None);
    }

    #[test]
    fn a_member_is_up_then_down_then_failed_by_silence() {
        assert_eq!(state(Phase::Member, 0, T), ServerState::Up);
        assert_eq!(state(Phase::Member, 5_000, T), ServerState::Up);
        assert_eq!(state(Phase::Member, 5_001, T), ServerState::Down);
        // Down is not failed: the phase holds until rebuild_after_ms.
        assert_eq!(on_tick(Phase::Member, 5_001, T), Phase::Member);
        assert_eq!(on_tick(Phase::Member, 60_000, T), Phase::Member);
        assert_eq!(on_tick(Phase::Member, 60_001, T), Phase::Failed);
        assert_eq!(state(Phase::Failed, 60_001, T), ServerState::Failed);
    }

    #[test]
    fn returning_while_down_keeps_the_server_a_member() {
        // Heard again before rebuild_after_ms: nothing was moved, the healer catches it up.
        let p = on_tick(Phase::Member, 59_999, T);
        assert_eq!(on_heartbeat(p), Phase::Member);
        assert_eq!(state(on_heartbeat(p), 0, T), ServerState::Up);
    }

    #[test]
    fn a_failed_server_is_replaced_only_when_failed() {
        assert_eq!(on_replaced(Phase::Failed), Phase::Replaced);
        for p in [Phase::Member, Phase::Draining, Phase::Spare, Phase::Replaced] {
            assert_eq!(on_replaced(p), p, "{p:?}");
        }
        assert_eq!(state(Phase::Replaced, u64::MAX, T), ServerState::Replaced);
        // Silence changes nothing more once failed or replaced.
        assert_eq!(on_tick(Phase::Failed, u64::MAX, T), Phase::Failed);
        assert_eq!(on_tick(Phase::Replaced, u64::MAX, T), Phase::Replaced);
    }

    #[test]
    fn returning_after_failure_drains_then_serves_as_a_spare() {
        assert_eq!(on_heartbeat(Phase::Failed), Phase::Draining);
        assert_eq!(on_heartbeat(Phase::Replaced), Phase::Draining);
        assert_eq!(state(Phase::Draining, 0, T), ServerState::Draining);
        assert_eq!(on_heartbeat(Phase::Draining), Phase::Draining);
        assert_eq!(on_drained(Phase::Draining), Phase::Spare);
        assert_eq!(state(Phase::Spare, 0, T), ServerState::Spare);
        assert_eq!(on_heartbeat(Phase::Spare), Phase::Spare);
        for p in [Phase::Member, Phase::Failed, Phase::Replaced, Phase::Spare] {
            assert_eq!(on_drained(p), p, "{p:?}");
        }
    }

    #[test]
    fn draining_and_spare_servers_fail_again_when_silent() {
        assert_eq!(state(Phase::Draining, 5_001, T), ServerState::Down);
        assert_eq!(state(Phase::Spare, 5_001, T), ServerState::Down);
        assert_eq!(on_tick(Phase::Draining, 60_001, T), Phase::Failed);
        assert_eq!(on_tick(Phase::Spare, 60_001, T), Phase::Failed);
        assert_eq!(on_tick(Phase::Spare, 60_000, T), Phase::Spare);
    }

    #[test]
    fn a_spare_is_up_outside_the_layout_least_loaded_lowest_id() {
        let up: BTreeSet<u32> = [1, 2, 3, 4, 5].into();
        let mut load = BTreeMap::from([(3, 2), (4, 1), (5, 1)]);
        assert_eq!(pick_spare(&[1, 2, 3], &up, &load), Some(4), "4 and 5 tie at 1: lowest id");
        load.insert(4, 9);
        assert_eq!(pick_spare(&[1, 2, 3], &up, &load), Some(5));
        assert_eq!(pick_spare(&[1, 2], &up, &BTreeMap::new()), Some(3), "no load known: lowest id outside");
        assert_eq!(pick_spare(&[1, 2, 3, 4, 5], &up, &load), None, "every up server is in the layout");
        assert_eq!(pick_spare(&[1], &BTreeSet::new(), &load), None, "nothing up");
    }

    fn ec(servers: Vec<u32>, generation: u64) -> Layout {
        Layout {
            stripe_unit: 4096,
            stripe_count: servers.len() as u32,
            servers,
            redundancy: DataRedundancy::Ec { k: 2, m: 1 },
            generation,
        }
    }

    #[test]
    fn replacing_moves_failed_slots_and_bumps_the_generation() {
        let failed: BTreeSet<u32> = [1].into();
        let up: BTreeSet<u32> = [0, 2, 3, 4].into();
        let mut load = BTreeMap::from([(3, 5)]);
        let r = replace_failed(&ec(vec![0, 1, 2], 7), &failed, &up, &mut load);
        assert_eq!(r.layout, Some(ec(vec![0, 4, 2], 8)));
        assert_eq!(r.moved, vec![(1, 1, 4)]);
        assert!(r.unplaced.is_empty());
        assert_eq!(load.get(&4), Some(&1), "the spare's new slot counts toward the next choice");
        // The next file with the same failure goes to 3 or 4 by load: 4 has 1, 3 has 5 → 4 again.
        let r2 = replace_failed(&ec(vec![1, 2, 0], 0), &failed, &up, &mut load);
        assert_eq!(r2.layout, Some(ec(vec![4, 2, 0], 1)));
    }

    /// Issue 32 item 5: a failed server's slots, over many files, spread over every spare candidate (each file's
    /// slot goes to the least-loaded up server outside its layout), not onto one: every candidate takes some, and
    /// whatever load they had before, they end within one slot of each other once the moves outweigh it.
    #[test]
    fn a_failed_servers_slots_spread_over_every_spare_candidate() {
        let failed: BTreeSet<u32> = [1].into();
        let up: BTreeSet<u32> = [0, 2, 3, 4, 5, 6, 7].into();
        for before in [BTreeMap::new(), BTreeMap::from([(3, 4), (6, 1)])] {
            let mut load = before.clone();
            let mut moved_to: BTreeMap<u32, u64> = BTreeMap::new();
            let others: Vec<u32> = up.iter().copied().collect();
            for f in 0..42usize {
                // Layouts of width 3 holding the failed server, the other two rotating through the up servers.
                let layout = ec(vec![1, others[f % 7], others[(f + 3) % 7]], 0);
                let r = replace_failed(&layout, &failed, &up, &mut load);
                let (_, old, spare) = r.moved[0];
                assert!(old == 1 && !layout.servers.contains(&spare) && up.contains(&spare));
                *moved_to.entry(spare).or_insert(0) += 1;
            }
            assert!(others.iter().all(|s| moved_to.contains_key(s)), "every candidate used: {moved_to:?}");
            let total = |s: &u32| load.get(s).copied().unwrap_or(0);
            let (lo, hi) = (others.iter().map(total).min().unwrap(), others.iter().map(total).max().unwrap());
            assert!(hi - lo <= 1, "loads {load:?} after moves {moved_to:?} from {before:?}");
        }
    }

    #[test]
    fn replacing_without_a_spare_changes_nothing_and_plain_layouts_never_change() {
        let failed: BTreeSet<u32> = [1].into();
        let up: BTreeSet<u32> = [0, 2].into();
        let r = replace_failed(&ec(vec![0, 1, 2], 3), &failed, &up, &mut BTreeMap::new());
        assert_eq!((r.layout, r.unplaced), (None, vec![1]));
        let plain = Layout::plain(4096, vec![0, 1]);
        let up: BTreeSet<u32> = [0, 2, 3].into();
        let r = replace_failed(&plain, &failed, &up, &mut BTreeMap::new());
        assert_eq!(r, Replacement { layout: None, moved: vec![], unplaced: vec![] });
        // Two failed slots, one spare: one moves (a change), one stays degraded.
        let failed: BTreeSet<u32> = [1, 2].into();
        let up: BTreeSet<u32> = [0, 3].into();
        let r = replace_failed(&ec(vec![0, 1, 2], 0), &failed, &up, &mut BTreeMap::new());
        assert_eq!((r.layout, r.moved, r.unplaced), (Some(ec(vec![0, 3, 2], 1)), vec![(1, 1, 3)], vec![2]));
    }

    #[test]
    fn a_pass_replaces_only_servers_failed_throughout_with_nothing_left() {
        let mut s = Scan::default();
        let failed: BTreeSet<u32> = [1, 2].into();
        s.begin(&failed);
        s.left.insert(2, 1);
        s.count(&ec(vec![0, 3, 4], 0));
        // 1 moved everywhere; 2 still named by a file; 5 failed during the pass (not checked by it).
        let now: BTreeSet<u32> = [1, 2, 5].into();
        assert_eq!(s.finish(&now), vec![1]);
        assert_eq!(s.load.get(&3), Some(&1));
        assert!(!s.running);
        // A server that came back during the pass is not replaced.
        s.begin(&failed);
        assert_eq!(s.finish(&[2].into()), vec![2]);
    }
}
