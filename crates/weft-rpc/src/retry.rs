//! The exactly-once retry decision of one call, as a pure state machine: [`crate::RpcClient::call`] makes one
//! attempt at a time, reports how it ended ([`Event`]), and does what the machine answers ([`Next`]). No I/O and
//! no clock here; back-offs come out as durations.
//!
//! Every attempt of a call goes out on the same (slot, sequence), so a server that already ran it answers the
//! retry from its reply cache instead of running it twice. Two things break that promise, and the machine tracks
//! both:
//! - a non-idempotent attempt went out and no answer came back: it may have run ([`State::MaybeRan`]); giving up
//!   now says so ([`RpcError::MaybeApplied`]) rather than "never executed";
//! - after such an attempt, the server refused our session (it restarted or evicted us): the call continues on a
//!   new session with a new sequence, whose reply cache knows nothing of the first attempt
//!   ([`State::SessionLost`]); if that retry is answered with an error, the first attempt may still have run.
//!
//! A call has `attempts_max` attempts, and with a failover window (`ClientConfig::failover_timeout_ms`) also every
//! attempt that starts within that window of the call's beginning: the caller reports the time passed with each
//! event ([`Retry::on_at`]), so the machine stays free of clocks.

use std::time::Duration;

use weft_proto::{ErrorCode, Op, WireError};

use crate::error::RpcError;

/// Back-off before attempt `n` (n ≥ 2) is `n` (at most 10) times this, so a restarting server is not hammered.
const BACKOFF_STEP: Duration = Duration::from_millis(20);

/// What this call's attempts so far allow the machine to promise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Nothing that may have run went out unanswered: giving up can say "never executed".
    Clean,
    /// A non-idempotent attempt went out and no answer came back: it may have run.
    MaybeRan,
    /// The server lost our session after a non-idempotent attempt went out; the call continues in a new session
    /// whose reply cache cannot recognise the first attempt.
    SessionLost,
}

/// How one attempt ended, short of a reply that completes the call.
#[derive(Debug)]
pub enum Event {
    /// No connection to the server (nothing was sent).
    ConnectFailed(std::io::Error),
    /// The live connection is not the one the call's memory registrations belong to (nothing was sent).
    WrongConnection,
    /// The connection was dead before the request went out (nothing was sent).
    Closed,
    /// The send failed or timed out: part of the request may have gone out.
    SendFailed(String),
    /// The request went out; no reply came (timeout, or the connection was lost).
    NoReply(String),
    /// The server answered with an error.
    ErrorReply(WireError),
}

/// What the call does next.
#[derive(Debug)]
pub enum Next {
    /// Wait `backoff` (zero: none), then send on the same (slot, sequence), on the live connection (reconnecting
    /// if it is dead).
    Send { backoff: Duration },
    /// Open a new session (if the refused one is still current), take the slot's next sequence in it, wait
    /// `backoff`, then send.
    RenewSession { backoff: Duration },
    /// Give up with `error`. With `forget_session`, the slot's sequence may now disagree with the server's, so
    /// the next call opens a new session.
    GiveUp { error: RpcError, forget_session: bool },
}

/// The retry state of one call.
#[derive(Debug)]
pub struct Retry {
    addr: String,
    op: Op,
    attempts_max: u32,
    /// The attempt under way (1 = the first).
    attempt: u32,
    state: State,
    /// Why the last attempt failed, for the "maybe applied" message.
    last_failure: String,
    /// The last attempt found no connection.
    connect_failed: Option<std::io::Error>,
    /// Attempts go on past `attempts_max` while `elapsed_ms` is below this (0: no failover window).
    failover_ms: u64,
    /// Time since the call began, as of the last event.
    elapsed_ms: u64,
    /// The server keeps this call's outcome beyond sessions (its once block): an error answering a retry in a new
    /// session is the server's answer, not a sign the first attempt may have run.
    durable_once: bool,
}

