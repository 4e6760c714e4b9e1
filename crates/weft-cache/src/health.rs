//! Whether a daemon is asked: a pure state machine per daemon (no I/O; the caller passes the time in ms).
//!
//! ```text
//! Up ──error──▶ Failing(1) ──error──▶ … Failing(E−1) ──error──▶ Ejected(until now + eject_ms)
//!  ▲               │ success                                          │ time passes
//!  └───────────────┘◀──────────────────── success ──── Probing ◀──────┘
//!                                                        │ error
//!                                                        └──▶ Ejected(until now + eject_ms)
//! ```
//!
//! An ejected daemon is routed around (its keys go to the next daemon on the ring); once `eject_ms` has passed
//! exactly one request is let through as a probe, the others keep routing around until it answers. A dead
//! daemon so costs one timed-out request per `eject_ms`, never an error to the caller.

/// What the caller may do with a daemon now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Send the request.
    Yes,
    /// Send it: it is the one probe of an ejected daemon; report its outcome.
    Probe,
    /// Route around this daemon.
    No,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthState {
    Up,
    /// Consecutive errors or timeouts so far (1 ..= errors_to_eject − 1).
    Failing(u32),
    /// Not asked until this time (ms).
    Ejected {
        until_ms: u64,
    },
    /// One probe is in flight.
    Probing,
}

/// One daemon's health.
#[derive(Debug, Clone)]
pub struct Health {
    state: HealthState,
    errors_to_eject: u32,
    eject_ms: u64,
}

impl Health {
    /// A daemon that starts `Up`, is ejected after `errors_to_eject` consecutive failures (at least 1) and stays
    /// out `eject_ms` each time.
    pub fn new(errors_to_eject: u32, eject_ms: u64) -> Health {
        Health { state: HealthState::Up, errors_to_eject: errors_to_eject.max(1), eject_ms }
    }

    pub fn state(&self) -> HealthState {
        self.state
    }

    pub fn is_ejected(&self) -> bool {
        matches!(self.state, HealthState::Ejected { .. } | HealthState::Probing)
    }

    /// May a request go to this daemon at `now_ms`? Taking `Probe` moves an expired ejection to `Probing`.
    pub fn admit(&mut self, now_ms: u64) -> Admit {
        match self.state {
            HealthState::Up | HealthState::Failing(_) => Admit::Yes,
            HealthState::Ejected { until_ms } if now_ms >= until_ms => {
                self.state = HealthState::Probing;
                Admit::Probe
            }
            HealthState::Ejected { .. } | HealthState::Probing => Admit::No,
        }
    }

    /// Would [`admit`](Self::admit) say anything but `No` (without taking the probe)?
    pub fn admissible(&self, now_ms: u64) -> bool {
        match self.state {
            HealthState::Up | HealthState::Failing(_) => true,
            HealthState::Ejected { until_ms } => now_ms >= until_ms,
            HealthState::Probing => false,
        }
    }

    /// A request answered (a hit or a miss: the daemon works).
    pub fn success(&mut self) {
        self.state = HealthState::Up;
    }

    /// A request failed (connection refused or lost, protocol error, or its deadline passed) at `now_ms`.
    pub fn failure(&mut self, now_ms: u64) {
        let eject = HealthState::Ejected { until_ms: now_ms.saturating_add(self.eject_ms) };
        self.state = match self.state {
            HealthState::Up if self.errors_to_eject <= 1 => eject,
            HealthState::Up => HealthState::Failing(1),
            HealthState::Failing(n) if n + 1 >= self.errors_to_eject => eject,
            HealthState::Failing(n) => HealthState::Failing(n + 1),
            // A probe failed, or a request admitted before the ejection came back late: stay out.
            HealthState::Probing => eject,
            HealthState::Ejected { until_ms } => HealthState::Ejected { until_ms },
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn up_failing_ejected_probing_up() {
        let mut h = Health::new(3, 1000);
        assert_eq!(h.state(), HealthState::Up);
        assert_eq!(h.admit(0), Admit::Yes);
        h.failure(10);
        assert_eq!(h.state(), HealthState::Failing(1));
        assert_eq!(h.admit(10), Admit::Yes, "a failing daemon is still asked");
        h.failure(20);
        assert_eq!(h.state(), HealthState::Failing(2));
        h.failure(30);
        assert_eq!(h.state(), HealthState::Ejected { until_ms: 1030 });
        assert!(h.is_ejected());
        assert_eq!(h.admit(500), Admit::No);
        assert!(!h.admissible(1029));
        assert!(h.admissible(1030));
        assert_eq!(h.admit(1030), Admit::Probe);
        assert_eq!(h.state(), HealthState::Probing);
        assert_eq!(h.admit(1031), Admit::No, "one probe at a time");
        assert!(!h.admissible(1031));
        h.success();
        assert_eq!(h.state(), HealthState::Up);
        assert_eq!(h.admit(1032), Admit::Yes);
    }

    #[test]
    fn a_success_resets_the_count() {
        let mut h = Health::new(3, 1000);
        h.failure(0);
        h.failure(0);
        assert_eq!(h.state(), HealthState::Failing(2));
        h.success();
        assert_eq!(h.state(), HealthState::Up);
        h.failure(0);
        assert_eq!(h.state(), HealthState::Failing(1), "errors must be consecutive");
    }

    #[test]
    fn a_failed_probe_ejects_again() {
        let mut h = Health::new(1, 100);
        h.failure(0);
        assert_eq!(h.state(), HealthState::Ejected { until_ms: 100 }, "E = 1 ejects at the first error");
        assert_eq!(h.admit(100), Admit::Probe);
        h.failure(150);
        assert_eq!(h.state(), HealthState::Ejected { until_ms: 250 });
        assert_eq!(h.admit(200), Admit::No);
        assert_eq!(h.admit(250), Admit::Probe);
    }

    #[test]
    fn late_failures_while_ejected_do_not_extend_it() {
        let mut h = Health::new(2, 100);
        h.failure(0);
        h.failure(0);
        assert_eq!(h.state(), HealthState::Ejected { until_ms: 100 });
        h.failure(50);
        assert_eq!(h.state(), HealthState::Ejected { until_ms: 100 });
        // A late success of a request admitted before the ejection: the daemon answers, so it is back.
        h.success();
        assert_eq!(h.state(), HealthState::Up);
        assert_eq!(Health::new(0, 5).errors_to_eject, 1, "zero is taken as one");
    }
}
