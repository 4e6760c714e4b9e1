//! Byte-range locks per object, so a block's data and its checksum always change together as seen by readers.
//!
//! Why: a write updates the data file and then the checksum sidecar with two system calls, and a partial-block
//! write reads, merges and rewrites its edge blocks. Without a lock a concurrent reader of the same block could see
//! new data with an old checksum (a false `Corrupt`), and two writers of one block could leave a checksum that
//! matches neither. Readers share a range; writers and truncates hold theirs alone. Disjoint ranges never wait,
//! so the several transfer units a client keeps in flight to one object proceed in parallel.
//!
//! Bounded: the table holds only the ranges of operations in progress, at most one per disk task.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};

/// A held range; released on drop. It owns its table, so it can travel with a reply until the bytes are sent.
pub struct RangeGuard {
    table: Arc<RangeLocks>,
    ino: u64,
    id: u64,
}

struct Held {
    id: u64,
    start: u64,
    end: u64,
    exclusive: bool,
}

#[derive(Default)]
struct Table {
    next_id: u64,
    held: HashMap<u64, Vec<Held>>,
}

#[derive(Default)]
pub struct RangeLocks {
    table: Mutex<Table>,
    changed: Condvar,
}

impl RangeLocks {
    /// Blocks the calling (disk) thread until `[start, end)` of object `ino` can be held.
    pub fn lock(self: &Arc<Self>, ino: u64, start: u64, end: u64, exclusive: bool) -> RangeGuard {
        assert!(start <= end, "range lock of an inverted range {start}..{end}");
        let mut t = self.table.lock().expect("range lock table");
        loop {
            let conflict = t.held.get(&ino).is_some_and(|v| {
                v.iter().any(|h| (h.exclusive || exclusive) && h.start < end.max(start + 1) && start < h.end)
            });
            if !conflict {
                break;
            }
            t = self.changed.wait(t).expect("range lock table");
        }
        t.next_id += 1;
        let id = t.next_id;
        // An empty range still excludes its start, so a zero-length truncate orders against writers.
        t.held.entry(ino).or_default().push(Held { id, start, end: end.max(start + 1), exclusive });
        RangeGuard { table: self.clone(), ino, id }
    }
}

impl Drop for RangeGuard {
    fn drop(&mut self) {
        let mut t = self.table.table.lock().expect("range lock table");
        if let Some(v) = t.held.get_mut(&self.ino) {
            v.retain(|h| h.id != self.id);
            if v.is_empty() {
                t.held.remove(&self.ino);
            }
        }
        drop(t);
        self.table.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn shared_ranges_coexist_and_the_table_empties() {
        let l = Arc::new(RangeLocks::default());
        let a = l.lock(1, 0, 100, false);
        let b = l.lock(1, 50, 150, false);
        let c = l.lock(1, 200, 300, true);
        let d = l.lock(2, 0, 100, true);
        drop((a, b, c, d));
        assert!(l.table.lock().unwrap().held.is_empty());
    }

    #[test]
    fn an_exclusive_range_waits_for_an_overlapping_reader() {
        let l = Arc::new(RangeLocks::default());
        let reader = l.lock(7, 0, 4096, false);
        let acquired = Arc::new(AtomicBool::new(false));
        let t = {
            let (l, acquired) = (l.clone(), acquired.clone());
            std::thread::spawn(move || {
                let _w = l.lock(7, 4000, 9000, true);
                acquired.store(true, Ordering::SeqCst);
            })
        };
        // The writer cannot have the range while the reader holds it; a disjoint writer can.
        let _other = l.lock(7, 4096, 5000, false);
        drop(_other);
        assert!(!acquired.load(Ordering::SeqCst));
        drop(reader);
        t.join().unwrap();
        assert!(acquired.load(Ordering::SeqCst));
    }
}
