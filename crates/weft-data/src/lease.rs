//! The data server's lease to serve clients (docs/format.md §19, "Fencing"): a server serves client I/O only while
//! its last heartbeat reply from the MDS said it is `Up` (or `Spare`) and that heartbeat was sent less than the
//! lease ago, on this server's monotonic clock.
//!
//! Why: the MDS moves a silent server's slots in redundant layouts to spares after `rebuild_after_ms`. A server
//! that was cut off from the MDS, or came back after it was replaced (`Draining`), must not take a stale client's
//! writes to objects it no longer owns, or the spare would miss them. The lease is at most half the MDS's
//! `rebuild_after_ms` (the heartbeat reply carries it), and it is measured from when the heartbeat was *sent*,
//! before the MDS heard it: so a server that goes silent has stopped serving long before its slots can move. A
//! refused request gets `StaleLayout` (31); the client refetches the layout and retries (weft-client `file.rs`).
//!
//! Every request that carries a capability is fenced, whichever key its connection proved: clients commonly hold
//! the cluster key (the mount, the gateway, `weft up`'s clients), so the key cannot tell a stale client from the
//! healer. The MDS's own requests (`ListObjects` and `RemoveObject` of the drain and the orphan collector) carry no
//! capability and always pass. The healer is not held back where it matters: a server that returns before it was
//! declared failed is `Up` from its first heartbeat reply (sent before it reports ready), so the healer catches it
//! up at once; a `Draining` one holds no slot a current layout names unless no spare could take it, and those are
//! healed once it is drained (`Spare`).
//!
//! [`Lease`] is the pure state machine (its unit tests walk every transition with numbers, no sleeps);
//! [`LeaseGate`] is the thin shared wrapper: `node.rs` feeds it heartbeat replies, `service.rs` asks it one
//! question per request (an atomic load and a clock read while the lease holds).
//!
//! ```text
//!             reply Up/Spare                     sent_ms + lease passes
//!  Starting ─────────────────▶ Serving ─────────────────────────────────▶ Lapsed
//!     │                        ▲  │  ▲                                      │
//!     │ reply Draining/…       │  │  └────────────── reply Up/Spare ────────┤
//!     ▼                        │  ▼ reply Draining/…                        │
//!   NotUp ◀────────────────────┼──────────────────── reply Draining/… ──────┘
//!     └──── reply Up/Spare ────┘
//! ```

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use tracing::warn;
use weft_proto::msg::HeartbeatResp;
use weft_proto::{ErrorCode, ServerState, WireError};

use crate::capabilities::RefusalLog;

/// Default lease (ms): half the MDS's default `rebuild_after_ms` (five minutes). The lease in force is never more
/// than half the `rebuild_after_ms` the MDS answers, whatever this says.
pub const DEFAULT_LEASE_MS: u64 = 150_000;

/// The last heartbeat reply: when its heartbeat was sent (this server's monotonic ms) and what it said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Grant {
    sent_ms: u64,
    reply: HeartbeatResp,
}

/// What this server knows of its standing at the MDS. Pure: every input is a number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The configured lease (`lease_ms`).
    lease_ms: u64,
    last: Option<Grant>,
}

/// Why the server does not serve client I/O now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    /// No heartbeat reply yet since this server started.
    Starting,
    /// The MDS's last reply reports the server in this state (`Draining`, or another that is not up).
    NotUp(ServerState),
    /// The last `Up` reply's heartbeat was sent `age_ms` ago, not less than the lease of `lease_ms`.
    Lapsed { age_ms: u64, lease_ms: u64 },
}

impl Lease {
    /// A lease of at most `lease_ms` (at least 1), not yet granted.
    pub fn new(lease_ms: u64) -> Lease {
        Lease { lease_ms: lease_ms.max(1), last: None }
    }

    /// A heartbeat sent at `sent_ms` was answered `reply`. A reply to a heartbeat sent before the one already
    /// recorded changes nothing (heartbeats go one at a time, but a late answer must never extend the lease).
    pub fn on_reply(&mut self, sent_ms: u64, reply: HeartbeatResp) {
        if self.last.is_some_and(|g| g.sent_ms > sent_ms) {
            return;
        }
        self.last = Some(Grant { sent_ms, reply });
    }

    /// The lease in force: the configured one, at most half the MDS's `rebuild_after_ms` as last answered.
    pub fn lease_ms(&self) -> u64 {
        match self.last {
            Some(g) => self.lease_ms.min(g.reply.rebuild_after_ms / 2),
            None => self.lease_ms,
        }
    }

    /// Until when (exclusive, monotonic ms) the server may serve, or `None` if it may not serve at all now.
    pub fn serves_until_ms(&self) -> Option<u64> {
        let g = self.last?;
        g.reply.state.is_up().then(|| g.sent_ms.saturating_add(self.lease_ms()))
    }

