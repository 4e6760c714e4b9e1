//! Chunk lists of the RPC Read-Write design (dissertation ch. 6, RPC/RDMA's read and write chunks): a request
//! names spans of memory the *client* registered, and the server moves the bulk data between its own buffers and
//! those spans with one-sided operations (`get`/`put` on the fabric). The server never exposes its own memory.
//!
//! A [`Region`] is what a client registered in its session: an id and a length (plus, for the `shm` fabric's
//! process-memory regions, the base address in the client). A [`Chunk`] is `(region, offset, len)` relative to a
//! region. [`RegionTable::check`] is the one gate every chunk list passes before a byte moves: every chunk must lie
//! wholly inside a registered region, their lengths must add up to what the op transfers, and there may be at most
//! [`CHUNKS_MAX`] of them. The check is pure arithmetic (no I/O), so it is fuzzed with the decoders.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// Most chunks one request may carry (one per piece of a transfer unit; a 1 MiB unit of 4 KiB stripes is 256).
pub const CHUNKS_MAX: usize = 1024;
/// Region id of the connection's pre-registered arena (shared memory passed at connect), when it has one.
pub const ARENA_REGION: u32 = 0;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Chunk {
    pub region: u32,
    pub offset: u64,
    pub len: u32,
}

/// A memory region a client registers with a server (op `Regions`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Region {
    pub id: u32,
    /// Base address in the client's address space (process-memory regions); 0 for fabric-provided regions.
    pub addr: u64,
    pub len: u64,
    /// The fabric's remote key for the region (`rdma`: the memory region's rkey); 0 where the fabric needs none.
    pub rkey: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChunkError {
    #[error("{count} chunks exceed the limit of {CHUNKS_MAX}")]
    TooMany { count: usize },
    #[error("chunk {index} names region {region}, which this session never registered")]
    UnknownRegion { index: usize, region: u32 },
    #[error("chunk {index} [{offset}, +{len}) lies outside region {region} of {region_len} bytes")]
    OutOfRegion { index: usize, region: u32, offset: u64, len: u32, region_len: u64 },
    #[error("chunks carry {have} bytes, the op transfers {want}")]
    LengthMismatch { have: u64, want: u64 },
    #[error("region {id} of {len} bytes at {addr:#x} wraps the address space or is empty")]
    BadRegion { id: u32, addr: u64, len: u64 },
    #[error("region id {0} is reserved for the fabric's arena")]
    Reserved(u32),
    #[error("a session may register at most {max} regions")]
    TooManyRegions { max: usize },
}

/// The regions one client connection registered, bounded. Checked against every chunk list.
#[derive(Debug, Default, Clone)]
pub struct RegionTable {
    regions: HashMap<u32, Region>,
    regions_max: usize,
}

impl RegionTable {
    pub fn new(regions_max: usize) -> RegionTable {
        RegionTable { regions: HashMap::new(), regions_max }
    }

    /// Installs the fabric's arena (region [`ARENA_REGION`]); only the fabric does this, never a request.
    pub fn set_arena(&mut self, len: u64) {
        self.regions.insert(ARENA_REGION, Region { id: ARENA_REGION, addr: 0, len, rkey: 0 });
    }

    /// Installs a region the fabric set up itself at connect (the `rdma` arena, with its address and rkey); only
    /// the fabric does this, never a request.
    pub fn set_fabric_region(&mut self, r: Region) {
        self.regions.insert(r.id, r);
    }

    /// Applies a client's batch: removals first, then additions (an id may be reused in the same batch).
    pub fn apply(&mut self, add: &[Region], remove: &[u32]) -> Result<(), ChunkError> {
        for r in add {
            if r.id == ARENA_REGION {
                return Err(ChunkError::Reserved(r.id));
            }
            if r.len == 0 || r.addr.checked_add(r.len).is_none() {
                return Err(ChunkError::BadRegion { id: r.id, addr: r.addr, len: r.len });
            }
        }
        if remove.contains(&ARENA_REGION) {
            return Err(ChunkError::Reserved(ARENA_REGION));
        }
        for id in remove {
            self.regions.remove(id);
        }
        for r in add {
            if !self.regions.contains_key(&r.id) && self.regions.len() >= self.regions_max {
                return Err(ChunkError::TooManyRegions { max: self.regions_max });
            }
            self.regions.insert(r.id, *r);
        }
        Ok(())
    }

