//! The Markdown tables of the throughput, meta, latency and zipf results (and the units they print), shared by
//! those benches when they finish and by `weft bench report` (`report.rs`) when it renders saved results.

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
    s.push_str(
        "| fabric | auth | servers | layout | record | op | MiB/s (median) | min–max | × plain | × healthy | × iperf3 | client CPU s/GiB | runs |\n",
    );
    s.push_str("|---|---|---:|---|---:|---|---:|---|---:|---:|---:|---:|---:|\n");
    let ratio = |v: &Value| v.as_f64().map(|x| format!("{x:.2}")).unwrap_or("-".into());
    for r in doc["results"].as_array().into_iter().flatten() {
        let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {:.0} | {:.0}–{:.0} | {} | {} | {} | {:.3} | {} |\n",
            r["fabric"].as_str().unwrap_or("-"),
            r["auth"].as_str().unwrap_or("-"),
            r["servers"],
            // Results from before `--layout` are of the plain layout.
            r["layout"].as_str().unwrap_or("plain"),
            human_bytes(r["record_bytes"].as_u64().unwrap_or(0)),
            r["op"].as_str().unwrap_or("?"),
            f("mib_per_s"),
            f("min"),
            f("max"),
            ratio(&r["ratio_to_plain"]),
            ratio(&r["ratio_to_healthy"]),
            ratio(&r["ratio_to_iperf3"]),
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

/// `weft bench meta --failover`: each client's time from a service's kill to its first reply after it.
fn failover_table(results: &[Value]) -> String {
    let mut s = String::from(
        "failover: from SIGKILL of the service every client started at to the end of each client's first create \
         issued after it\n\n| meta | servers | clients | runs | p50 ms | p99 ms | max ms | p99 per run, ms | \
         acknowledged | errors to the application |\n|---|---:|---:|---:|---:|---:|---:|---|---:|---:|\n",
    );
    for r in results {
        let per: Vec<String> = r["p99_ms_per_run"].as_array().into_iter().flatten().map(|x| cell(x, 0)).collect();
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r["meta"].as_str().unwrap_or("?"),
            r["servers"],
            r["clients"],
            r["runs"],
            cell(&r["failover_ms_p50"], 0),
            cell(&r["failover_ms_p99"], 0),
            cell(&r["failover_ms_max"], 0),
            per.join(", "),
            r["acknowledged"],
            r["errors_to_the_application"],
        ));
    }
    s
}

/// A Markdown table of a `weft bench meta` document (every mode).
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
    if doc.pointer("/config/mode").and_then(Value::as_str) == Some("failover") {
        return failover_table(&results);
    }
    s.push_str("readdir: entries per second; each client lists its directory (with --shared: the shared one)\n\n");
    s.push_str("| meta | servers | clients | files | dirs | op | ops/s (median) | min–max | client CPU µs/op | p50 µs | p99 µs | runs |\n");
    s.push_str("|---|---:|---:|---:|---:|---|---:|---|---:|---:|---:|---:|\n");
    for r in &results {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {}–{} | {} | {} | {} | {} |\n",
            r["meta"].as_str().unwrap_or("redb"),
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
    s.push_str(
        "| fabric | auth | servers | record | op | mean µs | p50 µs (median) | p50 min–max | p99 µs | ops/s | client CPU µs/op | runs |\n",
    );
    s.push_str("|---|---|---:|---:|---|---:|---:|---|---:|---:|---:|---:|\n");
    for r in doc["results"].as_array().into_iter().flatten() {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {}–{} | {} | {} | {} | {} |\n",
            r["fabric"].as_str().unwrap_or("-"),
            r["auth"].as_str().unwrap_or("-"),
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
