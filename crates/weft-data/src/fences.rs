//! Write fences of mirror objects (docs/format.md §32): each object's epoch and its holds (byte ranges), so that a
//! copy between mirror copies (the healer's catch-up, a read's repair) is ordered against every write of the
//! object.
//!
//! A pure table: the store calls [`Fences::admit`] under the exclusive range lock a write or truncate already
//! holds, and [`Fences::fence`] under an exclusive lock of the whole object, so a fence falls between two writes,
//! never inside one. The one piece of I/O is the persisted epoch high-water mark (`fence_epoch` in the root), which
//! makes every epoch handed out before a restart fall below the floor after it.
//!
//! Invariant: an object's epoch never goes down, across restarts too (the floor is above every epoch handed out).
//! Bounded: at most [`EPOCHS_MAX`] epochs and [`HOLDS_MAX`] holds in memory.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use weft_proto::msg::{FenceAct, FenceResp, HOLD_TTL_MS_MAX, WriteFence};

/// Objects whose epoch is kept one by one; past it the floor rises above all of them and they are forgotten.
pub const EPOCHS_MAX: usize = 65_536;
/// Holds in place at once (one per object being copied onto).
pub const HOLDS_MAX: usize = 4096;

/// Why a fenced write or a fence was refused; nothing was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FenceRefusal {
    #[error("object {ino}: the write carries epoch {carried}, the object is at {epoch} (fenced since; write again)")]
    EpochMoved { ino: u64, carried: u64, epoch: u64 },
    #[error("object {ino}: writes are held for a copy between mirror copies for up to {left_ms} ms more")]
    Held { ino: u64, left_ms: u64 },
    #[error("object {ino}: hold {hold} is not in place (released, expired, or lost to a restart)")]
    HoldLost { ino: u64, hold: u64 },
    #[error("object {ino}: {reason}")]
    Invalid { ino: u64, reason: &'static str },
    #[error("fence table full: {HOLDS_MAX} holds in place")]
    Full,
    #[error("persisting the fence epoch in {path}: {reason}")]
    Persist { path: PathBuf, reason: String },
}

struct Hold {
    id: u64,
    /// Object bytes `[start, end)`: the writes and cuts touching them wait.
    start: u64,
    end: u64,
    until: Instant,
}

struct Table {
    /// Every object's epoch is at least this: one above every epoch handed out before this table's start.
    floor: u64,
    /// The highest epoch handed out, as persisted.
    persisted: u64,
    epochs: HashMap<u64, u64>,
    /// By object; disjoint ranges (several copiers of one object, each a range: the healer's batches).
    holds: HashMap<u64, Vec<Hold>>,
    /// Holds in all the lists.
    held: usize,
}

pub struct Fences {
    path: PathBuf,
    table: Mutex<Table>,
    /// Cheap test before taking the lock: no hold anywhere means an unfenced write passes untouched.
    any_hold: AtomicBool,
}

impl Fences {
    /// Loads the high-water mark under `root` (none yet: a new server, floor 1).
    pub fn open(root: &Path) -> io::Result<Fences> {
        let path = root.join("fence_epoch");
        let persisted = match std::fs::read(&path) {
            Ok(b) if b.len() == 8 => u64::from_le_bytes(b.try_into().expect("8 bytes")),
            Ok(b) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: {} bytes, not the 8 of a fence epoch (docs/format.md §32)", path.display(), b.len()),
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        };
        let floor = persisted.checked_add(1).ok_or_else(|| io::Error::other("fence epoch exhausted"))?;
        let table = Table { floor, persisted, epochs: HashMap::new(), holds: HashMap::new(), held: 0 };
        Ok(Fences { path, table: Mutex::new(table), any_hold: AtomicBool::new(false) })
    }

    /// Admits a write of object bytes `[start, end)` of `ino` (a cut at `size`: `[size, u64::MAX)`) carrying
    /// `fence`; called under the write's exclusive range lock.
    pub fn admit(&self, ino: u64, bytes: (u64, u64), fence: WriteFence) -> Result<(), FenceRefusal> {
        if fence == WriteFence::NONE && !self.any_hold.load(Ordering::Acquire) {
            return Ok(());
        }
        self.admit_at(ino, bytes, fence, Instant::now())
    }