impl Retry {
    pub fn new(addr: &str, op: Op, attempts_max: u32) -> Retry {
        Retry {
            addr: addr.to_string(),
            op,
            attempts_max,
            attempt: 0,
            state: State::Clean,
            last_failure: String::from("no attempt made"),
            connect_failed: None,
            failover_ms: 0,
            elapsed_ms: 0,
            durable_once: false,
        }
    }

    /// The call carries a once block that the server honours (`ClientConfig::once_tags`).
    pub fn with_durable_once(mut self, durable_once: bool) -> Retry {
        self.durable_once = durable_once;
        self
    }

    /// Keeps attempting, past `attempts_max`, until `failover_ms` after the call began.
    pub fn with_failover(mut self, failover_ms: u64) -> Retry {
        self.failover_ms = failover_ms;
        self
    }

    /// Whether another attempt may start: attempts are left, or the failover window is still open.
    fn attempts_left(&self) -> bool {
        self.attempt < self.attempts_max || self.elapsed_ms < self.failover_ms
    }

    /// Whether the call has used up its attempts and goes on only because of the failover window (for logs).
    pub fn failing_over(&self) -> bool {
        self.attempt > self.attempts_max && self.failover_ms > 0
    }

    /// As [`Retry::on`], `elapsed_ms` after the call began.
    pub fn on_at(&mut self, event: Event, elapsed_ms: u64) -> Next {
        self.elapsed_ms = elapsed_ms;
        self.on(event)
    }

    /// The first step: send at once (or, with no attempts allowed, give up).
    pub fn start(&mut self) -> Next {
        self.next_attempt()
    }

    /// The attempt under way (1 = the first), for logs.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// What the attempts so far allow the call to promise.
    pub fn state(&self) -> State {
        self.state
    }

    /// Takes how the current attempt ended; says what to do next.
    pub fn on(&mut self, event: Event) -> Next {
        // Every event but a connect failure means a connection was there.
        if !matches!(event, Event::ConnectFailed(_)) {
            self.connect_failed = None;
        }
        // Whether an attempt before this one may have run (this one's own refusal says nothing of those).
        let earlier_may_have_run = self.state != State::Clean;
        if matches!(event, Event::SendFailed(_) | Event::NoReply(_) | Event::ErrorReply(_))
            && !self.op.is_idempotent()
            && self.state == State::Clean
        {
            self.state = State::MaybeRan;
        }
        match event {
            Event::ConnectFailed(e) => {
                self.last_failure = format!("connect: {e}");
                self.connect_failed = Some(e);
                self.next_attempt()
            }
            Event::WrongConnection => {
                let error = if self.state == State::Clean {
                    RpcError::RegionsLost { addr: self.addr.clone() }
                } else {
                    self.maybe_applied(self.last_failure.clone())
                };
                Next::GiveUp { error, forget_session: false }
            }
            Event::Closed => {
                self.last_failure = "connection closed".into();
                self.next_attempt()
            }
            Event::SendFailed(reason) | Event::NoReply(reason) => {
                self.last_failure = reason;
                self.next_attempt()
            }
            Event::ErrorReply(err) => {
                let refused = matches!(err.code, ErrorCode::StaleSession | ErrorCode::SeqMisordered);
                if refused && self.attempts_left() {
                    if self.state == State::MaybeRan {
                        self.state = State::SessionLost;
                    }
                    self.attempt += 1;
                    return Next::RenewSession { backoff: self.backoff() };
                }
                let error = if refused && earlier_may_have_run {
                    // No attempt left to ask again in a new session: whether the earlier one ran is unknown.
                    self.maybe_applied(format!(
                        "an earlier attempt may have run, and the server then refused the session: {err}"
                    ))
                } else if self.state == State::SessionLost && !self.durable_once {
                    self.maybe_applied(format!(
                        "the server lost the session after the request was sent, and the retry answered: {err}"
                    ))
                } else {
                    RpcError::Remote(err)
                };
                // A refused session with no attempt left to renew it in is still dead: forget it, so the next
                // call opens a new one instead of being refused forever (with `attempts_max` 1, every call).
                Next::GiveUp { error, forget_session: refused }
            }
        }
    }