    pub fn get(&self, id: u32) -> Option<&Region> {
        self.regions.get(&id)
    }

    pub fn len(&self) -> usize {
        self.regions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }

    /// Every chunk inside a registered region, at most [`CHUNKS_MAX`] of them, lengths adding up to `want`.
    pub fn check(&self, chunks: &[Chunk], want: u64) -> Result<(), ChunkError> {
        if chunks.len() > CHUNKS_MAX {
            return Err(ChunkError::TooMany { count: chunks.len() });
        }
        let mut have: u64 = 0;
        for (index, c) in chunks.iter().enumerate() {
            let r = self.regions.get(&c.region).ok_or(ChunkError::UnknownRegion { index, region: c.region })?;
            let inside = c.offset.checked_add(u64::from(c.len)).is_some_and(|end| end <= r.len);
            if !inside {
                return Err(ChunkError::OutOfRegion {
                    index,
                    region: c.region,
                    offset: c.offset,
                    len: c.len,
                    region_len: r.len,
                });
            }
            have += u64::from(c.len);
        }
        if have != want {
            return Err(ChunkError::LengthMismatch { have, want });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_checked_against_regions() {
        let mut t = RegionTable::new(4);
        t.set_arena(1 << 20);
        t.apply(&[Region { id: 5, addr: 0x1000, len: 8192, rkey: 0 }], &[]).unwrap();
        let ok = [Chunk { region: 0, offset: 0, len: 4096 }, Chunk { region: 5, offset: 4096, len: 4096 }];
        t.check(&ok, 8192).unwrap();
        assert!(matches!(t.check(&ok, 8191), Err(ChunkError::LengthMismatch { .. })));
        let past = [Chunk { region: 5, offset: 4097, len: 4096 }];
        assert!(matches!(t.check(&past, 4096), Err(ChunkError::OutOfRegion { index: 0, .. })));
        let wrap = [Chunk { region: 5, offset: u64::MAX, len: 2 }];
        assert!(matches!(t.check(&wrap, 2), Err(ChunkError::OutOfRegion { .. })));
        let unknown = [Chunk { region: 9, offset: 0, len: 1 }];
        assert!(matches!(t.check(&unknown, 1), Err(ChunkError::UnknownRegion { region: 9, .. })));
        // Deregistered regions are refused again.
        t.apply(&[], &[5]).unwrap();
        assert!(t.check(&ok, 8192).is_err());
    }

    #[test]
    fn registration_is_bounded_and_guards_the_arena() {
        let mut t = RegionTable::new(2);
        assert!(matches!(t.apply(&[Region { id: 0, addr: 1, len: 1, rkey: 0 }], &[]), Err(ChunkError::Reserved(0))));
        assert!(t.apply(&[Region { id: 1, addr: u64::MAX, len: 2, rkey: 0 }], &[]).is_err());
        assert!(t.apply(&[Region { id: 1, addr: 1, len: 0, rkey: 0 }], &[]).is_err());
        t.apply(&[Region { id: 1, addr: 1, len: 1, rkey: 0 }, Region { id: 2, addr: 1, len: 1, rkey: 0 }], &[])
            .unwrap();
        assert!(matches!(
            t.apply(&[Region { id: 3, addr: 1, len: 1, rkey: 0 }], &[]),
            Err(ChunkError::TooManyRegions { max: 2 })
        ));
        t.apply(&[Region { id: 3, addr: 1, len: 1, rkey: 0 }], &[1]).unwrap();
        assert_eq!(t.len(), 2);
    }
}
