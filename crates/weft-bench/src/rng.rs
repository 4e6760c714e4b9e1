//! A small seeded PRNG and a Zipf sampler for the workloads (no `rand` dependency).
//!
//! - [`SplitMix64`]: Steele, Lea and Flood's generator (the seeding generator of xoshiro): 64 bits of state,
//!   period 2^64, passes BigCrush; plenty for choosing offsets.
//! - [`Zipf`]: ranks `1..=n` with `P(k) ∝ 1/k^alpha`, by rejection-inversion (W. Hörmann, G. Derflinger,
//!   "Rejection-inversion to generate variates from monotone discrete distributions", ACM TOMACS 6(3), 1996), as in
//!   Apache Commons' `RejectionInversionZipfSampler`: O(1) memory and time per sample for any `n`, any `alpha > 0`.

/// SplitMix64: the state advances by the golden-ratio increment and each output is a mix of the state.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// The Zipf distribution over ranks `1..=n` with exponent `alpha`.
#[derive(Debug, Clone)]
pub struct Zipf {
    n: u64,
    alpha: f64,
    h_integral_x1: f64,
    h_integral_n: f64,
    s: f64,
}

impl Zipf {
    /// `None` unless `n ≥ 1` and `alpha` is finite and positive.
    pub fn new(n: u64, alpha: f64) -> Option<Zipf> {
        if n == 0 || !alpha.is_finite() || alpha <= 0.0 {
            return None;
        }
        let mut z = Zipf { n, alpha, h_integral_x1: 0.0, h_integral_n: 0.0, s: 0.0 };
        z.h_integral_x1 = z.h_integral(1.5) - 1.0;
        z.h_integral_n = z.h_integral(n as f64 + 0.5);
        z.s = 2.0 - z.h_integral_inverse(z.h_integral(2.5) - z.h(2.0));
        Some(z)
    }

    pub fn n(&self) -> u64 {
        self.n
    }

    /// One rank in `1..=n`.
    pub fn sample(&self, rng: &mut SplitMix64) -> u64 {
        loop {
            // u is uniform in (h_integral_x1, h_integral_n].
            let u = self.h_integral_n + rng.next_f64() * (self.h_integral_x1 - self.h_integral_n);
            let x = self.h_integral_inverse(u);
            // Round to the nearest rank and keep it in range (numerical error may push it just outside).
            let k = ((x + 0.5) as u64).clamp(1, self.n);
            // Accept k with probability h(k) / (H(k + 1/2) - H(k - 1/2)); the first test is a cheap shortcut that
            // implies the second (Theorem 2 of the paper). For k = 1 the second test always holds.
            let kf = k as f64;
            if kf - x <= self.s || u >= self.h_integral(kf + 0.5) - self.h(kf) {
                return k;
            }
        }
    }

    /// H(x) = (x^(1-alpha) - 1) / (1 - alpha), and log(x) for alpha = 1, computed without cancellation.
    fn h_integral(&self, x: f64) -> f64 {
        let log_x = x.ln();
        helper2((1.0 - self.alpha) * log_x) * log_x
    }

    /// h(x) = x^-alpha.
    fn h(&self, x: f64) -> f64 {
        (-self.alpha * x.ln()).exp()
    }

    /// The inverse of H.
    fn h_integral_inverse(&self, x: f64) -> f64 {
        // t ≥ -1 mathematically; numerical error may take it just below.
        let t = (x * (1.0 - self.alpha)).max(-1.0);
        (helper1(t) * x).exp()
    }
}

/// log(1 + x) / x, and its series near 0.
fn helper1(x: f64) -> f64 {
    if x.abs() > 1e-8 { x.ln_1p() / x } else { 1.0 - x * (0.5 - x * (1.0 / 3.0 - x * 0.25)) }
}

