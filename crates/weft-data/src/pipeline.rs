//! Pieces of one transfer unit, for double buffering: a `ReadChunks`/`WriteChunks` larger than a piece is moved in
//! pieces, the disk working on one while the fabric moves the other.
//!
//! Piece edges sit at multiples of the piece size in *object* offsets (the piece size is a multiple of the 4 KiB
//! checksum block), so every piece but an unaligned first or last one covers whole blocks and a write never merges
//! a block twice. The client's chunk list is cut at the same edges: a chunk that straddles an edge is split into
//! two chunks of the same region.
//!
//! [`write_chunks`] and [`read_chunks`] run the two stages on tokio's blocking pool with exactly two buffers (or
//! one, when the pool cannot lend a pair: then the stages alternate): while the disk stage works on piece `i` out
//! of one buffer, the fabric stage moves piece `i + 1` through the other. Both stages of a step are joined before
//! the next step starts, so an error in either ends the transfer with nothing left running and nothing more
//! moved: no piece is put to the client after a failed read, none written after a failed get. Pieces before the
//! failure stay done (a failed write may have written a prefix, as with `pwrite`); the reply is the error.

use std::sync::Arc;

use tokio::task::JoinHandle;
use weft_fabric::{MemoryError, PeerMemory};
use weft_proto::msg::WriteFence;
use weft_proto::{Chunk, ErrorCode, WireError};
use weft_rpc::PoolBuf;

use crate::store::{MappedRead, ObjectStore};

/// One piece of a transfer: where it goes in the object, and the client memory that holds its bytes, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub object_offset: u64,
    pub len: u64,
    pub chunks: Vec<Chunk>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PieceError {
    #[error("piece size must be a non-zero multiple of 4096, not {0}")]
    PieceBytes(u64),
    #[error("a chunk at region offset {0} runs past the end of the address space")]
    ChunkOverflow(u64),
    #[error("a transfer at object offset {0} runs past the end of the offset space")]
    OffsetOverflow(u64),
}

/// Cuts the transfer of `chunks` (all their bytes, in order) to object `offset` into pieces whose edges are the
/// multiples of `piece_bytes`. Empty chunks are dropped; no piece is empty. The chunks must have been checked
/// against the client's regions already; this only does the arithmetic (checked, so a bad list errs, never panics).
pub fn split(chunks: &[Chunk], offset: u64, piece_bytes: u64) -> Result<Vec<Piece>, PieceError> {
    if piece_bytes == 0 || !piece_bytes.is_multiple_of(4096) {
        return Err(PieceError::PieceBytes(piece_bytes));
    }
    let total: u64 = chunks.iter().map(|c| u64::from(c.len)).sum();
    offset.checked_add(total).ok_or(PieceError::OffsetOverflow(offset))?;
    let mut pieces: Vec<Piece> = Vec::new();
    let mut at = offset;
    // Bytes still to place in the current piece; 0 starts a new one.
    let mut room = 0u64;
    for c in chunks {
        let mut done = 0u64;
        let len = u64::from(c.len);
        while done < len {
            if room == 0 {
                room = piece_bytes - at % piece_bytes;
                pieces.push(Piece { object_offset: at, len: 0, chunks: Vec::new() });
            }
            let n = room.min(len - done);
            let region_offset = c.offset.checked_add(done).ok_or(PieceError::ChunkOverflow(c.offset))?;
            region_offset.checked_add(n).ok_or(PieceError::ChunkOverflow(c.offset))?;
            let piece = pieces.last_mut().expect("a piece was just opened");
            // `n` fits a u32: it is at most the chunk's own length.
            piece.chunks.push(Chunk { region: c.region, offset: region_offset, len: n as u32 });
            piece.len += n;
            done += n;
            room -= n;
            at += n;
        }
    }
    Ok(pieces)
}

/// How a failed one-sided transfer is reported (and logged) to the client.
pub fn memory_error(peer: &str, e: MemoryError) -> WireError {
    match e {
        MemoryError::Chunk(c) => {
            tracing::warn!(%peer, "refusing a chunk list: {c}");
            WireError::new(ErrorCode::BadRequest, format!("chunk list refused: {c}"))
        }
        other => {
            tracing::warn!(%peer, "one-sided transfer failed: {other}");
            WireError::new(ErrorCode::Io, other.to_string())
        }
    }
}

