//! The metadata service at scale, simulated (issue 30 item 3): how its membership and placement work grows with
//! the number of data servers, measured on the real `Namespace` over simulated time. Not a test of behaviour: it
//! prints a table (docs/bench.md quotes it). Run: `make sim-scale` (`cargo test --release -p weft-sim --test scale
//! -- --ignored --nocapture`).
//!
//! For each cluster size, one service on a store shared as PostgreSQL is (`SimStore`, no faults): every data
//! server beats every `HEARTBEAT_MS` of simulated time, the service steps its duty lease and its membership task
//! as `weft meta` does, and clients create files. The time the service's code takes for each (wall clock, this
//! machine) is summed, so the table shows the cost per simulated second of one service, and its share of one core.

use std::sync::Arc;
use std::time::{Duration, Instant};

use weft_meta::{Cred, ManualClock, MemStore, Namespace};
use weft_proto::msg::{CreateReq, RegisterServerDevReq};
use weft_proto::{ROOT_INO, Request, Response};
use weft_sim::store::SimStore;
use weft_sim::{Queue, Rng};

const HEARTBEAT_MS: u64 = 1000;
const MEMBERSHIP_MS: u64 = 1000;
const SIMULATED_S: u64 = 20;
const MS: u64 = 1000;

#[derive(Debug)]
enum Ev {
    Beat(u32),
    Tick,
    Duty,
    Create(u64),
}

/// Wall-clock time spent in the service's code, per kind of work.
#[derive(Default)]
struct Spent {
    beats: (u64, Duration),
    ticks: (u64, Duration),
    duty: (u64, Duration),
    creates: (u64, Duration),
}

fn timed<R>(into: &mut (u64, Duration), f: impl FnOnce() -> R) -> R {
    let t = Instant::now();
    let r = f();
    into.0 += 1;
    into.1 += t.elapsed();
    r
}

fn run(servers: u32, creates_per_s: u64) -> Spent {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000_000_000));
    let store = SimStore::new(Arc::new(MemStore::new()), 1);
    let ns = Namespace::new(store, clock.clone(), 3 * HEARTBEAT_MS).expect("a service");
    let mut q = Queue::new(1 << 20);
    let mut rng = Rng::new(u64::from(servers));
    for id in 0..servers {
        q.after(rng.below(HEARTBEAT_MS * MS), Ev::Beat(id));
    }
    q.after(0, Ev::Duty);
    q.after(0, Ev::Tick);
    q.after(1000 * MS, Ev::Create(0));
    let mut spent = Spent::default();
    let mut at_ms = 0;
    while let Some(ev) = q.next_before(SIMULATED_S * 1_000_000) {
        let now_ms = q.now_us() / MS;
        clock.advance_ms(now_ms - at_ms);
        at_ms = now_ms;
        match ev {
            Ev::Beat(id) => {
                let req = Request::RegisterServerDev(RegisterServerDevReq {
                    id,
                    addr: format!("10.0.{}.{}:7000", id / 250, id % 250),
                    space: weft_proto::SpaceStatDev {
                        space: weft_proto::SpaceStat { bytes_total: 1 << 40, bytes_free: 1 << 39, objects: 0 },
                        device: Default::default(),
                    },
                });
                let r = timed(&mut spent.beats, || ns.execute(&req));
                assert!(matches!(r, Ok(Response::RegisterServerDev(_))), "{r:?}");
                q.after(HEARTBEAT_MS * MS, Ev::Beat(id));
            }
            Ev::Tick => {
                timed(&mut spent.ticks, || ns.membership_tick(512)).expect("a tick");
                q.after(MEMBERSHIP_MS * MS, Ev::Tick);
            }
            Ev::Duty => {
                timed(&mut spent.duty, || ns.duty_step()).expect("a duty step");
                q.after(ns.duty_step_every_ms() * MS, Ev::Duty);
            }
            Ev::Create(n) => {
                let req = Request::Create(CreateReq {
                    parent: ROOT_INO,
                    name: format!("f{n}"),
                    mode: 0o644,
                    exclusive: true,
                });
                let r = timed(&mut spent.creates, || ns.execute_as(&Cred::root(), &req));
                assert!(matches!(r, Ok(Response::Create(_))), "{r:?}");
                q.after(1_000_000 / creates_per_s, Ev::Create(n + 1));
            }
        }
    }
    spent
}

fn per(d: (u64, Duration)) -> f64 {
    if d.0 == 0 { 0.0 } else { d.1.as_secs_f64() * 1e6 / d.0 as f64 }
}

/// The median of three runs of each figure.
fn median3(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
#[ignore = "a measurement, not a check: make sim-scale"]
fn the_metadata_service_at_scale() {
    println!(
        "| data servers | heartbeats/s | µs per heartbeat | µs per membership tick | µs per create (layout over every server) | one service's core share, heartbeats + ticks |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for servers in [10, 100, 300, 1000, 3000] {
        let runs: Vec<Spent> = (0..3).map(|_| run(servers, 100)).collect();
        let column = |f: &dyn Fn(&Spent) -> f64| median3(runs.iter().map(f).collect());
        let share = column(&|s| (s.beats.1 + s.ticks.1 + s.duty.1).as_secs_f64() / SIMULATED_S as f64);
        println!(
            "| {servers} | {} | {:.1} | {:.0} | {:.0} | {:.1} % |",
            u64::from(servers) * 1000 / HEARTBEAT_MS,
            column(&|s| per(s.beats)),
            column(&|s| per(s.ticks)),
            column(&|s| per(s.creates)),
            share * 100.0
        );
    }
}
