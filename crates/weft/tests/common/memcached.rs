//! Raw memcached text-protocol exchanges, for the cache-bank tests that plant items or read `stats` by hand.

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// One raw text-protocol exchange with the daemon at `addr`: sends `request`, reads until a line equal to one of
/// `ends`, and returns everything read.
pub async fn raw(addr: &str, request: &[u8], ends: &[&str]) -> String {
    let mut s = BufReader::new(TcpStream::connect(addr).await.unwrap());
    s.get_mut().write_all(request).await.unwrap();
    let mut out = String::new();
    loop {
        let mut line = String::new();
        assert!(s.read_line(&mut line).await.unwrap() > 0, "{addr} closed: {out}");
        out.push_str(&line);
        if ends.iter().any(|e| line.trim_end() == *e) {
            return out;
        }
    }
}

/// Stores `value` under `key` with a plain `set`, bypassing the bank; asserts the daemon stored it.
pub async fn raw_set(addr: &str, key: &str, value: &[u8]) {
    let mut req = format!("set {key} 0 0 {}\r\n", value.len()).into_bytes();
    req.extend_from_slice(value);
    req.extend_from_slice(b"\r\n");
    let reply = raw(addr, &req, &["STORED", "NOT_STORED", "SERVER_ERROR object too large for cache"]).await;
    assert_eq!(reply.trim_end(), "STORED");
}

/// One counter from the daemon's own `stats` (e.g. `get_hits`, `curr_items`).
pub async fn stat(addr: &str, name: &str) -> u64 {
    let reply = raw(addr, b"stats\r\n", &["END"]).await;
    let prefix = format!("STAT {name} ");
    let line = reply.lines().find_map(|l| l.strip_prefix(prefix.as_str()));
    line.unwrap_or_else(|| panic!("no {name} in {addr}'s stats")).trim().parse().unwrap()
}

/// `get_hits` summed over every daemon at `addrs`: items the daemons themselves say they served.
pub async fn get_hits(addrs: &[String]) -> u64 {
    let mut sum = 0;
    for a in addrs {
        sum += stat(a, "get_hits").await;
    }
    sum
}
