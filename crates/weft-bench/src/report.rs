//! Turning result JSON into the Markdown tables of `docs/bench.md`.

use serde_json::Value;

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// A Markdown table of a throughput result document.
pub fn markdown_table(doc: &Value) -> String {
    let mut s = String::new();
    let iperf = doc.pointer("/ceilings/iperf3_mib_per_s").and_then(Value::as_f64);
    let memcpy = doc.pointer("/ceilings/memcpy_mib_per_s").and_then(Value::as_f64);
    s.push_str(&format!(
        "ceilings: iperf3 loopback {} MiB/s, memcpy {} MiB/s\n\n",
        iperf.map(|x| format!("{x:.0}")).unwrap_or("-".into()),
        memcpy.map(|x| format!("{x:.0}")).unwrap_or("-".into())
    ));
    s.push_str("| servers | record | op | MiB/s (median) | min–max | × iperf3 | client CPU s/GiB | runs |\n");
    s.push_str("|---:|---:|---|---:|---|---:|---:|---:|\n");
    for r in doc["results"].as_array().into_iter().flatten() {
        let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        s.push_str(&format!(
            "| {} | {} | {} | {:.0} | {:.0}–{:.0} | {} | {:.3} | {} |\n",
            r["servers"],
            human_bytes(r["record_bytes"].as_u64().unwrap_or(0)),
            r["op"].as_str().unwrap_or("?"),
            f("mib_per_s"),
            f("min"),
            f("max"),
            r["ratio_to_iperf3"].as_f64().map(|x| format!("{x:.2}")).unwrap_or("-".into()),
            f("client_cpu_s_per_gib"),
            r["runs"],
        ));
    }
    s
}

pub fn human_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}G", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_sizes() {
        let d = utc_now();
        assert_eq!(d.len(), 20);
        assert!(d.starts_with("20"));
        assert_eq!(human_bytes(1 << 20), "1M");
        assert_eq!(human_bytes(4096), "4K");
        assert_eq!(human_bytes(1000), "1000");
    }
}