    /// Whether the server may serve client I/O at `now_ms`, and if not, why.
    pub fn check(&self, now_ms: u64) -> Result<(), Fence> {
        let Some(g) = self.last else { return Err(Fence::Starting) };
        if !g.reply.state.is_up() {
            return Err(Fence::NotUp(g.reply.state));
        }
        let age_ms = now_ms.saturating_sub(g.sent_ms);
        let lease_ms = self.lease_ms();
        if age_ms >= lease_ms {
            return Err(Fence::Lapsed { age_ms, lease_ms });
        }
        Ok(())
    }
}

impl Fence {
    /// The refusal a client gets: `StaleLayout` with what happened, for data server `id`.
    pub fn to_wire(self, id: u32) -> WireError {
        let why = match self {
            Fence::Starting => format!("data server {id} has had no heartbeat reply from the MDS since it started"),
            Fence::NotUp(state) => format!("data server {id} not Up at the MDS ({state:?})"),
            Fence::Lapsed { age_ms, lease_ms } => format!(
                "data server {id}'s lease lapsed: no Up reply from the MDS to a heartbeat sent within {lease_ms} ms \
                 (the last was sent {age_ms} ms ago)"
            ),
        };
        WireError::new(
            ErrorCode::StaleLayout,
            format!("{why}: it serves no client I/O now; refetch the layout (docs/format.md §19)"),
        )
    }
}

/// The lease shared by the heartbeat task and the service. Serving is one atomic load and a clock read.
pub struct LeaseGate {
    id: u32,
    start: Instant,
    lease: Mutex<Lease>,
    /// [`Lease::serves_until_ms`] of the current lease (0: not serving), so the common path takes no lock.
    until_ms: AtomicU64,
    refusal_log: RefusalLog,
}

impl LeaseGate {
    /// The gate of data server `id` with a lease of at most `lease_ms`; it serves nobody until a reply says `Up`.
    pub fn new(id: u32, lease_ms: u64) -> LeaseGate {
        LeaseGate {
            id,
            start: Instant::now(),
            lease: Mutex::new(Lease::new(lease_ms)),
            until_ms: AtomicU64::new(0),
            refusal_log: RefusalLog::new(),
        }
    }

    /// Milliseconds on this server's monotonic clock (since the gate was made; never 0 after the first ms).
    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Records a heartbeat reply (`sent_ms` from [`LeaseGate::now_ms`] before the heartbeat went out). Returns
    /// the lease now in force.
    pub fn on_reply(&self, sent_ms: u64, reply: HeartbeatResp) -> u64 {
        // The lock only orders replies against each other; a panic under it cannot leave the lease torn.
        let mut lease = self.lease.lock().unwrap_or_else(|p| p.into_inner());
        lease.on_reply(sent_ms, reply);
        self.until_ms.store(lease.serves_until_ms().unwrap_or(0), Ordering::Release);
        lease.lease_ms()
    }

    /// Whether the server may serve now (for logs and tests).
    pub fn check(&self) -> Result<(), Fence> {
        let now = self.now_ms();
        self.lease.lock().unwrap_or_else(|p| p.into_inner()).check(now)
    }

    /// Admits a request carrying a capability, from `peer`, only under the lease. A refusal is logged
    /// (rate-limited) and returned as `StaleLayout`.
    pub fn admit(&self, peer: &str) -> Result<(), WireError> {
        let now = self.now_ms();
        if now < self.until_ms.load(Ordering::Acquire) {
            return Ok(());
        }
        // The slow path, only while fenced: ask the lease itself (a reply may have just arrived).
        let verdict = self.lease.lock().unwrap_or_else(|p| p.into_inner()).check(now);
        verdict.map_err(|fence| {
            self.log_refusal(peer, fence, now);
            fence.to_wire(self.id)
        })
    }

