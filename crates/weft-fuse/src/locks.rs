//! Advisory locks through the mount: the kernel's `getlk`/`setlk` (with `FUSE_POSIX_LOCKS`) and `flock` (with
//! `FUSE_FLOCK_LOCKS`, sent as `setlk` on the whole file) go to the MDS, so every mount and gateway sees them.
//!
//! Owner: the kernel's `lock_owner` (its `files_struct` for POSIX locks, the open file for `flock`), under this
//! mount's MDS session. fuser 0.18 does not pass the request's `FUSE_LK_FLOCK` flag, so a `flock` cannot be told
//! from a whole-file POSIX lock: both are POSIX locks at the MDS, as the Linux NFS client emulates `flock`. So
//! through the mount `flock` and `fcntl` locks on one file conflict with each other (not on a local Linux file
//! system), and an exclusive `flock` needs write permission to the file.
//!
//! Release: the kernel sends `flush` with the POSIX owner at every `close(2)` (a process's POSIX locks on a file
//! go at any close of it) and `release` with the `flock` owner when its last descriptor closes, also when a
//! process dies. Those are the only lock calls a plain close costs, and only for an (inode, owner) this mount
//! saw lock: [`LockOwners`] remembers which, bounded by [`LOCK_OWNERS_MAX`] (past it a new lock is refused with
//! ENOLCK).
//!
//! Blocking (`F_SETLKW`, `flock` without `LOCK_NB`): [`weft_client::Client::set_lock_wait`] retries with capped
//! backoff while the requesting process lives (`/proc/PID`); a process killed while waiting stops the retries.

use std::collections::HashSet;
use std::sync::Mutex;

use weft_proto::msg::{LockClass, LockHolder, LockKind};

/// Most (inode, owner) pairs a mount remembers as holding locks.
pub const LOCK_OWNERS_MAX: usize = 65_536;

#[derive(Default)]
pub(crate) struct LockOwners {
    held: Mutex<HashSet<(u64, u64)>>,
}

impl LockOwners {
    /// Remembers that `owner` may hold locks on `ino`; false when the set is full.
    pub(crate) fn note(&self, ino: u64, owner: u64) -> bool {
        let mut held = self.held.lock().expect("lock owners");
        if held.len() >= LOCK_OWNERS_MAX && !held.contains(&(ino, owner)) {
            return false;
        }
        held.insert((ino, owner));
        true
    }

    /// Forgets `(ino, owner)`: whether it was there (and its locks are to be released).
    pub(crate) fn take(&self, ino: u64, owner: u64) -> bool {
        self.held.lock().expect("lock owners").remove(&(ino, owner))
    }
}

/// The kernel's lock type (`F_RDLCK`, `F_WRLCK`, `F_UNLCK`) as a lock kind (`None`: unlock); `Err` for others.
pub(crate) fn kind_of(typ: i32) -> Result<Option<LockKind>, ()> {
    match typ {
        libc::F_RDLCK => Ok(Some(LockKind::Shared)),
        libc::F_WRLCK => Ok(Some(LockKind::Exclusive)),
        libc::F_UNLCK => Ok(None),
        _ => Err(()),
    }
}

/// The kernel's lock type of a holder.
pub(crate) fn typ_of(h: &LockHolder) -> i32 {
    match h.kind {
        LockKind::Shared => libc::F_RDLCK,
        LockKind::Exclusive => libc::F_WRLCK,
    }
}

/// The class every lock through the mount has (see the module doc).
pub(crate) const CLASS: LockClass = LockClass::Posix;

/// Whether process `pid` still exists (a blocked lock request is wanted only while its process is).
pub(crate) fn process_alive(pid: u32) -> bool {
    pid == 0 || std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_remembered_until_taken_and_bounded() {
        let o = LockOwners::default();
        assert!(o.note(1, 7) && o.note(1, 7));
        assert!(o.take(1, 7) && !o.take(1, 7));
        for i in 0..LOCK_OWNERS_MAX as u64 {
            assert!(o.note(i, 1));
        }
        assert!(!o.note(u64::MAX, 1), "full");
        assert!(o.note(3, 1), "a known pair is fine");
        assert_eq!(kind_of(libc::F_WRLCK), Ok(Some(LockKind::Exclusive)));
        assert_eq!(kind_of(libc::F_UNLCK), Ok(None));
        assert!(kind_of(99).is_err());
        assert!(process_alive(std::process::id()));
    }
}
