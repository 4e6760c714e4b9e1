//! The native zero-copy API (DAFS/USRBIO style): register one buffer, submit batches of reads and writes into
//! its slots, reap completions.
//!
//! An [`IoQueue`] owns one allocation cut into equal slots. Each operation names a slot; while it is in flight the
//! slot is lent to it (by value, so the buffer cannot be touched meanwhile) and comes back at reap. The buffer's
//! addresses never change, so on a one-sided fabric its registrations stay in the pin-down cache after the first
//! batch: large transfers go straight between the data servers and the slots, with no copy and no registration
//! round trip. Submitting returns at once; all submitted operations run in parallel (each server's session
//! slots bound how many are in flight to it).

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::task::JoinSet;

use crate::{ClientError, File};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoKind {
    /// Read `len` bytes at `file_offset` into the slot (fewer at the end of the file).
    Read,
    /// Write the slot's first `len` bytes at `file_offset`.
    Write,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoOp {
    /// The caller's name for the operation, returned with its completion.
    pub tag: u64,
    pub kind: IoKind,
    pub file_offset: u64,
    pub slot: usize,
    pub len: usize,
}

#[derive(Debug)]
pub struct Completion {
    pub tag: u64,
    pub slot: usize,
    /// Bytes read or written.
    pub result: Result<usize, ClientError>,
}

pub struct IoQueue {
    file: Arc<File>,
    slot_bytes: usize,
    slots: Vec<Option<BytesMut>>,
    inflight: JoinSet<(IoOp, BytesMut, Result<usize, ClientError>)>,
}

impl IoQueue {
    /// A queue over `file` with `slots` buffers of `slot_bytes` each, allocated (and pre-faulted) once.
    pub fn new(file: Arc<File>, slots: usize, slot_bytes: usize) -> IoQueue {
        let mut all = BytesMut::zeroed(slots * slot_bytes);
        let slots = (0..slots).map(|_| Some(all.split_to(slot_bytes))).collect();
        IoQueue { file, slot_bytes, slots, inflight: JoinSet::new() }
    }

    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// A slot's bytes, unless an operation holds it.
    pub fn slot(&self, i: usize) -> Option<&[u8]> {
        self.slots.get(i)?.as_deref()
    }

    pub fn slot_mut(&mut self, i: usize) -> Option<&mut [u8]> {
        self.slots.get_mut(i)?.as_deref_mut()
    }

    /// Operations submitted and not yet reaped.
    pub fn in_flight(&self) -> usize {
        self.inflight.len()
    }

    /// Starts every operation of the batch. Checks them all first: a bad one (slot busy or out of range, length
    /// beyond the slot) fails the whole batch and nothing starts.
    pub fn submit(&mut self, ops: &[IoOp]) -> Result<(), ClientError> {
        for (i, op) in ops.iter().enumerate() {
            let busy = ops[..i].iter().any(|o| o.slot == op.slot);
            if op.len > self.slot_bytes || self.slots.get(op.slot).is_none_or(|s| s.is_none()) || busy {
                return Err(ClientError::InvalidPath(format!(
                    "operation {} names slot {} (of {}, {} bytes each) for {} bytes: out of range or busy",
                    op.tag,
                    op.slot,
                    self.slots.len(),
                    self.slot_bytes,
                    op.len
                )));
            }
        }
        for &op in ops {
            let mut buf = self.slots[op.slot].take().expect("checked above");
            let file = self.file.clone();
            let slot_bytes = self.slot_bytes;
            self.inflight.spawn(async move {
                match op.kind {
                    IoKind::Read => {
                        buf.truncate(op.len);
                        match file.read_at(op.file_offset, buf).await {
                            Ok(mut b) => {
                                let n = b.len();
                                b.resize(slot_bytes, 0);
                                (op, b, Ok(n))
                            }
                            Err(e) => (op, BytesMut::zeroed(slot_bytes), Err(e)),
                        }
                    }
                    IoKind::Write => {
                        let tail = buf.split_off(op.len);
                        let data: Bytes = buf.freeze();
                        let r = file.write_at(op.file_offset, data.clone()).await.map(|()| op.len);
                        // The write's slices are gone now, so the buffer is ours again without a copy.
                        let mut back = data.try_into_mut().unwrap_or_else(|b| BytesMut::from(&b[..]));
                        back.unsplit(tail);
                        (op, back, r)
                    }
                }
            });
        }
        Ok(())
    }

    /// Waits until at least `min` operations completed (fewer if fewer are in flight) and returns every
    /// completion available, giving their slots back.
    pub async fn reap(&mut self, min: usize) -> Vec<Completion> {
        let mut out = Vec::new();
        while out.len() < min {
            let Some(r) = self.inflight.join_next().await else { break };
            out.push(self.complete(r));
        }
        while let Some(r) = self.inflight.try_join_next() {
            out.push(self.complete(r));
        }
        out
    }

    fn complete(
        &mut self,
        r: Result<(IoOp, BytesMut, Result<usize, ClientError>), tokio::task::JoinError>,
    ) -> Completion {
        let (op, buf, result) = r.expect("I/O tasks do not panic");
        self.slots[op.slot] = Some(buf);
        Completion { tag: op.tag, slot: op.slot, result }
    }
}