    fn log_refusal(&self, peer: &str, fence: Fence, now_ms: u64) {
        let Some(more) = self.refusal_log.take(now_ms) else { return };
        warn!(id = self.id, %peer, ?fence, more_since_last_line = more,
            "refusing client I/O with StaleLayout: no unexpired Up lease from the MDS");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REBUILD_MS: u64 = 10_000;

    fn reply(state: ServerState) -> HeartbeatResp {
        HeartbeatResp { state, rebuild_after_ms: REBUILD_MS }
    }

    #[test]
    fn starting_serves_nobody_until_the_first_up_reply() {
        let mut l = Lease::new(3_000);
        assert_eq!(l.check(0), Err(Fence::Starting));
        assert_eq!(l.check(u64::MAX), Err(Fence::Starting));
        assert_eq!(l.serves_until_ms(), None);
        l.on_reply(100, reply(ServerState::Up));
        assert_eq!(l.check(100), Ok(()));
        assert_eq!(l.serves_until_ms(), Some(3_100));
    }

    #[test]
    fn the_lease_runs_from_when_the_heartbeat_was_sent_and_lapses_without_a_reply() {
        let mut l = Lease::new(3_000);
        l.on_reply(1_000, reply(ServerState::Up));
        // Measured from the send, not the reply: the MDS heard it no earlier.
        assert_eq!(l.check(3_999), Ok(()));
        assert_eq!(l.check(4_000), Err(Fence::Lapsed { age_ms: 3_000, lease_ms: 3_000 }));
        // A failed heartbeat feeds nothing: the lease simply lapses. The next Up reply renews it.
        l.on_reply(5_000, reply(ServerState::Up));
        assert_eq!(l.check(5_001), Ok(()));
        assert_eq!(l.check(8_000), Err(Fence::Lapsed { age_ms: 3_000, lease_ms: 3_000 }));
    }

    #[test]
    fn a_spare_serves_and_draining_or_any_state_not_up_fences() {
        let mut l = Lease::new(3_000);
        l.on_reply(0, reply(ServerState::Spare));
        assert_eq!(l.check(1), Ok(()), "a drained spare holds new slots and serves");
        for s in [ServerState::Draining, ServerState::Down, ServerState::Failed, ServerState::Replaced] {
            l.on_reply(10, reply(s));
            assert_eq!(l.check(11), Err(Fence::NotUp(s)), "{s:?}");
            assert_eq!(l.serves_until_ms(), None);
        }
        // Drained: the MDS says Spare, and it serves again.
        l.on_reply(20, reply(ServerState::Spare));
        assert_eq!(l.check(21), Ok(()));
        // Serving → NotUp directly (replaced while its heartbeats were answered is impossible at the MDS, but the
        // machine does not care), and Lapsed → NotUp.
        l.on_reply(30, reply(ServerState::Draining));
        assert_eq!(l.check(31), Err(Fence::NotUp(ServerState::Draining)));
        l.on_reply(40, reply(ServerState::Up));
        assert!(matches!(l.check(40 + 3_000), Err(Fence::Lapsed { .. })));
        l.on_reply(5_000, reply(ServerState::Draining));
        assert_eq!(l.check(5_001), Err(Fence::NotUp(ServerState::Draining)));
    }

    #[test]
    fn the_lease_is_at_most_half_the_mds_rebuild_delay() {
        let mut l = Lease::new(60_000);
        assert_eq!(l.lease_ms(), 60_000, "before any reply: as configured (nothing is served anyway)");
        l.on_reply(0, reply(ServerState::Up));
        assert_eq!(l.lease_ms(), REBUILD_MS / 2, "clamped below the MDS's rebuild_after_ms");
        assert_eq!(l.check(REBUILD_MS / 2 - 1), Ok(()));
        assert!(matches!(l.check(REBUILD_MS / 2), Err(Fence::Lapsed { lease_ms: 5_000, .. })));
        // A shorter configured lease wins.
        let mut l = Lease::new(1_000);
        l.on_reply(0, reply(ServerState::Up));
        assert_eq!(l.lease_ms(), 1_000);
        assert_eq!(Lease::new(0).lease_ms(), 1, "never zero");
    }

    #[test]
    fn a_late_reply_to_an_older_heartbeat_never_extends_or_overrides() {
        let mut l = Lease::new(3_000);
        l.on_reply(2_000, reply(ServerState::Draining));
        l.on_reply(1_000, reply(ServerState::Up));
        assert_eq!(l.check(2_001), Err(Fence::NotUp(ServerState::Draining)));
        l.on_reply(3_000, reply(ServerState::Up));
        l.on_reply(2_500, reply(ServerState::Up));
        assert_eq!(l.serves_until_ms(), Some(6_000));
    }

    #[test]
    fn refusals_are_stale_layout_naming_the_server_and_why() {
        let e = Fence::NotUp(ServerState::Draining).to_wire(7);
        assert_eq!(e.code, ErrorCode::StaleLayout);
        assert!(e.message.contains("data server 7 not Up at the MDS (Draining)"), "{}", e.message);
        assert!(Fence::Starting.to_wire(7).message.contains("no heartbeat reply"));
        assert!(Fence::Lapsed { age_ms: 9, lease_ms: 5 }.to_wire(7).message.contains("lease lapsed"));
    }

    #[test]
    fn the_gate_serves_only_under_the_lease() {
        let gate = LeaseGate::new(3, 60_000);
        let e = gate.admit("peer").unwrap_err();
        assert_eq!(e.code, ErrorCode::StaleLayout);
        assert!(e.message.contains("no heartbeat reply"), "{}", e.message);
        assert_eq!(gate.check(), Err(Fence::Starting));
        let sent = gate.now_ms();
        assert_eq!(gate.on_reply(sent, reply(ServerState::Up)), REBUILD_MS / 2);
        assert_eq!(gate.admit("peer"), Ok(()));
        assert_eq!(gate.check(), Ok(()));
        gate.on_reply(gate.now_ms(), reply(ServerState::Draining));
        let e = gate.admit("peer").unwrap_err();
        assert!(e.message.contains("(Draining)"), "{}", e.message);
        // A lease already lapsed when its reply arrives (sent long ago) serves nobody.
        let gate = LeaseGate::new(3, 60_000);
        gate.on_reply(0, HeartbeatResp { state: ServerState::Up, rebuild_after_ms: 0 });
        assert!(gate.admit("peer").unwrap_err().message.contains("lease lapsed"));
    }
}
