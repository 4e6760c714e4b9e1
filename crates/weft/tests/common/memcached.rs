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
