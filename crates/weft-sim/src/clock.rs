//! A simulated machine's monotonic clock: real (simulated) time scaled by a rate that differs from 1 by at most a
//! bounded drift, and offset by when the machine (re)started. Protocols that measure time on their own clock (the
//! data server's lease, the MDS's silence and duty lease) must stay safe under such drift: that is what it tests.

/// Milliseconds since the machine started, at `rate_ppm` parts per million of real time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriftClock {
    /// Real time (µs) at which this clock read 0.
    pub origin_us: u64,
    /// Local microseconds per real second, in millionths: 1_000_000 is exact.
    pub rate_ppm: u64,
}

impl DriftClock {
    /// A clock started at `origin_us`; `rate_ppm` must be positive.
    pub fn new(origin_us: u64, rate_ppm: u64) -> DriftClock {
        assert!(rate_ppm > 0, "a clock that does not move");
        DriftClock { origin_us, rate_ppm }
    }

    /// The local milliseconds at real time `now_us` (never before the origin).
    pub fn ms_at(&self, now_us: u64) -> u64 {
        let elapsed = u128::from(now_us.saturating_sub(self.origin_us));
        (elapsed * u128::from(self.rate_ppm) / 1_000_000_000) as u64
    }

    /// The real interval (µs) in which this clock advances `ms`.
    pub fn real_us_for(&self, ms: u64) -> u64 {
        (u128::from(ms) * 1_000_000_000 / u128::from(self.rate_ppm)) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fast_clock_reads_ahead_and_its_intervals_are_shorter() {
        let exact = DriftClock::new(1_000, 1_000_000);
        assert_eq!(exact.ms_at(0), 0);
        assert_eq!(exact.ms_at(1_000 + 5_000_000), 5_000);
        let fast = DriftClock::new(0, 1_100_000);
        assert_eq!(fast.ms_at(10_000_000), 11_000);
        assert_eq!(fast.real_us_for(1_100), 1_000_000);
    }
}
