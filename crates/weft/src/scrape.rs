//! Reading a metrics endpoint (`GET /metrics`, the text exposition every role serves): for `weft top`, and for
//! the integration tests, which include this file.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A scrape must connect, send and read its whole answer within this time.
const HTTP_TIMEOUT_MS: u64 = 10_000;

/// Fetches `http://addr/metrics`: the body, or an error for anything but 200.
pub async fn scrape(addr: &str) -> std::io::Result<String> {
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).await?;
        let mut out = Vec::new();
        // The answer is bounded by what the server has to say; cap it anyway, as a peer could be anything.
        (&mut s).take(SCRAPE_BYTES_MAX).read_to_end(&mut out).await?;
        Ok::<_, std::io::Error>(out)
    };
    let out = tokio::time::timeout(Duration::from_millis(HTTP_TIMEOUT_MS), fetch)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, format!("scraping {addr} timed out")))??;
    let text = String::from_utf8_lossy(&out);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return Err(std::io::Error::other(format!("{addr} sent no HTTP answer")));
    };
    if head.lines().next().is_none_or(|l| l.split(' ').nth(1) != Some("200")) {
        return Err(std::io::Error::other(format!("{addr} answered {:?}", head.lines().next().unwrap_or(""))));
    }
    Ok(body.to_string())
}

/// Largest scrape answer [`scrape`] reads.
const SCRAPE_BYTES_MAX: u64 = 16 << 20;

/// The samples of a text exposition as (series, value): `("weft_rpc_server_requests_total{op=\"Create\"}", 3.0)`.
/// Comment lines and lines that do not parse are skipped.
pub fn parse(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// The sum of every sample of metric `name` (all label sets) whose labels contain each of `labels` (`op="Create"`).
pub fn sum(samples: &[(String, f64)], name: &str, labels: &[&str]) -> f64 {
    samples
        .iter()
        .filter(|(series, _)| {
            let (n, l) = series.split_once('{').unwrap_or((series, ""));
            n == name && labels.iter().all(|want| l.split([',', '}']).any(|have| have == *want))
        })
        .map(|(_, v)| v)
        .sum()
}