    /// [`Fences::admit`] at `now` (the seam a simulation drives holds' expiry through).
    pub fn admit_at(
        &self,
        ino: u64,
        (start, end): (u64, u64),
        fence: WriteFence,
        now: Instant,
    ) -> Result<(), FenceRefusal> {
        let mut t = self.table.lock().expect("fence table");
        t.expire(ino, now);
        let holds = t.holds.get(&ino).map_or(&[][..], Vec::as_slice);
        if fence.hold != 0 {
            return match holds.iter().find(|h| h.id == fence.hold) {
                Some(h) if h.start <= start && end <= h.end => Ok(()),
                Some(_) => Err(FenceRefusal::Invalid { ino, reason: "a write under a hold lies inside its range" }),
                None => Err(FenceRefusal::HoldLost { ino, hold: fence.hold }),
            };
        }
        if let Some(h) = holds.iter().find(|h| h.start < end.max(start + 1) && start < h.end) {
            return Err(FenceRefusal::Held { ino, left_ms: (h.until - now).as_millis() as u64 });
        }
        let epoch = t.epoch(ino);
        if fence.epoch != 0 && fence.epoch < epoch {
            return Err(FenceRefusal::EpochMoved { ino, carried: fence.epoch, epoch });
        }
        Ok(())
    }

    /// Does `act` on `ino`; called under an exclusive lock of the whole object (a raise must fall between writes).
    pub fn fence(&self, ino: u64, act: FenceAct) -> Result<FenceResp, FenceRefusal> {
        self.fence_at(ino, act, Instant::now())
    }

    /// [`Fences::fence`] at `now` (the seam a simulation drives holds' expiry through).
    pub fn fence_at(&self, ino: u64, act: FenceAct, now: Instant) -> Result<FenceResp, FenceRefusal> {
        let mut t = self.table.lock().expect("fence table");
        t.expire(ino, now);
        let resp = match act {
            FenceAct::Query => FenceResp { epoch: t.epoch(ino), hold: 0 },
            FenceAct::Release { hold } => {
                t.release(ino, hold);
                FenceResp { epoch: t.epoch(ino), hold: 0 }
            }
            FenceAct::Bump => FenceResp { epoch: self.raise(&mut t, ino)?, hold: 0 },
            FenceAct::Hold { start, end, ttl_ms } => self.hold(&mut t, ino, (start, end), ttl_ms, now)?,
        };
        self.any_hold.store(t.held > 0, Ordering::Release);
        Ok(resp)
    }

    fn hold(
        &self,
        t: &mut Table,
        ino: u64,
        (start, end): (u64, u64),
        ttl_ms: u32,
        now: Instant,
    ) -> Result<FenceResp, FenceRefusal> {
        if ttl_ms == 0 || ttl_ms > HOLD_TTL_MS_MAX || start >= end {
            return Err(FenceRefusal::Invalid { ino, reason: "a hold covers some bytes, for 1 to 30 000 ms" });
        }
        let holds = t.holds.get(&ino).map_or(&[][..], Vec::as_slice);
        if let Some(h) = holds.iter().find(|h| h.start < end && start < h.end) {
            return Err(FenceRefusal::Held { ino, left_ms: (h.until - now).as_millis() as u64 });
        }
        if t.held >= HOLDS_MAX {
            t.expire_all(now);
            if t.held >= HOLDS_MAX {
                return Err(FenceRefusal::Full);
            }
        }
        let epoch = self.raise(t, ino)?;
        // Random, so a hold taken before a restart never matches one taken after it.
        let id = weft_rpc::auth::random_id();
        let until = now + Duration::from_millis(u64::from(ttl_ms));
        t.holds.entry(ino).or_default().push(Hold { id, start, end, until });
        t.held += 1;
        Ok(FenceResp { epoch, hold: id })
    }

    /// Raises `ino`'s epoch by one, persisting the high-water mark first when it passes it.
    fn raise(&self, t: &mut Table, ino: u64) -> Result<u64, FenceRefusal> {
        let old = t.epoch(ino);
        let epoch = old.checked_add(1).ok_or(FenceRefusal::Invalid { ino, reason: "epoch exhausted" })?;
        if epoch > t.persisted {
            self.persist(epoch)?;
            t.persisted = epoch;
        }
        if t.epochs.len() >= EPOCHS_MAX && !t.epochs.contains_key(&ino) {
            // Forget them all at once: the floor stands above every one of them.
            t.floor = t.persisted;
            t.epochs.clear();
        }
        t.epochs.insert(ino, epoch);
        weft_rpc::invariant!(epoch > old && t.epoch(ino) == epoch && t.persisted >= epoch);
        Ok(epoch)
    }

