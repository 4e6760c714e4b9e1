//! Running a simulation over many seeds, and naming the one that failed with the command that replays it.
//!
//! `WEFT_SIM_SEED=N` runs seed N alone; `WEFT_SIM_SEEDS=N` runs N seeds (from `WEFT_SIM_FIRST`, default 1) instead
//! of the test's default count (`make soak` runs more).

/// Runs `one` for each seed the environment asks for (else `default_seeds` seeds from 1). On the first failure (an
/// error, or a panic inside the world), panics with the simulation's name, the seed, what broke and how to replay
/// it: `cargo test --release` with `where_` (e.g. `-p weft-sim --test membership`) and the test's name.
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
        // A panic inside the world (an `assert!` or `invariant!` of the code under test) is a failure of this seed
        // too, and names it as an error does.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| one(seed)));
        let why = match outcome {
            Ok(Ok(s)) => {
                total.add(&s);
                continue;
            }
            Ok(Err(why)) => why,
            Err(payload) => format!("panicked: {}", panic_message(payload.as_ref())),
        };
        panic!(
            "simulation {name}, seed {seed}: {why}\n  replay: WEFT_SIM_SEED={seed} cargo test --release {where_} \
             {name} -- --nocapture"
        );
    }
    eprintln!("simulation {name}: {total}");
    total
}

/// The text a panic carried (`panic!` with a format or a literal), else a placeholder.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    match (payload.downcast_ref::<String>(), payload.downcast_ref::<&str>()) {
        (Some(s), _) => s.clone(),
        (None, Some(s)) => (*s).to_string(),
        (None, None) => "(a panic without a message)".to_string(),
    }
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

#[cfg(test)]
mod tests {
    #[test]
    fn a_seed_that_panics_is_named_with_its_replay() {
        if std::env::var_os("WEFT_SIM_SEED").is_some() || std::env::var_os("WEFT_SIM_SEEDS").is_some() {
            return;
        }
        let r = std::panic::catch_unwind(|| {
            super::run("boom", "-p weft-sim", 5, |seed| {
                assert!(seed != 3, "the world broke");
                Ok(super::Summary::default())
            })
        });
        let payload = r.expect_err("seed 3 fails the run");
        let message = super::panic_message(payload.as_ref());
        assert!(message.contains("seed 3: panicked: the world broke"), "{message}");
        assert!(message.contains("WEFT_SIM_SEED=3"), "{message}");
    }
}
