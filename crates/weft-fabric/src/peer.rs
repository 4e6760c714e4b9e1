//! What the server side of every one-sided backend keeps per client connection: the regions the client
//! registered (the arena the fabric set up, plus `Regions` entries, bounded), the gate every chunk list passes
//! before a byte moves, the revoked flag, and the process-wide counters the `FabricStat` op reports.

use std::io;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use weft_proto::chunk::ARENA_REGION;
use weft_proto::{Chunk, ChunkError, Region, RegionTable};

use crate::MemoryError;

/// Regions one connection may register (its arena excluded).
pub const REGIONS_MAX: usize = 4096;

static ARENAS: AtomicU64 = AtomicU64::new(0);
static REGIONS: AtomicU64 = AtomicU64::new(0);
static REFUSED: AtomicU64 = AtomicU64::new(0);

/// Counters over every one-sided server connection of this process (all backends).
pub(crate) fn stats() -> weft_proto::msg::FabricStat {
    weft_proto::msg::FabricStat {
        arenas: ARENAS.load(Ordering::SeqCst),
        regions: REGIONS.load(Ordering::SeqCst),
        chunks_refused: REFUSED.load(Ordering::SeqCst),
    }
}

/// One client connection's registered memory, as the server checks it.
pub(crate) struct ClientRegions {
    table: Mutex<RegionTable>,
    revoked: AtomicBool,
}

impl ClientRegions {
    /// `arena`: the region the fabric set up at connect ([`ARENA_REGION`]), if the client passed one.
    pub fn new(arena: Option<Region>) -> ClientRegions {
        let mut table = RegionTable::new(REGIONS_MAX + 1);
        if let Some(a) = arena {
            table.set_fabric_region(a);
            ARENAS.fetch_add(1, Ordering::SeqCst);
        }
        ClientRegions { table: Mutex::new(table), revoked: AtomicBool::new(false) }
    }

    /// The client's own registrations (the arena is the fabric's).
    fn client_regions(t: &RegionTable) -> u64 {
        t.len() as u64 - u64::from(t.get(ARENA_REGION).is_some())
    }

    /// Applies a registration batch (see [`crate::PeerMemory::register`]).
    pub fn register(&self, add: &[Region], remove: &[u32]) -> Result<(), ChunkError> {
        let mut t = self.table.lock().expect("regions");
        let before = Self::client_regions(&t);
        let r = t.apply(add, remove);
        let after = Self::client_regions(&t);
        if after >= before {
            REGIONS.fetch_add(after - before, Ordering::SeqCst);
        } else {
            REGIONS.fetch_sub(before - after, Ordering::SeqCst);
        }
        r
    }

    /// Checks a chunk list without moving data; a refusal is counted.
    pub fn check(&self, chunks: &[Chunk], want: u64) -> Result<(), ChunkError> {
        let r = self.table.lock().expect("regions").check(chunks, want);
        if r.is_err() {
            REFUSED.fetch_add(1, Ordering::SeqCst);
        }
        r
    }

    /// The gate before a transfer: fails once revoked, checks the list (counting a refusal), then maps every
    /// chunk with the region it lies in (guaranteed to exist, and `region.addr + chunk.offset + chunk.len` not
    /// to overflow, by the check).
    pub fn resolve<T>(
        &self,
        chunks: &[Chunk],
        want: u64,
        mut f: impl FnMut(&Region, &Chunk) -> T,
    ) -> Result<Vec<T>, MemoryError> {
        if self.revoked.load(Ordering::SeqCst) {
            return Err(MemoryError::Io(io::Error::new(io::ErrorKind::NotConnected, "the client's connection ended")));
        }
        let t = self.table.lock().expect("regions");
        t.check(chunks, want).inspect_err(|_| {
            REFUSED.fetch_add(1, Ordering::SeqCst);
        })?;
        Ok(chunks.iter().map(|c| f(t.get(c.region).expect("checked: the region is registered"), c)).collect())
    }

    /// The connection ended: every later [`ClientRegions::resolve`] fails.
    pub fn revoke(&self) {
        self.revoked.store(true, Ordering::SeqCst);
    }
}

impl Drop for ClientRegions {
    fn drop(&mut self) {
        if let Ok(t) = self.table.lock() {
            if t.get(ARENA_REGION).is_some() {
                ARENAS.fetch_sub(1, Ordering::SeqCst);
            }
            REGIONS.fetch_sub(Self::client_regions(&t), Ordering::SeqCst);
        }
    }
}