    fn persist(&self, epoch: u64) -> Result<(), FenceRefusal> {
        let tmp = self.path.with_extension("tmp");
        let r = (|| {
            std::fs::write(&tmp, epoch.to_le_bytes())?;
            std::fs::File::open(&tmp)?.sync_all()?;
            std::fs::rename(&tmp, &self.path)?;
            let dir = self.path.parent().unwrap_or(Path::new("."));
            std::fs::File::open(dir)?.sync_all()
        })();
        r.map_err(|e| FenceRefusal::Persist { path: self.path.clone(), reason: e.to_string() })
    }
}

impl Table {
    fn epoch(&self, ino: u64) -> u64 {
        self.epochs.get(&ino).copied().unwrap_or(0).max(self.floor)
    }

    /// Drops `ino`'s holds that ran out.
    fn expire(&mut self, ino: u64, now: Instant) {
        if let Some(v) = self.holds.get_mut(&ino) {
            let before = v.len();
            v.retain(|h| h.until > now);
            self.held -= before - v.len();
            if v.is_empty() {
                self.holds.remove(&ino);
            }
        }
    }

    fn expire_all(&mut self, now: Instant) {
        let inos: Vec<u64> = self.holds.keys().copied().collect();
        inos.into_iter().for_each(|ino| self.expire(ino, now));
    }

