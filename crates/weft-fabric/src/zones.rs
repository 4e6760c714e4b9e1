//! Server memory zones: the buffers a server moves bulk data through, announced once so a one-sided backend can
//! register them with its device once (an `rdma` memory region per zone and device) instead of per transfer.
//!
//! A zone is announced by its owner (the data server's buffer pool) right after it is allocated and pre-faulted,
//! and must stay mapped for the rest of the process: zones are never withdrawn, so a backend may keep its
//! registration for as long as it lives. [`find`] tells a backend which zone holds a buffer it was handed.

use std::sync::Mutex;

/// Most zones a process may announce (each costs a registration per device).
pub const ZONES_MAX: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Zone {
    pub addr: usize,
    pub len: usize,
}

static ZONES: Mutex<Vec<Zone>> = Mutex::new(Vec::new());

/// Announces `[addr, addr + len)` as a zone. The caller promises the memory stays mapped (and is not moved) until
/// the process exits. Returns false (and announces nothing) past [`ZONES_MAX`] or for an empty zone.
pub fn announce(addr: *const u8, len: usize) -> bool {
    let mut z = ZONES.lock().expect("zones");
    if len == 0 || z.len() >= ZONES_MAX {
        return false;
    }
    z.push(Zone { addr: addr as usize, len });
    true
}

/// Every zone announced so far, oldest first.
pub fn all() -> Vec<Zone> {
    ZONES.lock().expect("zones").clone()
}

/// The zone wholly containing `[addr, addr + len)`, if any.
pub fn find(addr: *const u8, len: usize) -> Option<Zone> {
    let a = addr as usize;
    let end = a.checked_add(len)?;
    ZONES.lock().expect("zones").iter().copied().find(|z| z.addr <= a && end <= z.addr + z.len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_needs_the_whole_span_inside_one_zone() {
        let mem: &'static mut [u8] = Box::leak(vec![0u8; 8192].into_boxed_slice());
        assert!(announce(mem.as_ptr(), 4096));
        let base = mem.as_ptr();
        assert_eq!(find(base, 4096).map(|z| z.len), Some(4096));
        // `wrapping_add` only computes addresses; nothing is dereferenced.
        assert!(find(base.wrapping_add(4000), 96).is_some());
        assert!(find(base.wrapping_add(4000), 97).is_none(), "runs past the zone's end");
        assert!(find(base.wrapping_add(4096), 1).is_none(), "outside every zone");
        assert!(!announce(base, 0), "an empty zone is refused");
    }
}
