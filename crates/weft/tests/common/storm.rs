//! A storm of writers for the failover tests: native clients that create, write and close small files until told
//! to stop, counting what was acknowledged, and the check that every acknowledged file reads back whole.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use bytes::{Bytes, BytesMut};
use weft_client::{Client, OpenMode};

use super::pattern;

pub const FILE_BYTES: usize = 4096;

/// The writers' shared state: when to stop, and each writer's acknowledged files.
pub struct Storm {
    pub stop: Arc<AtomicBool>,
    pub acked: Vec<Arc<AtomicUsize>>,
    tasks: Vec<tokio::task::JoinHandle<Result<(), String>>>,
}

impl Storm {
    /// Starts one writer per client, each writing `w{w}-{i}` in directory `dir` (named `path` from the root).
    pub fn start(clients: Vec<Client>, dir: u64) -> Storm {
        let stop = Arc::new(AtomicBool::new(false));
        let mut acked = Vec::new();
        let mut tasks = Vec::new();
        for (w, c) in clients.into_iter().enumerate() {
            let a = Arc::new(AtomicUsize::new(0));
            acked.push(a.clone());
            tasks.push(tokio::spawn(writer(c, dir, w, stop.clone(), a)));
        }
        Storm { stop, acked, tasks }
    }

    /// Files acknowledged so far, all writers together.
    pub fn total(&self) -> usize {
        self.acked.iter().map(|a| a.load(Ordering::SeqCst)).sum()
    }

    /// Whether a writer ended (only an error ends one before `stop`).
    pub fn failed(&self) -> bool {
        self.tasks.iter().any(|t| t.is_finished())
    }

    /// Stops the writers; panics with the first error an application saw. Answers each writer's count.
    pub async fn stop(self) -> Vec<usize> {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            t.await.unwrap().unwrap_or_else(|e| panic!("an application saw an error: {e}"));
        }
        self.acked.iter().map(|a| a.load(Ordering::SeqCst)).collect()
    }
}

/// Creates, writes and closes `w{w}-{i}` until `stop`, counting acknowledged files; the first error is returned.
async fn writer(c: Client, dir: u64, w: usize, stop: Arc<AtomicBool>, acked: Arc<AtomicUsize>) -> Result<(), String> {
    for i in 0.. {
        if stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        let name = format!("w{w}-{i:05}");
        let a = c.create(dir, &name, 0o644, false).await.map_err(|e| format!("create {name}: {e}"))?;
        let f = c.open_ino(a.ino, OpenMode::Write).await.map_err(|e| format!("open {name}: {e}"))?;
        let data = Bytes::from(pattern((w * 100_000 + i) as u64, 0, FILE_BYTES));
        f.write_at(0, data).await.map_err(|e| format!("write {name}: {e}"))?;
        f.close().await.map_err(|e| format!("close {name}: {e}"))?;
        acked.fetch_add(1, Ordering::SeqCst);
    }
    unreachable!()
}

/// Every file the writers acknowledged (`counts[w]` of writer `w`) under `/{path}` reads back as written.
pub async fn check(c: &Client, path: &str, counts: &[usize]) {
    for (w, &n) in counts.iter().enumerate() {
        for i in 0..n {
            let file = format!("/{path}/w{w}-{i:05}");
            let f = c.open(&file, OpenMode::Read).await.unwrap_or_else(|e| panic!("{file} was acknowledged: {e}"));
            let back = f.read_at(0, BytesMut::zeroed(FILE_BYTES)).await.unwrap();
            assert_eq!(&back[..], &pattern((w * 100_000 + i) as u64, 0, FILE_BYTES)[..], "{file}");
            f.close().await.unwrap();
        }
    }
}