    fn release(&mut self, ino: u64, hold: u64) {
        if let Some(v) = self.holds.get_mut(&ino) {
            let before = v.len();
            v.retain(|h| h.id != hold);
            self.held -= before - v.len();
            if v.is_empty() {
                self.holds.remove(&ino);
            }
        }
        weft_rpc::invariant!(self.held == self.holds.values().map(Vec::len).sum::<usize>());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fences(name: &str) -> (Fences, PathBuf) {
        let dir = std::env::temp_dir().join(format!("weft-fences-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        (Fences::open(&dir).unwrap(), dir)
    }

    const ALL: (u64, u64) = (0, 4096);

    #[test]
    fn a_bump_refuses_older_epochs_and_survives_a_restart() {
        let (f, dir) = fences("bump");
        assert_eq!(f.fence(7, FenceAct::Query).unwrap().epoch, 1);
        f.admit(7, ALL, WriteFence::at(1)).unwrap();
        let e = f.fence(7, FenceAct::Bump).unwrap().epoch;
        assert_eq!(e, 2);
        assert_eq!(f.admit(7, ALL, WriteFence::at(1)), Err(FenceRefusal::EpochMoved { ino: 7, carried: 1, epoch: 2 }));
        f.admit(7, ALL, WriteFence::at(2)).unwrap();
        // Other objects and unfenced writes are untouched.
        f.admit(8, ALL, WriteFence::at(1)).unwrap();
        f.admit(7, ALL, WriteFence::NONE).unwrap();
        drop(f);
        let f = Fences::open(&dir).unwrap();
        // After a restart every epoch handed out before is below the floor, on every object.
        assert_eq!(f.fence(7, FenceAct::Query).unwrap().epoch, 3);
        assert!(matches!(f.admit(7, ALL, WriteFence::at(2)), Err(FenceRefusal::EpochMoved { .. })));
        assert!(matches!(f.admit(8, ALL, WriteFence::at(1)), Err(FenceRefusal::EpochMoved { .. })));
        f.admit(8, ALL, WriteFence::at(3)).unwrap();
        std::fs::write(dir.join("fence_epoch"), [1, 2, 3]).unwrap();
        assert!(Fences::open(&dir).is_err(), "a damaged high-water mark refuses to start");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_hold_admits_only_its_own_writes_over_its_range_until_released() {
        let (f, dir) = fences("hold");
        let hold = |start, end| FenceAct::Hold { start, end, ttl_ms: 30_000 };
        let h = f.fence(5, hold(8192, 16384)).unwrap();
        assert_eq!(h.epoch, 2);
        assert_ne!(h.hold, 0);
        for range in [(8192, 8193), (0, 8193), (16383, 20000), (10000, 10000)] {
            assert!(matches!(f.admit(5, range, WriteFence::at(2)), Err(FenceRefusal::Held { .. })), "{range:?}");
            assert!(matches!(f.admit(5, range, WriteFence::NONE), Err(FenceRefusal::Held { .. })), "{range:?}");
        }
        // A cut at `size` touches every byte past it.
        assert!(matches!(f.admit(5, (4096, u64::MAX), WriteFence::at(2)), Err(FenceRefusal::Held { .. })));
        f.admit(5, (0, 8192), WriteFence::at(2)).unwrap();
        f.admit(5, (16384, 20000), WriteFence::at(2)).unwrap();
        assert!(matches!(f.fence(5, hold(0, 8193)), Err(FenceRefusal::Held { .. })));
        // A disjoint range of the same object: a second copier.
        let h2 = f.fence(5, hold(16384, 32768)).unwrap();
        assert_eq!(h2.epoch, 3);
        f.admit(5, (8192, 16384), WriteFence { epoch: 0, hold: h.hold }).unwrap();
        let outside = f.admit(5, (8192, 16385), WriteFence { epoch: 0, hold: h.hold });
        assert!(matches!(outside, Err(FenceRefusal::Invalid { .. })));
        f.admit(6, ALL, WriteFence::NONE).unwrap();
        // Another id's release does nothing.
        f.fence(5, FenceAct::Release { hold: h.hold ^ 1 }).unwrap();
        assert!(matches!(f.admit(5, (8192, 8193), WriteFence::at(3)), Err(FenceRefusal::Held { .. })));
        f.fence(5, FenceAct::Release { hold: h.hold }).unwrap();
        f.admit(5, (8192, 8193), WriteFence::at(3)).unwrap();
        let lost = f.admit(5, (8192, 8193), WriteFence { epoch: 0, hold: h.hold });
        assert_eq!(lost, Err(FenceRefusal::HoldLost { ino: 5, hold: h.hold }));
        f.fence(5, FenceAct::Release { hold: h2.hold }).unwrap();
        assert!(!f.any_hold.load(Ordering::Acquire));
        assert!(matches!(
            f.fence(5, FenceAct::Hold { start: 0, end: 1, ttl_ms: 0 }),
            Err(FenceRefusal::Invalid { .. })
        ));
        assert!(matches!(f.fence(5, hold(7, 7)), Err(FenceRefusal::Invalid { .. })));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_expired_hold_lets_writers_through_and_refuses_its_copier() {
        let (f, dir) = fences("expiry");
        let h = f.fence(9, FenceAct::Hold { start: 0, end: 4096, ttl_ms: 1 }).unwrap();
        // The hold's expiry is judged by the clock; wait for it to pass rather than for a fixed time.
        while f.admit(9, ALL, WriteFence::at(h.epoch)).is_err() {
            std::thread::yield_now();
        }
        let lost = f.admit(9, ALL, WriteFence { epoch: 0, hold: h.hold });
        assert!(matches!(lost, Err(FenceRefusal::HoldLost { .. })));
        assert_eq!(f.table.lock().unwrap().held, 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_full_epoch_table_raises_the_floor_over_all_it_forgets() {
        let (f, dir) = fences("full");
        for ino in 0..EPOCHS_MAX as u64 {
            f.fence(ino, FenceAct::Bump).unwrap();
        }
        f.fence(u64::MAX, FenceAct::Bump).unwrap();
        for ino in [0, 1, EPOCHS_MAX as u64 - 1] {
            let r = f.admit(ino, ALL, WriteFence::at(1));
            assert!(matches!(r, Err(FenceRefusal::EpochMoved { .. })), "ino {ino}");
        }
        assert!(f.table.lock().unwrap().epochs.len() <= 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn holds_are_bounded() {
        let (f, dir) = fences("bounded");
        for ino in 0..HOLDS_MAX as u64 {
            f.fence(ino, FenceAct::Hold { start: 0, end: 1, ttl_ms: 30_000 }).unwrap();
        }
        let r = f.fence(u64::MAX, FenceAct::Hold { start: 0, end: 1, ttl_ms: 30_000 });
        assert_eq!(r, Err(FenceRefusal::Full));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
