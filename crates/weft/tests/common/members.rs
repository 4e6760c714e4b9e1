//! What the membership and fencing tests ask of a cluster whose servers come and go: bounded waits for a
//! condition, a server's state as `weft status` shows it, and a file's layout generation.

use std::time::Duration;

use weft_client::Client;

use super::weft;

/// How long a test waits for any one condition before failing (the conditions take seconds).
pub const WAIT_MS: u64 = 60_000;

/// Polls `cond` every 100 ms until it holds, failing after [`WAIT_MS`] with `what`.
pub async fn wait_for<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = tokio::time::Instant::now();
    while !cond().await {
        assert!(start.elapsed() < Duration::from_millis(WAIT_MS), "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The state `weft status --json` shows for data server `id`.
pub fn status_of(cl: &weft_launch::LocalCluster, id: u32) -> String {
    let (ok, out, err) = weft(cl, &["status", "--json"]);
    assert!(ok, "weft status: {err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let s = v["servers"].as_array().unwrap().iter().find(|s| s["id"] == id).unwrap();
    s["state"].as_str().unwrap().to_string()
}

/// The layout generation the MDS holds for `ino` now.
pub async fn generation(c: &Client, ino: u64) -> u64 {
    c.getattr(ino).await.unwrap().layout.unwrap().generation
}
