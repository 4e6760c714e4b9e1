//! Medians and ranges of repeated measurements; percentiles and means of per-call latencies.

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub runs: usize,
}

/// Summarises samples; `None` for an empty set. The median of an even count is the mean of the middle two.
pub fn summarize(samples: &[f64]) -> Option<Summary> {
    if samples.is_empty() {
        return None;
    }
    let mut v: Vec<f64> = samples.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
    Some(Summary { median, min: v[0], max: v[n - 1], runs: n })
}

/// The `p`-th percentile (0 ≤ p ≤ 100) of `sorted` (ascending) by the nearest-rank method: the smallest sample
/// such that at least `p` % of the samples are less than or equal to it, i.e. the sample of rank
/// `⌈p/100 · N⌉` (1-based; rank 1 for p = 0). Always one of the samples, never an interpolation. `None` for an
/// empty slice or a `p` outside [0, 100].
pub fn percentile_sorted(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() || !(0.0..=100.0).contains(&p) {
        return None;
    }
    let n = sorted.len();
    // p·N first, then /100: exact for integer p (and N below 2^46). The small slack keeps a product that should be
    // a whole number but came out a hair above it (a decimal p such as 99.9 is not exact in binary) from rounding
    // up to the next rank; a true fraction is never that close to a whole number for p with a few decimals.
    let x = p * n as f64 / 100.0;
    let rank = ((x - 1e-9).ceil() as usize).clamp(1, n);
    Some(sorted[rank - 1])
}

/// [`percentile_sorted`] of unsorted samples.
pub fn percentile(samples: &[f64], p: f64) -> Option<f64> {
    let mut v = samples.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    percentile_sorted(&v, p)
}

/// Mean and nearest-rank percentiles of one run's per-call latencies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Latency {
    pub count: usize,
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

/// Sorts `samples` in place and summarises them; `None` for an empty set.
pub fn latency(samples: &mut [f64]) -> Option<Latency> {
    if samples.is_empty() {
        return None;
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let mean = samples.iter().sum::<f64>() / samples.len() as f64;
    Some(Latency {
        count: samples.len(),
        mean,
        p50: percentile_sorted(samples, 50.0)?,
        p99: percentile_sorted(samples, 99.0)?,
        max: samples[samples.len() - 1],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(summarize(&[]), None);
        assert_eq!(summarize(&[3.0, 1.0, 2.0]).unwrap(), Summary { median: 2.0, min: 1.0, max: 3.0, runs: 3 });
        assert_eq!(summarize(&[4.0, 1.0, 2.0, 3.0]).unwrap().median, 2.5);
    }

    #[test]
    fn nearest_rank_textbook() {
        // The worked example of the nearest-rank method: {15, 20, 35, 40, 50}.
        let v = [15.0, 20.0, 35.0, 40.0, 50.0];
        assert_eq!(percentile_sorted(&v, 5.0), Some(15.0));
        assert_eq!(percentile_sorted(&v, 30.0), Some(20.0));
        assert_eq!(percentile_sorted(&v, 40.0), Some(20.0));
        assert_eq!(percentile_sorted(&v, 50.0), Some(35.0));
        assert_eq!(percentile_sorted(&v, 100.0), Some(50.0));
        assert_eq!(percentile_sorted(&v, 0.0), Some(15.0));
    }

    #[test]
    fn nearest_rank_edges() {
        let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile_sorted(&hundred, 50.0), Some(50.0));
        assert_eq!(percentile_sorted(&hundred, 99.0), Some(99.0));
        assert_eq!(percentile_sorted(&hundred, 99.5), Some(100.0));
        assert_eq!(percentile_sorted(&hundred, 1.0), Some(1.0));
        // 0.99 · 1024 = 1013.76: rank 1014.
        let k: Vec<f64> = (1..=1024).map(f64::from).collect();
        assert_eq!(percentile_sorted(&k, 99.0), Some(1014.0));
        assert_eq!(percentile_sorted(&k, 50.0), Some(512.0));
        // Decimal p whose product is a whole number: 99.9 · 1000 / 100 = 999 exactly, not rank 1000.
        let t: Vec<f64> = (1..=1000).map(f64::from).collect();
        assert_eq!(percentile_sorted(&t, 99.9), Some(999.0));
        assert_eq!(percentile_sorted(&t, 0.1), Some(1.0));
        assert_eq!(percentile_sorted(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile_sorted(&[], 50.0), None);
        assert_eq!(percentile_sorted(&[1.0], 101.0), None);
        assert_eq!(percentile_sorted(&[1.0], -1.0), None);
        assert_eq!(percentile_sorted(&[1.0], f64::NAN), None);
        // Unsorted input through `percentile`.
        assert_eq!(percentile(&[5.0, 1.0, 4.0, 2.0, 3.0], 50.0), Some(3.0));
        assert_eq!(percentile(&[2.0, 1.0], 50.0), Some(1.0));
    }

    #[test]
    fn latency_summary() {
        assert_eq!(latency(&mut []), None);
        let mut v: Vec<f64> = (1..=200).rev().map(f64::from).collect();
        let l = latency(&mut v).unwrap();
        assert_eq!(l, Latency { count: 200, mean: 100.5, p50: 100.0, p99: 198.0, max: 200.0 });
    }
}
