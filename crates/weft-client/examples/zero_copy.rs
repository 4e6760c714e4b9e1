//! The native zero-copy API: one registered buffer, batches of writes and reads into its slots, completions.
//!
//! Run against a cluster (`weft up --data-dir /tmp/w` first):
//! `cargo run --release -p weft-client --example zero_copy -- /tmp/w/cluster.toml`
//! On the same host the data servers move the bytes straight between their page cache and the slots (`shm`).

use std::sync::Arc;

use weft_client::{Client, ClusterConfig, IoKind, IoOp, IoQueue};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let spec = std::env::args().nth(1).ok_or("usage: zero_copy CLUSTER_TOML_OR_MDS_ADDR")?;
    let client = Client::connect(&ClusterConfig::from_spec(&spec)?).await?;
    let file = Arc::new(client.create_path("/zero-copy-example", 0o644, false, true).await?);
    let (slots, slot_bytes) = (8, 1 << 20);
    let mut q = IoQueue::new(file.clone(), slots, slot_bytes);

    // Fill every slot, write them all in one batch.
    for s in 0..slots {
        q.slot_mut(s).expect("idle").fill(s as u8 + 1);
    }
    let writes: Vec<IoOp> = (0..slots)
        .map(|s| IoOp {
            tag: s as u64,
            kind: IoKind::Write,
            file_offset: (s * slot_bytes) as u64,
            slot: s,
            len: slot_bytes,
        })
        .collect();
    q.submit(&writes)?;
    for c in q.reap(slots).await {
        c.result?;
    }
    file.commit().await?;

    // Read them back in reverse slot order, then check.
    let reads: Vec<IoOp> = (0..slots)
        .map(|s| IoOp {
            tag: 100 + s as u64,
            kind: IoKind::Read,
            file_offset: (s * slot_bytes) as u64,
            slot: slots - 1 - s,
            len: slot_bytes,
        })
        .collect();
    q.submit(&reads)?;
    let done = q.reap(slots).await;
    for c in &done {
        let n = c.result.as_ref().map_err(|e| e.to_string())?;
        let want = (c.tag - 100) as u8 + 1;
        let ok = q.slot(c.slot).expect("reaped")[..*n].iter().all(|&b| b == want);
        println!("op {} slot {}: {n} bytes {}", c.tag, c.slot, if ok { "ok" } else { "WRONG" });
        if !ok {
            return Err("data mismatch".into());
        }
    }
    println!("fabrics: {:?}", client.fabrics().await);
    client.close().await;
    Ok(())
}
