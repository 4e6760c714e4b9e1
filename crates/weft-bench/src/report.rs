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

/// A figure for a table cell: `-` when absent.
fn cell(v: &Value, digits: usize) -> String {
    v.as_f64().map(|x| format!("{x:.digits$}")).unwrap_or_else(|| "-".into())
}

/// A Markdown table of a `weft bench meta` document (both modes).
pub fn meta_table(doc: &Value) -> String {
    let mut s = String::new();
    let results = doc["results"].as_array().cloned().unwrap_or_default();
    if doc.pointer("/config/mode").and_then(Value::as_str) == Some("stat-storm") {
        s.push_str("stat storm: every client stats every file at the same time\n\n");
        s.push_str("| servers | clients | files | op | ops/s (median, all clients) | min–max | slowest client ops/s | per-client ops/s | client CPU µs/op | p50 µs | p99 µs | runs |\n");
        s.push_str("|---:|---:|---:|---|---:|---|---:|---|---:|---:|---:|---:|\n");
        for r in &results {
            let per: Vec<String> =
                r["per_client_ops_per_s"].as_array().into_iter().flatten().map(|x| cell(x, 0)).collect();
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} | {}–{} | {} | {} | {} | {} | {} | {} |\n",
                r["servers"],
                r["clients"],
                r["files"],
                r["op"].as_str().unwrap_or("?"),
                cell(&r["ops_per_s"], 0),
                cell(&r["min"], 0),
                cell(&r["max"], 0),
                cell(&r["slowest_client_ops_per_s"], 0),
                per.join(", "),
                cell(&r["client_cpu_us_per_op"], 1),
                cell(&r["p50_us"], 1),
                cell(&r["p99_us"], 1),
                r["runs"],
            ));
        }
        return s;
    }
    s.push_str("readdir: entries per second; each client lists its directory (with --shared: the shared one)\n\n");
    s.push_str("| servers | clients | files | dirs | op | ops/s (median) | min–max | client CPU µs/op | p50 µs | p99 µs | runs |\n");
    s.push_str("|---:|---:|---:|---:|---|---:|---|---:|---:|---:|---:|\n");
    for r in &results {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {}–{} | {} | {} | {} | {} |\n",
            r["servers"],
            r["clients"],
            r["files"],
            r["directories"],
            r["op"].as_str().unwrap_or("?"),
            cell(&r["ops_per_s"], 0),
            cell(&r["min"], 0),
            cell(&r["max"], 0),
            cell(&r["client_cpu_us_per_op"], 1),
            cell(&r["p50_us"], 1),
            cell(&r["p99_us"], 1),
            r["runs"],
        ));
    }
    s
}

/// A Markdown table of a `weft bench latency` document.
pub fn latency_table(doc: &Value) -> String {
    let mut s = format!(
        "{} calls per op and run, one at a time; percentiles by nearest rank per run, medians over the runs\n\n",
        doc.pointer("/config/count").unwrap_or(&Value::Null)
    );
    s.push_str("| servers | record | op | mean µs | p50 µs (median) | p50 min–max | p99 µs | ops/s | client CPU µs/op | runs |\n");
    s.push_str("|---:|---:|---|---:|---:|---|---:|---:|---:|---:|\n");
    for r in doc["results"].as_array().into_iter().flatten() {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {}–{} | {} | {} | {} | {} |\n",
            r["servers"],
            human_bytes(r["record_bytes"].as_u64().unwrap_or(0)),
            r["op"].as_str().unwrap_or("?"),
            cell(&r["mean_us"], 1),
            cell(&r["p50_us"], 1),
            cell(&r["min"], 1),
            cell(&r["max"], 1),
            cell(&r["p99_us"], 1),
            cell(&r["ops_per_s"], 0),
            cell(&r["client_cpu_us_per_op"], 1),
            r["runs"],
        ));
    }
    s
}

/// A Markdown table of a `weft bench zipf` document.
pub fn zipf_table(doc: &Value) -> String {
    let c = &doc["config"];
    let mut s = format!(
        "zipf alpha {} seed {} over {} bytes, {} ops per run, read fraction {}, window {}, {} placement; \
         ops/s of an op is its count over the mixed run's time\n\n",
        c["alpha"],
        c["seed"],
        c["size_bytes"],
        c["ops"],
        c["read_fraction"],
        c["window"],
        c["placement"].as_str().unwrap_or("?")
    );
    s.push_str("| servers | record | op | ops/s (median) | min–max | MiB/s | p50 µs | p99 µs | mix ops/s | distinct records | client CPU µs/op | runs |\n");
    s.push_str("|---:|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in doc["results"].as_array().into_iter().flatten() {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {}–{} | {} | {} | {} | {} | {} | {} | {} |\n",
            r["servers"],
            human_bytes(r["record_bytes"].as_u64().unwrap_or(0)),
            r["op"].as_str().unwrap_or("?"),
            cell(&r["ops_per_s"], 0),
            cell(&r["min"], 0),
            cell(&r["max"], 0),
            cell(&r["mib_per_s"], 1),
            cell(&r["p50_us"], 1),
            cell(&r["p99_us"], 1),
            cell(&r["mix_ops_per_s"], 0),
            r["distinct_records"],
            cell(&r["client_cpu_us_per_op"], 1),
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

    #[test]
    fn new_tables_have_a_row_per_result() {
        let r = serde_json::json!({"servers": 4, "clients": 8, "files": 100, "directories": 8, "op": "create",
            "ops_per_s": 1000.0, "min": 900.0, "max": 1100.0, "client_cpu_us_per_op": 12.5, "runs": 3,
            "record_bytes": 4096, "p50_us": 100.0, "p99_us": 200.0, "mean_us": 110.0, "mib_per_s": 3.9,
            "mix_ops_per_s": 1250.0, "distinct_records": 77, "per_client_ops_per_s": [100.0, 90.0],
            "slowest_client_ops_per_s": 90.0});
        let doc = |mode: &str| {
            serde_json::json!({"config": {"mode": mode, "count": 16, "alpha": 0.9},
            "results": [r.clone(), r.clone()]})
        };
        for t in
            [meta_table(&doc("private")), meta_table(&doc("stat-storm")), latency_table(&doc("")), zipf_table(&doc(""))]
        {
            let rows = t.lines().filter(|l| l.starts_with("| 4 |")).count();
            assert_eq!(rows, 2, "{t}");
            assert!(!t.contains("NaN"), "{t}");
        }
        assert!(meta_table(&doc("stat-storm")).contains("| 100, 90 |"));
    }
}