pub fn join_error(e: tokio::task::JoinError) -> WireError {
    WireError::new(ErrorCode::Internal, format!("disk task failed: {e}"))
}

fn joined<T>(r: Result<Result<T, WireError>, tokio::task::JoinError>) -> Result<T, WireError> {
    r.map_err(join_error)?
}

/// Waits for the stage in flight, if any, and hands back the buffer it used.
async fn finish(stage: Option<JoinHandle<Result<PoolBuf, WireError>>>) -> Option<Result<PoolBuf, WireError>> {
    match stage {
        Some(h) => Some(joined(h.await)),
        None => None,
    }
}

/// A client's `WriteChunks`: `get` piece `i + 1` into one buffer while piece `i` is checksummed and written from
/// the other. `bufs` holds one or two buffers, each at least as large as the largest piece.
pub async fn write_chunks(
    store: Arc<ObjectStore>,
    memory: Arc<dyn PeerMemory>,
    peer: Arc<str>,
    (ino, fence): (u64, WriteFence),
    pieces: Vec<Piece>,
    mut bufs: Vec<PoolBuf>,
) -> Result<(), WireError> {
    if pieces.len() == 1 {
        // Nothing to overlap: one hand-off to the blocking pool, not two.
        let piece = pieces.into_iter().next().expect("one piece");
        let mut buf = bufs.pop().expect("at least one buffer");
        return joined(
            tokio::task::spawn_blocking(move || {
                buf.set_len(piece.len as usize);
                memory.get(&piece.chunks, buf.as_mut_slice()).map_err(|e| memory_error(&peer, e))?;
                store.write_fenced(ino, piece.object_offset, buf.as_slice(), fence).map_err(WireError::from)
            })
            .await,
        );
    }
    let mut writing: Option<JoinHandle<Result<PoolBuf, WireError>>> = None;
    for piece in pieces {
        if bufs.is_empty() {
            // A single buffer: the write of the previous piece must end before the next get can use it.
            bufs.push(finish(writing.take()).await.expect("the only buffer is being written")?);
        }
        let mut buf = bufs.pop().expect("a free buffer");
        let getting = {
            let memory = memory.clone();
            let peer = peer.clone();
            tokio::task::spawn_blocking(move || -> Result<(PoolBuf, u64), WireError> {
                buf.set_len(piece.len as usize);
                memory.get(&piece.chunks, buf.as_mut_slice()).map_err(|e| memory_error(&peer, e))?;
                Ok((buf, piece.object_offset))
            })
        };
        let (got, wrote) = tokio::join!(getting, finish(writing.take()));
        if let Some(wrote) = wrote {
            bufs.push(wrote?);
        }
        let (buf, object_offset) = joined(got)?;
        let store = store.clone();
        writing = Some(tokio::task::spawn_blocking(move || {
            store.write_fenced(ino, object_offset, buf.as_slice(), fence).map_err(WireError::from)?;
            Ok(buf)
        }));
    }
    finish(writing).await.transpose()?;
    Ok(())
}

/// One piece read from the object: a verified mapping of the page cache, or the bytes read into a pool buffer.
struct Loaded {
    mapped: Option<MappedRead>,
    buf: PoolBuf,
}

impl Loaded {
    fn as_bytes(&self) -> &[u8] {
        match &self.mapped {
            Some(m) => m.as_bytes(),
            None => self.buf.as_slice(),
        }
    }
}

/// Reads and verifies one piece. With `map`, from a mapping of the page cache when the piece lies inside the
/// object (no copy); otherwise (and past the object's end, which reads as zeros) into `buf`.
fn load(store: &ObjectStore, ino: u64, piece: &Piece, mut buf: PoolBuf, map: bool) -> Result<Loaded, WireError> {
    if map && let Some(m) = store.read_mapped(ino, piece.object_offset, piece.len).map_err(WireError::from)? {
        return Ok(Loaded { mapped: Some(m), buf });
    }
    buf.set_len(piece.len as usize);
    store.read(ino, piece.object_offset, buf.as_mut_slice()).map_err(WireError::from)?;
    Ok(Loaded { mapped: None, buf })
}