/// (e^x - 1) / x, and its series near 0.
fn helper2(x: f64) -> f64 {
    if x.abs() > 1e-8 { x.exp_m1() / x } else { 1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + x * 0.25)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_reference_values() {
        // First outputs for seed 1234567 from the reference C implementation (splitmix64.c).
        let mut r = SplitMix64::new(1_234_567);
        assert_eq!(r.next_u64(), 6_457_827_717_110_365_317);
        assert_eq!(r.next_u64(), 3_203_168_211_198_807_973);
        assert_eq!(r.next_u64(), 9_817_491_932_198_370_423);
        for _ in 0..10_000 {
            let f = r.next_f64();
            assert!((0.0..1.0).contains(&f));
        }
    }

    #[test]
    fn rejects_bad_parameters() {
        assert!(Zipf::new(0, 0.9).is_none());
        assert!(Zipf::new(10, 0.0).is_none());
        assert!(Zipf::new(10, -1.0).is_none());
        assert!(Zipf::new(10, f64::NAN).is_none());
        assert!(Zipf::new(10, f64::INFINITY).is_none());
        assert!(Zipf::new(1, 0.9).is_some());
    }

    #[test]
    fn seeded_determinism() {
        let z = Zipf::new(1_000_000, 0.9).unwrap();
        let draw = |seed| {
            let mut r = SplitMix64::new(seed);
            (0..1000).map(|_| z.sample(&mut r)).collect::<Vec<u64>>()
        };
        assert_eq!(draw(42), draw(42));
        assert_ne!(draw(42), draw(43));
    }

    #[test]
    fn samples_in_range() {
        for &n in &[1u64, 2, 3, 10, 1000, 65_536, 1 << 40] {
            for &alpha in &[0.1, 0.5, 0.9, 0.99, 1.0, 1.01, 1.5, 3.0] {
                let z = Zipf::new(n, alpha).unwrap();
                let mut r = SplitMix64::new(n ^ alpha.to_bits());
                for _ in 0..5000 {
                    let k = z.sample(&mut r);
                    assert!((1..=n).contains(&k), "n {n} alpha {alpha}: rank {k}");
                }
            }
        }
    }

    #[test]
    fn rank_one_beats_rank_ten() {
        // P(1)/P(10) = 10^0.9 ≈ 7.9 for alpha 0.9, whatever n. Over 100k samples from n = 1000 the expected counts
        // are about 12,700 and 1,600 (standard deviations near 110 and 40): "more than twice" leaves dozens of
        // standard deviations of margin.
        let z = Zipf::new(1000, 0.9).unwrap();
        let mut r = SplitMix64::new(42);
        let mut counts = vec![0u64; 1001];
        for _ in 0..100_000 {
            counts[z.sample(&mut r) as usize] += 1;
        }
        assert!(counts[1] > 2 * counts[10], "rank 1: {}, rank 10: {}", counts[1], counts[10]);
        assert!(counts[10] > 0);
    }

    #[test]
    fn frequencies_follow_the_pmf() {
        // n = 10: every rank's frequency over 200k samples within 5 % (relative) plus 0.002 (absolute) of
        // 1/k^alpha normalised. The binomial standard deviation is at most 0.0011, so the margin is several sigma.
        for &alpha in &[0.5, 0.9, 1.0, 2.0] {
            let n = 10u64;
            let z = Zipf::new(n, alpha).unwrap();
            let mut r = SplitMix64::new(7);
            let samples = 200_000;
            let mut counts = vec![0u64; n as usize + 1];
            for _ in 0..samples {
                counts[z.sample(&mut r) as usize] += 1;
            }
            let norm: f64 = (1..=n).map(|k| (k as f64).powf(-alpha)).sum();
            for k in 1..=n {
                let want = (k as f64).powf(-alpha) / norm;
                let got = counts[k as usize] as f64 / samples as f64;
                assert!((got - want).abs() < 0.05 * want + 0.002, "alpha {alpha} rank {k}: {got} vs {want}");
            }
        }
    }

    #[test]
    fn chi_square_over_a_hundred_ranks() {
        // Pearson's chi-square of 1M samples against the exact pmf over n = 100 (99 degrees of freedom: mean 99,
        // standard deviation 14). Below 200 is more than 7 standard deviations of room; a sampler that is off by a
        // few per cent on any rank fails by far (the statistic grows with the sample count).
        for &alpha in &[0.9, 1.0, 1.5] {
            let n = 100u64;
            let z = Zipf::new(n, alpha).unwrap();
            let mut r = SplitMix64::new(2024);
            let samples = 1_000_000u64;
            let mut counts = vec![0u64; n as usize + 1];
            for _ in 0..samples {
                counts[z.sample(&mut r) as usize] += 1;
            }
            let norm: f64 = (1..=n).map(|k| (k as f64).powf(-alpha)).sum();
            let chi2: f64 = (1..=n)
                .map(|k| {
                    let e = samples as f64 * (k as f64).powf(-alpha) / norm;
                    (counts[k as usize] as f64 - e).powi(2) / e
                })
                .sum();
            assert!(chi2 < 200.0, "alpha {alpha}: chi-square {chi2}");
        }
    }
}
