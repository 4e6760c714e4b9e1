//! The per-open-file "the bank keeps missing" hint that makes misses cheap: a file whose reads find nothing in
//! the bank `streak_max` times in a row stops asking it for a while (its reads go straight to the data servers,
//! still asking them to fill), then asks once again (a probe). Each probe that misses doubles the pause, up to
//! `skip_max` reads; any hit ends the streak. Bounded by construction (three counters per open file).
//!
//! Skipping a lookup never changes what a read returns (the data servers hold the truth); it only loses the
//! speed of the hits it did not ask for.

use std::sync::Mutex;

/// See the module doc. `streak_max == 0` turns the hint off (every read asks the bank).
#[derive(Debug)]
pub struct MissHint {
    streak_max: u32,
    skip_max: u32,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Reads in a row that asked and found nothing.
    streak: u32,
    /// Reads still to skip before the next probe.
    skip_left: u32,
    /// The pause after the next missed probe.
    next_skip: u32,
}

impl MissHint {
    pub fn new(streak_max: u32, skip_max: u32) -> MissHint {
        MissHint { streak_max, skip_max, state: Mutex::new(State { next_skip: 1, ..State::default() }) }
    }

    /// Whether this read should ask the bank; a `false` uses up one read of the pause.
    pub fn ask(&self) -> bool {
        if self.streak_max == 0 {
            return true;
        }
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.skip_left > 0 {
            s.skip_left -= 1;
            return false;
        }
        true
    }

    /// The outcome of a read that asked: `hit` when the bank had any of its blocks.
    pub fn record(&self, hit: bool) {
        if self.streak_max == 0 {
            return;
        }
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if hit {
            *s = State { next_skip: 1, ..State::default() };
            return;
        }
        s.streak = s.streak.saturating_add(1);
        if s.streak >= self.streak_max {
            s.skip_left = s.next_skip.min(self.skip_max);
            s.next_skip = s.next_skip.saturating_mul(2).min(self.skip_max.max(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives `reads` reads, each a hit when `hit(i)` says so (asked or not); returns which ones asked.
    fn drive(h: &MissHint, reads: usize, hit: impl Fn(usize) -> bool) -> Vec<bool> {
        (0..reads)
            .map(|i| {
                let asked = h.ask();
                if asked {
                    h.record(hit(i));
                }
                asked
            })
            .collect()
    }

    #[test]
    fn a_missing_file_pauses_with_doubling_probes_up_to_the_cap() {
        let h = MissHint::new(3, 8);
        let asked = drive(&h, 40, |_| false);
        let at: Vec<usize> = asked.iter().enumerate().filter(|(_, a)| **a).map(|(i, _)| i).collect();
        // Three misses, then pauses of 1, 2, 4, 8, 8… reads between probes.
        assert_eq!(at, vec![0, 1, 2, 4, 7, 12, 21, 30, 39]);
    }

    #[test]
    fn a_hit_ends_the_streak_and_the_pause_starts_small_again() {
        let h = MissHint::new(2, 64);
        // Misses until read 20, hits after: the first probe after 20 hits and every read asks again.
        let asked = drive(&h, 60, |i| i >= 20);
        let first_probe = (20..60).find(|&i| asked[i]).unwrap();
        assert!(asked[first_probe..].iter().all(|a| *a), "after a hit every read asks: {asked:?}");
        // Then two misses pause for one read only.
        for _ in 0..2 {
            assert!(h.ask());
            h.record(false);
        }
        assert!(!h.ask());
        assert!(h.ask());
    }

    #[test]
    fn streak_max_zero_always_asks() {
        let h = MissHint::new(0, 64);
        assert!(drive(&h, 100, |_| false).iter().all(|a| *a));
    }
}