/// A client's `ReadChunks`: read and verify piece `i + 1` while piece `i` is `put` to the client. `map`: serve
/// from page-cache mappings (a fabric that reaches any server memory, `shm`); otherwise every piece goes through
/// a pool buffer, inside an announced zone (`rdma` moves bytes only from registered memory).
pub async fn read_chunks(
    store: Arc<ObjectStore>,
    memory: Arc<dyn PeerMemory>,
    peer: Arc<str>,
    ino: u64,
    pieces: Vec<Piece>,
    mut bufs: Vec<PoolBuf>,
    map: bool,
) -> Result<(), WireError> {
    if pieces.len() == 1 {
        let piece = pieces.into_iter().next().expect("one piece");
        let buf = bufs.pop().expect("at least one buffer");
        return joined(
            tokio::task::spawn_blocking(move || {
                let loaded = load(&store, ino, &piece, buf, map)?;
                memory.put(&piece.chunks, loaded.as_bytes()).map_err(|e| memory_error(&peer, e))
            })
            .await,
        );
    }
    let mut putting: Option<JoinHandle<Result<PoolBuf, WireError>>> = None;
    for piece in pieces {
        if bufs.is_empty() {
            bufs.push(finish(putting.take()).await.expect("the only buffer is being put")?);
        }
        let buf = bufs.pop().expect("a free buffer");
        let loading = {
            let store = store.clone();
            tokio::task::spawn_blocking(move || load(&store, ino, &piece, buf, map).map(|l| (l, piece.chunks)))
        };
        let (loaded, put) = tokio::join!(loading, finish(putting.take()));
        if let Some(put) = put {
            bufs.push(put?);
        }
        let (loaded, chunks) = joined(loaded)?;
        let memory = memory.clone();
        let peer = peer.clone();
        putting = Some(tokio::task::spawn_blocking(move || {
            memory.put(&chunks, loaded.as_bytes()).map_err(|e| memory_error(&peer, e))?;
            // The mapping (and its range lock) goes now; the buffer goes back for the piece after next.
            Ok(loaded.buf)
        }));
    }
    finish(putting).await.transpose()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: u64 = 1024;

    fn chunk(region: u32, offset: u64, len: u32) -> Chunk {
        Chunk { region, offset, len }
    }

    /// Every piece as (object offset, len, chunks); plus the invariants every split must keep.
    fn check(chunks: &[Chunk], offset: u64, piece: u64) -> Vec<Piece> {
        let pieces = split(chunks, offset, piece).unwrap();
        let total: u64 = chunks.iter().map(|c| u64::from(c.len)).sum();
        assert_eq!(pieces.iter().map(|p| p.len).sum::<u64>(), total);
        let mut at = offset;
        for (i, p) in pieces.iter().enumerate() {
            assert_eq!(p.object_offset, at, "pieces are contiguous");
            assert!(p.len > 0 && p.len <= piece);
            assert_eq!(p.chunks.iter().map(|c| u64::from(c.len)).sum::<u64>(), p.len);
            assert!(p.chunks.iter().all(|c| c.len > 0));
            // Only the first piece may start off an edge, only the last may end off one.
            if i > 0 {
                assert_eq!(p.object_offset % piece, 0);
            }
            if i + 1 < pieces.len() {
                assert_eq!((p.object_offset + p.len) % piece, 0);
            }
            at += p.len;
        }
        // Byte for byte, the pieces address the same client memory as the list they were cut from.
        let flat = |cs: &[Chunk]| -> Vec<(u32, u64)> {
            cs.iter().flat_map(|c| (0..u64::from(c.len)).map(move |i| (c.region, c.offset + i))).collect()
        };
        let cut: Vec<Chunk> = pieces.iter().flat_map(|p| p.chunks.iter().copied()).collect();
        assert_eq!(flat(&cut), flat(chunks));
        pieces
    }

    #[test]
    fn one_aligned_chunk_is_cut_at_every_edge() {
        let p = check(&[chunk(1, 0, 1 << 20)], 0, 256 * K);
        assert_eq!(p.len(), 4);
        for (i, piece) in p.iter().enumerate() {
            assert_eq!(piece.chunks, vec![chunk(1, i as u64 * 256 * K, 256 << 10)]);
        }
    }

    #[test]
    fn an_unaligned_transfer_gets_a_short_first_and_last_piece() {
        // Object offset 1000, 600 KiB: first piece up to 256 KiB, then one whole piece, then the rest.
        let p = check(&[chunk(3, 77, 600 << 10)], 1000, 256 * K);
        let lens: Vec<u64> = p.iter().map(|p| p.len).collect();
        assert_eq!(lens, vec![256 * K - 1000, 256 * K, 600 * K - (512 * K - 1000)]);
        assert_eq!(p[1].chunks, vec![chunk(3, 77 + 256 * K - 1000, 256 << 10)]);
        assert_eq!(p[2].object_offset, 512 * K);
    }

    #[test]
    fn chunks_straddling_edges_are_split_within_their_region() {
        // Three chunks of odd sizes in different regions; two of them cross a piece edge.
        let cs = [chunk(1, 10, 5000), chunk(2, 4096 * 3 + 1, 9000), chunk(7, 0, 3)];
        let p = check(&cs, 0, 4096);
        assert_eq!(p.len(), 4);
        assert_eq!(p[0].chunks, vec![chunk(1, 10, 4096)]);
        assert_eq!(p[1].chunks, vec![chunk(1, 4106, 904), chunk(2, 12289, 3192)]);
        assert_eq!(p[2].chunks, vec![chunk(2, 12289 + 3192, 4096)]);
        assert_eq!(p[3].chunks, vec![chunk(2, 12289 + 3192 + 4096, 9000 - 3192 - 4096), chunk(7, 0, 3)]);
    }

    #[test]
    fn many_small_chunks_fill_pieces_in_order() {
        let cs: Vec<Chunk> = (0..1000).map(|i| chunk(i % 3, u64::from(i) * 1000, 1000)).collect();
        let p = check(&cs, 4096 + 17, 64 * K);
        assert_eq!(p.len(), 16);
        // 1000-byte chunks never line up with 64 KiB edges: each interior edge cuts one chunk in two.
        let cut = p.iter().map(|p| p.chunks.len()).sum::<usize>() - cs.len();
        assert_eq!(cut, p.len() - 1);
    }

    #[test]
    fn empty_chunks_and_lists_make_no_pieces() {
        assert!(check(&[], 5, 4096).is_empty());
        let p = check(&[chunk(1, 0, 0), chunk(1, 0, 10), chunk(2, 0, 0)], 4090, 4096);
        assert_eq!(
            p.iter().map(|p| p.chunks.clone()).collect::<Vec<_>>(),
            vec![vec![chunk(1, 0, 6)], vec![chunk(1, 6, 4)]]
        );
    }

    #[test]
    fn a_transfer_smaller_than_a_piece_is_one_piece() {
        let cs = [chunk(1, 0, 3000), chunk(1, 8192, 1000)];
        let p = check(&cs, 8192, 256 * K);
        assert_eq!(p, vec![Piece { object_offset: 8192, len: 4000, chunks: cs.to_vec() }]);
    }

    #[test]
    fn bad_arithmetic_is_an_error_not_a_panic() {
        assert_eq!(split(&[chunk(1, 0, 1)], 0, 0), Err(PieceError::PieceBytes(0)));
        assert_eq!(split(&[chunk(1, 0, 1)], 0, 1000), Err(PieceError::PieceBytes(1000)));
        assert_eq!(split(&[chunk(1, u64::MAX - 1, 10)], 0, 4096), Err(PieceError::ChunkOverflow(u64::MAX - 1)));
        assert_eq!(split(&[chunk(1, 0, 10)], u64::MAX - 2, 4096), Err(PieceError::OffsetOverflow(u64::MAX - 2)));
    }
}
