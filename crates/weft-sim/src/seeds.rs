//! Running a simulation over many seeds, and naming the one that failed with the command that replays it.
//!
//! `WEFT_SIM_SEED=N` runs seed N alone; `WEFT_SIM_SEEDS=N` runs N seeds (from `WEFT_SIM_FIRST`, default 1) instead
//! of the test's default count (`make soak` runs more).

/// Runs `one` for each seed the environment asks for (else `default_seeds` seeds from 1). On the first failure,
/// panics with the simulation's name, the seed, what broke and how to replay it: `cargo test --release` with
/// `where_` (e.g. `-p weft-sim --test membership`) and the test's name.
pub fn run(name: &str, where_: &str, default_seeds: u64, one: impl Fn(u64) -> Result<Summary, String>) -> Summary {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let seeds: Vec<u64> = match env("WEFT_SIM_SEED") {
        Some(seed) => vec![seed],
        None => {
            let first = env("WEFT_SIM_FIRST").unwrap_or(1);
            (first..first + env("WEFT_SIM_SEEDS").unwrap_or(default_seeds)).collect()
        }
    };
    let mut total = Summary::default();
    for seed in seeds {
        match one(seed) {
            Ok(s) => total.add(&s),
            Err(why) => panic!(
                "simulation {name}, seed {seed}: {why}\n  replay: WEFT_SIM_SEED={seed} cargo test --release {where_} \
                 {name} -- --nocapture"
            ),
        }
    }
    eprintln!("simulation {name}: {total}");
    total
}

/// What a run covered, so a test can assert that its faults and checks happened at all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    pub seeds: u64,
    pub events: u64,
    pub checks: u64,
    /// Named counters (faults injected, outcomes seen), summed over seeds.
    pub counts: std::collections::BTreeMap<&'static str, u64>,
}

impl Summary {
    pub fn count(&mut self, what: &'static str) {
        *self.counts.entry(what).or_default() += 1;
    }

    pub fn get(&self, what: &str) -> u64 {
        self.counts.get(what).copied().unwrap_or(0)
    }

    fn add(&mut self, s: &Summary) {
        self.seeds += s.seeds.max(1);
        self.events += s.events;
        self.checks += s.checks;
        for (k, v) in &s.counts {
            *self.counts.entry(k).or_default() += v;
        }
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} seeds, {} events, {} invariant checks", self.seeds, self.events, self.checks)?;
        for (k, v) in &self.counts {
            write!(f, ", {k} {v}")?;
        }
        Ok(())
    }
}
