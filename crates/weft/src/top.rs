//! `weft top`: polls a cluster's metrics endpoints and prints, per role, the rates of the last interval:
//! requests per second by op (RPC served, FUSE requests), errors, bytes moved, journal group commits.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::scrape::{parse, scrape, sum};
use anyhow::{Context, Result, bail};

/// Ops shown per role, busiest first.
const OPS_SHOWN: usize = 8;

/// The endpoints `from` names: `ROLE=ADDR,...`, a metrics.txt, or a directory holding one.
fn endpoints(from: &str) -> Result<Vec<(String, String)>> {
    if from.contains('=') {
        return from
            .split(',')
            .map(|pair| {
                let (role, addr) = pair.split_once('=').with_context(|| format!("{pair:?} is not ROLE=ADDR"))?;
                Ok((role.trim().to_string(), addr.trim().to_string()))
            })
            .collect();
    }
    let path = Path::new(from);
    let file = if path.is_dir() { path.join(weft_launch::METRICS_FILE) } else { path.to_path_buf() };
    let text = std::fs::read_to_string(&file)
        .with_context(|| format!("reading {} (start the cluster with `weft up`)", file.display()))?;
    let list: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(role, addr)| (role.to_string(), addr.trim().to_string()))
        .collect();
    if list.is_empty() {
        bail!("{} lists no metrics endpoints", file.display());
    }
    Ok(list)
}

/// Counter values of one role worth a rate: (what, value).
fn counters(samples: &[(String, f64)]) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (series, v) in samples {
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        let op = labels.split(',').find_map(|l| l.strip_prefix("op=\"")).map(|o| o.trim_end_matches(['"', '}']));
        match (name, op) {
            ("weft_rpc_server_requests_total", Some(op)) => {
                out.insert(format!("rpc {op}"), *v);
            }
            ("weft_fuse_requests_total", Some(op)) => {
                out.insert(format!("fuse {op}"), *v);
            }
            _ => {}
        }
    }
    out.insert("errors".into(), sum(samples, "weft_rpc_server_requests_errors_total", &[]));
    out.insert("fuse errors".into(), sum(samples, "weft_fuse_requests_errors_total", &[]));
    out.insert("bytes in".into(), sum(samples, "weft_data_bytes_total", &["direction=\"in\""]));
    out.insert("bytes out".into(), sum(samples, "weft_data_bytes_total", &["direction=\"out\""]));
    out.insert("journal commits".into(), sum(samples, "weft_mds_journal_commits_total", &[]));
    out.insert("retries".into(), sum(samples, "weft_rpc_client_retries_total", &[]));
    out
}

pub async fn top(from: &str, interval_s: u64, count: u32) -> Result<()> {
    let list = endpoints(from)?;
    let interval = Duration::from_secs(interval_s.max(1));
    let mut last: BTreeMap<String, (Instant, BTreeMap<String, f64>)> = BTreeMap::new();
    let mut printed = 0;
    loop {
        let mut out = String::new();
        for (role, addr) in &list {
            let now = Instant::now();
            let c = match scrape(addr).await {
                Ok(text) => counters(&parse(&text)),
                Err(e) => {
                    out.push_str(&format!("{role:<8} {addr}: {e}\n"));
                    continue;
                }
            };
            if let Some((then, before)) = last.get(role) {
                let secs = now.duration_since(*then).as_secs_f64().max(1e-3);
                let rate = |k: &str| (c.get(k).copied().unwrap_or(0.0) - before.get(k).copied().unwrap_or(0.0)) / secs;
                let mut ops: Vec<(String, f64)> = c
                    .keys()
                    .filter(|k| k.starts_with("rpc ") || k.starts_with("fuse "))
                    .map(|k| (k.clone(), rate(k)))
                    .filter(|(_, r)| *r > 0.0)
                    .collect();
                ops.sort_by(|a, b| b.1.total_cmp(&a.1));
                let total: f64 = ops.iter().map(|(_, r)| r).sum();
                out.push_str(&format!(
                    "{role:<8} {total:>9.1} req/s  errors {:>6.1}/s  in {:>9}/s  out {:>9}/s  commits {:>7.1}/s  retries {:.1}/s\n",
                    rate("errors") + rate("fuse errors"),
                    human(rate("bytes in")),
                    human(rate("bytes out")),
                    rate("journal commits"),
                    rate("retries"),
                ));
                let shown: Vec<String> = ops.iter().take(OPS_SHOWN).map(|(k, r)| format!("{k} {r:.1}")).collect();
                if !shown.is_empty() {
                    out.push_str(&format!("         {}\n", shown.join("  ")));
                }
            }
            last.insert(role.clone(), (now, c));
        }
        if !out.is_empty() {
            let mut stdout = std::io::stdout().lock();
            writeln!(stdout, "--- {} endpoints, rates over the last {} s", list.len(), interval.as_secs())?;
            stdout.write_all(out.as_bytes())?;
            stdout.flush()?;
            printed += 1;
            if count > 0 && printed >= count {
                return Ok(());
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

/// Bytes as B, KiB, MiB or GiB.
fn human(bytes: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB"];
    let mut v = bytes;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.1} {}", units[i])
}

#[cfg(test)]
mod scrape_tests {
    use crate::scrape::{parse, scrape, sum};

    #[test]
    fn parse_and_sum_by_labels() {
        let text =
            "# TYPE x counter\nx_total{op=\"A\",fabric=\"tcp\"} 2\nx_total{op=\"B\",fabric=\"tcp\"} 3\ny 1.5\n# EOF\n";
        let s = parse(text);
        assert_eq!(sum(&s, "x_total", &[]), 5.0);
        assert_eq!(sum(&s, "x_total", &["op=\"A\""]), 2.0);
        assert_eq!(sum(&s, "x_total", &["fabric=\"tcp\"", "op=\"B\""]), 3.0);
        assert_eq!(sum(&s, "y", &[]), 1.5);
        assert_eq!(sum(&s, "x", &[]), 0.0);
    }

    #[tokio::test]
    async fn a_scrape_reads_the_endpoint_and_refuses_what_is_not_200() {
        let m = weft_rpc::Metrics::new("test");
        m.counter("t_hits", "hits").inc_by(42);
        let addr = m.listen("127.0.0.1:0").await.unwrap().to_string();
        let body = scrape(&addr).await.unwrap();
        assert!(body.contains("t_hits_total 42\n"), "{body}");
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = closed.local_addr().unwrap().to_string();
        drop(closed);
        assert!(scrape(&at).await.is_err());
    }
}