    /// Another attempt on the same (slot, sequence) if any is left; otherwise gives up.
    fn next_attempt(&mut self) -> Next {
        if self.attempts_left() {
            self.attempt += 1;
            return Next::Send { backoff: self.backoff() };
        }
        let error = if self.state != State::Clean {
            let reason = std::mem::take(&mut self.last_failure);
            self.maybe_applied(reason)
        } else if let Some(source) = self.connect_failed.take() {
            RpcError::Connect { addr: self.addr.clone(), source }
        } else {
            RpcError::Timeout { addr: self.addr.clone(), op: self.op, attempts: self.attempt }
        };
        Next::GiveUp { error, forget_session: true }
    }

    /// Back-off before the current attempt.
    fn backoff(&self) -> Duration {
        if self.attempt <= 1 { Duration::ZERO } else { BACKOFF_STEP * self.attempt.min(10) }
    }

    fn maybe_applied(&self, reason: String) -> RpcError {
        RpcError::MaybeApplied { addr: self.addr.clone(), op: self.op, reason }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADDR: &str = "ds:1";
    /// Not idempotent: a lost attempt may have run. (Any op with the property does; the machine only asks it.)
    const WRITE: Op = Op::Rename;
    /// Idempotent: a lost attempt changes nothing.
    const READ: Op = Op::Null;

    #[test]
    fn the_test_ops_have_the_property_they_stand_for() {
        assert!(!WRITE.is_idempotent());
        assert!(READ.is_idempotent());
    }

    fn refused() -> WireError {
        WireError::new(ErrorCode::StaleSession, "unknown session")
    }

    fn misordered() -> WireError {
        WireError::new(ErrorCode::SeqMisordered, "sequence out of order")
    }

    fn other_error() -> WireError {
        WireError::new(ErrorCode::NotFound, "no such object")
    }

    fn io_error() -> std::io::Error {
        std::io::Error::from(std::io::ErrorKind::ConnectionRefused)
    }

    /// Makes an event afresh (`WireError` and `io::Error` are not `Clone`).
    type MakeEvent = fn() -> Event;

    /// Every event, by name.
    fn events() -> Vec<(&'static str, MakeEvent)> {
        vec![
            ("connect failed", || Event::ConnectFailed(io_error())),
            ("wrong connection", || Event::WrongConnection),
            ("closed", || Event::Closed),
            ("send failed", || Event::SendFailed("send failed: broken pipe".into())),
            ("no reply", || Event::NoReply("no reply within 10 ms".into())),
            ("refused", || Event::ErrorReply(refused())),
            ("misordered", || Event::ErrorReply(misordered())),
            ("error reply", || Event::ErrorReply(other_error())),
        ]
    }

    /// A machine for `op` with `attempts_max`, started, then driven into `state` (attempts used doing so count).
    fn machine_in(op: Op, attempts_max: u32, state: State) -> Retry {
        let mut r = Retry::new(ADDR, op, attempts_max);
        assert!(matches!(r.start(), Next::Send { backoff } if backoff.is_zero()));
        match state {
            State::Clean => {}
            State::MaybeRan => {
                assert!(matches!(r.on(Event::NoReply("lost".into())), Next::Send { .. }));
            }
            State::SessionLost => {
                assert!(matches!(r.on(Event::NoReply("lost".into())), Next::Send { .. }));
                assert!(matches!(r.on(Event::ErrorReply(refused())), Next::RenewSession { .. }));
            }
        }
        assert_eq!(r.state(), state);
        r
    }

    /// Spends attempts with events that change nothing but the count, until the last one is under way.
    fn to_last_attempt(r: &mut Retry) {
        while r.attempt() < r.attempts_max {
            assert!(matches!(r.on(Event::Closed), Next::Send { .. }));
        }
    }

    #[test]
    fn the_first_attempt_goes_out_at_once_and_none_allowed_gives_up() {
        let mut r = Retry::new(ADDR, WRITE, 3);
        assert!(matches!(r.start(), Next::Send { backoff } if backoff.is_zero()));
        assert_eq!(r.attempt(), 1);
        let mut none = Retry::new(ADDR, WRITE, 0);
        match none.start() {
            Next::GiveUp { error: RpcError::Timeout { attempts: 0, .. }, forget_session: true } => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn backoff_grows_with_the_attempt_and_stops_growing_at_ten() {
        let mut r = Retry::new(ADDR, READ, 12);
        r.start();
        let mut seen = Vec::new();
        for _ in 2..=12 {
            match r.on(Event::NoReply("lost".into())) {
                Next::Send { backoff } => seen.push(backoff.as_millis()),
                other => panic!("{other:?}"),
            }
        }
        // Attempts 2..=12 wait 2..=10 steps of 20 ms, then stay at 10.
        let steps: Vec<u128> = [2, 3, 4, 5, 6, 7, 8, 9, 10, 10, 10].iter().map(|n| n * 20).collect();
        assert_eq!(seen, steps);
        let mut s = Retry::new(ADDR, READ, 3);
        s.start();
        assert!(
            matches!(s.on(Event::ErrorReply(refused())), Next::RenewSession { backoff } if backoff.as_millis() == 40)
        );
    }

    /// Every state × every event, with attempts left: the decision and the state after it.
    #[test]
    fn every_transition_with_attempts_left() {
        for op in [WRITE, READ] {
            for state in [State::Clean, State::MaybeRan, State::SessionLost] {
                if op.is_idempotent() && state != State::Clean {
                    continue; // an idempotent call never leaves Clean
                }
                for (name, event) in events() {
                    let mut r = machine_in(op, 10, state);
                    let before = r.attempt();
                    let next = r.on(event());
                    let sent = matches!(name, "send failed" | "no reply" | "refused" | "misordered" | "error reply");
                    let after =
                        if sent && !op.is_idempotent() && state == State::Clean { State::MaybeRan } else { state };
                    let ctx = format!("{op:?} {state:?} {name}: {next:?}");
                    match name {
                        "connect failed" | "closed" | "send failed" | "no reply" => {
                            assert!(matches!(next, Next::Send { backoff } if !backoff.is_zero()), "{ctx}");
                            assert_eq!(r.attempt(), before + 1, "{ctx}");
                            assert_eq!(r.state(), after, "{ctx}");
                        }
                        "wrong connection" => match (state, next) {
                            (
                                State::Clean,
                                Next::GiveUp { error: RpcError::RegionsLost { .. }, forget_session: false },
                            ) => {}
                            (
                                _,
                                Next::GiveUp { error: RpcError::MaybeApplied { reason, .. }, forget_session: false },
                            ) => {
                                assert_ne!(state, State::Clean, "{ctx}");
                                assert_eq!(reason, "lost", "the last failure is the reason: {ctx}");
                            }
                            (_, next) => panic!("{op:?} {state:?} {name}: {next:?}"),
                        },
                        "refused" | "misordered" => {
                            assert!(matches!(next, Next::RenewSession { backoff } if !backoff.is_zero()), "{ctx}");
                            assert_eq!(r.attempt(), before + 1, "{ctx}");
                            let lost = if after == State::MaybeRan { State::SessionLost } else { after };
                            assert_eq!(r.state(), lost, "{ctx}");
                        }
                        "error reply" => match (state, next) {
                            (
                                State::SessionLost,
                                Next::GiveUp { error: RpcError::MaybeApplied { reason, .. }, forget_session: false },
                            ) => {
                                assert!(reason.contains("lost the session"), "{ctx}");
                            }
                            (
                                State::Clean | State::MaybeRan,
                                Next::GiveUp { error: RpcError::Remote(e), forget_session: false },
                            ) => {
                                assert_eq!(e.code, ErrorCode::NotFound, "{ctx}");
                            }
                            (_, next) => panic!("{op:?} {state:?} {name}: {next:?}"),
                        },
                        _ => unreachable!(),
                    }
                }
            }
        }
    }

    /// Every state × every event on the last attempt: what giving up says.
    #[test]
    fn every_transition_on_the_last_attempt() {
        for op in [WRITE, READ] {
            for state in [State::Clean, State::MaybeRan, State::SessionLost] {
                if op.is_idempotent() && state != State::Clean {
                    continue;
                }
                for (name, event) in events() {
                    let mut r = machine_in(op, 4, state);
                    to_last_attempt(&mut r);
                    let next = r.on(event());
                    let sent = matches!(name, "send failed" | "no reply" | "refused" | "misordered" | "error reply");
                    let may_have_run = state != State::Clean || (sent && !op.is_idempotent());
                    let ctx = format!("{op:?} {state:?} {name}: {next:?}");
                    let Next::GiveUp { error, forget_session } = next else { panic!("{ctx}") };
                    match name {
                        "connect failed" | "closed" | "send failed" | "no reply" => {
                            assert!(forget_session, "exhausted attempts forget the session: {ctx}");
                            match (may_have_run, name, error) {
                                (true, _, RpcError::MaybeApplied { reason, .. }) => match name {
                                    "connect failed" => assert!(reason.starts_with("connect: "), "{reason}"),
                                    "closed" => assert_eq!(reason, "connection closed"),
                                    "send failed" => assert_eq!(reason, "send failed: broken pipe"),
                                    _ => assert_eq!(reason, "no reply within 10 ms"),
                                },
                                (false, "connect failed", RpcError::Connect { source, .. }) => {
                                    assert_eq!(source.kind(), std::io::ErrorKind::ConnectionRefused);
                                }
                                (false, _, RpcError::Timeout { attempts: 4, op: o, .. }) => assert_eq!(o, op),
                                (_, _, error) => panic!("{op:?} {state:?} {name}: {error:?}"),
                            }
                        }
                        "wrong connection" => {
                            assert!(!forget_session, "{ctx}");
                            match error {
                                RpcError::RegionsLost { .. } => assert_eq!(state, State::Clean),
                                RpcError::MaybeApplied { .. } => assert_ne!(state, State::Clean),
                                error => panic!("{op:?} {state:?} {name}: {error:?}"),
                            }
                        }
                        "refused" | "misordered" | "error reply" => {
                            // No attempt left to renew the session in: the refusal is the answer, and a refused
                            // session is forgotten so the next call opens a new one.
                            assert_eq!(forget_session, name != "error reply", "{ctx}");
                            // A refusal after an attempt that may have run leaves its outcome unknown (the
                            // session simulation, weft-sim tests/sessions.rs, found it reported as never run).
                            let refusal = name != "error reply";
                            match error {
                                RpcError::MaybeApplied { reason, .. } if refusal => {
                                    assert_ne!(state, State::Clean, "{ctx}");
                                    assert!(reason.contains("refused the session"), "{reason}");
                                }
                                RpcError::MaybeApplied { reason, .. } => {
                                    assert_eq!(state, State::SessionLost);
                                    assert!(reason.contains("the retry answered"), "{reason}");
                                }
                                RpcError::Remote(_) if refusal => assert_eq!(state, State::Clean, "{ctx}"),
                                RpcError::Remote(_) => assert_ne!(state, State::SessionLost),
                                error => panic!("{op:?} {state:?} {name}: {error:?}"),
                            }
                        }
                        _ => unreachable!(),
                    }
                }
            }
        }
    }

    #[test]
    fn a_connect_failure_only_names_the_error_if_it_was_the_last_attempts_failure() {
        let mut r = Retry::new(ADDR, READ, 2);
        r.start();
        assert!(matches!(r.on(Event::ConnectFailed(io_error())), Next::Send { .. }));
        match r.on(Event::Closed) {
            Next::GiveUp { error: RpcError::Timeout { attempts: 2, .. }, forget_session: true } => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_refused_write_counts_as_sent_so_its_retry_cannot_promise_exactly_once() {
        // The server cannot tell us whether it refused the request before running it, so a write whose first
        // answer is a refusal continues in a new session as "session lost": an error answering the retry is
        // reported as maybe applied, not as the server's error.
        let mut r = Retry::new(ADDR, WRITE, 5);
        r.start();
        assert!(matches!(r.on(Event::ErrorReply(refused())), Next::RenewSession { .. }));
        assert_eq!(r.state(), State::SessionLost);
        match r.on(Event::ErrorReply(other_error())) {
            Next::GiveUp { error: RpcError::MaybeApplied { .. }, forget_session: false } => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_failover_window_keeps_attempting_past_attempts_max_until_it_closes() {
        for op in [WRITE, READ] {
            let mut r = Retry::new(ADDR, op, 2).with_failover(1_000);
            r.start();
            assert!(matches!(r.on_at(Event::ConnectFailed(io_error()), 10), Next::Send { .. }));
            assert!(!r.failing_over());
            // attempts_max is spent: the window alone allows more, with the back-off capped at ten steps.
            for (k, elapsed_ms) in [100, 400, 999].into_iter().enumerate() {
                let event = if k == 1 { Event::NoReply("lost".into()) } else { Event::ConnectFailed(io_error()) };
                match r.on_at(event, elapsed_ms) {
                    Next::Send { backoff } => assert!(backoff <= BACKOFF_STEP * 10, "{backoff:?}"),
                    other => panic!("{op:?} at {elapsed_ms} ms: {other:?}"),
                }
                assert!(r.failing_over());
            }
            // A refused session inside the window is renewed, not given up on.
            assert!(matches!(r.on_at(Event::ErrorReply(refused()), 999), Next::RenewSession { .. }));
            let next = r.on_at(Event::ConnectFailed(io_error()), 1_000);
            match (op.is_idempotent(), next) {
                (false, Next::GiveUp { error: RpcError::MaybeApplied { reason, .. }, forget_session: true }) => {
                    assert!(reason.starts_with("connect: "), "{reason}");
                }
                (true, Next::GiveUp { error: RpcError::Connect { .. }, forget_session: true }) => {}
                (_, other) => panic!("{op:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn with_a_durable_once_block_a_retry_in_a_new_session_answers_for_itself() {
        // The server keeps the first attempt's outcome by its once block: had it run, the retry would have been
        // answered with its reply; an error is therefore the server's real answer.
        let mut r = Retry::new(ADDR, WRITE, 5).with_durable_once(true);
        r.start();
        assert!(matches!(r.on(Event::NoReply("lost".into())), Next::Send { .. }));
        assert!(matches!(r.on(Event::ErrorReply(refused())), Next::RenewSession { .. }));
        assert_eq!(r.state(), State::SessionLost);
        match r.on(Event::ErrorReply(other_error())) {
            Next::GiveUp { error: RpcError::Remote(e), forget_session: false } => {
                assert_eq!(e.code, ErrorCode::NotFound)
            }
            other => panic!("{other:?}"),
        }
        // Giving up on silence still cannot say whether it ran.
        let mut r = Retry::new(ADDR, WRITE, 1).with_durable_once(true);
        r.start();
        assert!(matches!(
            r.on(Event::NoReply("lost".into())),
            Next::GiveUp { error: RpcError::MaybeApplied { .. }, .. }
        ));
    }

    #[test]
    fn without_a_failover_window_time_changes_nothing() {
        let mut r = Retry::new(ADDR, READ, 2);
        r.start();
        assert!(matches!(r.on_at(Event::Closed, 0), Next::Send { .. }));
        match r.on_at(Event::Closed, 0) {
            Next::GiveUp { error: RpcError::Timeout { attempts: 2, .. }, forget_session: true } => {}
            other => panic!("{other:?}"),
        }
    }
}
