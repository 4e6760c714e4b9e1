//! Numbers for people: ISO 8601 times from nanosecond timestamps, and sizes in powers of 1024 (as `df -h`).

/// `ns` nanoseconds since the Unix epoch as ISO 8601 in UTC with nine fractional digits:
/// `2026-11-23T18:40:00.123456789Z`. Times before 1970 work too (the fraction is always counted forward).
pub fn iso8601_ns(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let frac = ns.rem_euclid(1_000_000_000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{frac:09}Z", sod / 3600, sod % 3600 / 60, sod % 60)
}

/// (year, month, day) of day `z` counted from 1970-01-01 (Howard Hinnant's `civil_from_days`, proleptic
/// Gregorian calendar).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// `bytes` as df -h does: at most three significant digits and a suffix (B, K, M, G, T, P, E), one decimal below
/// 10 of a unit.
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "K", "M", "G", "T", "P", "E"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes}B")
    } else if v < 10.0 {
        format!("{v:.1}{}", UNITS[u])
    } else {
        format!("{v:.0}{}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_times() {
        assert_eq!(iso8601_ns(0), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(iso8601_ns(1), "1970-01-01T00:00:00.000000001Z");
        assert_eq!(iso8601_ns(-1), "1969-12-31T23:59:59.999999999Z");
        // date -u -d @1795459200 → Mon Nov 23 18:40:00 UTC 2026
        assert_eq!(iso8601_ns(1_795_459_200_123_456_789), "2026-11-23T18:40:00.123456789Z");
        // A leap day and the end of a century that is not a leap year.
        assert_eq!(iso8601_ns(951_782_400 * 1_000_000_000), "2000-02-29T00:00:00.000000000Z");
        assert_eq!(iso8601_ns(4_107_542_400 * 1_000_000_000), "2100-03-01T00:00:00.000000000Z");
        assert_eq!(iso8601_ns(i64::MAX), "2262-04-11T23:47:16.854775807Z");
    }

    #[test]
    fn human_sizes() {
        assert_eq!(size(0), "0B");
        assert_eq!(size(1023), "1023B");
        assert_eq!(size(1024), "1.0K");
        assert_eq!(size(1536), "1.5K");
        assert_eq!(size(10 << 20), "10M");
        assert_eq!(size(u64::MAX), "16E");
    }
}
