//! A seeded simulator for the cluster's distributed protocols (issue 30 item 3).
//!
//! Everything runs on one thread in simulated time: an event queue ordered by (time, sequence number), one seeded
//! generator that every random choice draws from, a clock per simulated machine that drifts from real time by a
//! bounded rate, and a network whose messages are delayed, lost, duplicated and reordered, and cut by partitions.
//! One seed therefore replays exactly: same events, same order, same answers.
//!
//! Why our own and not turmoil or madsim: the protocol code under test is already written as pure state machines
//! fed by numbers (the data server's lease, the MDS's membership and duty lease, the ec row rule) and synchronous
//! store transactions behind the `MetaStore` trait, so it runs here as it is, called with the simulated clocks
//! (`weft_meta::ManualClock`). turmoil simulates tokio's sockets, which Weft's RPC reaches only through its own
//! fabric trait; madsim replaces tokio for the whole build. Neither is needed for what is simulated so far; the
//! seams used are named in ARCHITECTURE.md.
//!
//! A simulation is a test in `tests/`: it builds a world from a seed, runs it, checks its invariants after every
//! event, and returns the first broken one as an error. [`seeds::run`] runs many seeds and names the failing one with
//! the command that replays it.

pub mod clock;
pub mod queue;
pub mod rng;
pub mod seeds;
pub mod store;

pub use clock::DriftClock;
pub use queue::Queue;
pub use rng::Rng;
