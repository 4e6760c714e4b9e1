//! FUSE over io_uring: one ring per kernel queue (one per possible CPU), served by a thread pinned to that CPU.
//!
//! Each ring holds [`RING_DEPTH`] entries, each a 288-byte header and a payload buffer registered with the kernel
//! (`FUSE_IO_URING_CMD_REGISTER`). A request arrives as the completion of its entry's command; the reply is written
//! into the same buffers and sent with `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`, which also waits for the next request.
//! Commands are submitted only by the ring's own thread: io_uring cancels a thread's requests when it exits, and a
//! fetch submitted by a worker thread would die with it. With [`Dispatch::Pool`], workers hand the commit back
//! through a queue and an eventfd the ring polls; [`Dispatch::PoolSubmits`] measures libfuse's way (the worker
//! submits under a lock), which a pool whose threads never exit could use.
//!
//! FFI fence: with `server.rs`, the crate's only io_uring code; each `unsafe` block says why it holds.
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use io_uring::{IoUring, cqueue, opcode, squeue, types};

use super::server::{Conn, Dispatch, IN_HEADER_BYTES, InHeader, MAX_WRITE, OUT_HEADER_BYTES, handle, out_header};
use super::server::{u32_at, u64_at};

/// Ring entries per queue: each is one request in flight on that CPU.
pub(super) const RING_DEPTH: u32 = 8;
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
pub(super) const RING_HEADER_BYTES: usize = 288;
pub(super) const OP_IN_OFFSET: usize = 128;
pub(super) const ENT_IN_OUT_OFFSET: usize = 256;
/// The `user_data` of the eventfd poll; entries use their slot number.
const WAKE: u64 = u64::MAX;

/// One ring entry's memory: the header and the payload, page-aligned as the kernel pins them.
pub(super) struct Entry {
    pub(super) header: Aligned,
    pub(super) payload: Aligned,
    pub(super) iov: [libc::iovec; 2],
}

pub(super) struct Aligned {
    pub(super) ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl Aligned {
    pub(super) fn new(bytes: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(bytes.next_multiple_of(4096), 4096).expect("layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory for a ring buffer");
        Aligned { ptr, layout }
    }

    /// The buffer. Callers hold the entry (see [`Memory`]): nobody else reads or writes it meanwhile.
    #[allow(clippy::mut_from_ref)]
    pub(super) fn bytes(&self) -> &mut [u8] {
        // SAFETY: `ptr` is a live allocation of `layout.size()` bytes; an entry is held by one party at a time
        // (the kernel between a fetch and its completion, then the ring thread or one worker until the commit).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// A ring's entries, shared by its thread and the workers serving them; freed when the last holder lets go, so a
/// worker finishing after the ring stopped still writes into live memory.
pub(super) struct Memory {
    entries: Vec<Entry>,
}

// SAFETY: the entries are plain buffers; who may touch one is decided by the ring protocol (one holder at a time,
// handed over by completions, task spawns and the commit queue), never by two threads at once.
unsafe impl Send for Memory {}
// SAFETY: as above.
unsafe impl Sync for Memory {}

/// A ring and what its workers share with its thread: the commits they hand back and the eventfd that wakes it
/// ([`Dispatch::Pool`]), or the submission queue itself ([`Dispatch::PoolSubmits`]). Only the ring's thread reads
/// completions.
struct Queue {
    qid: usize,
    fd: i32,
    ring: Ring,
    /// Held while pushing to the submission queue, which is single-producer.
    sq: Mutex<()>,
    memory: Arc<Memory>,
    commits: Mutex<Vec<(usize, u64)>>,
    wake: File,
}

impl Queue {
    fn push(&self, sqe: &squeue::Entry128) {
        let _sq = self.sq.lock().expect("submission queue");
        // SAFETY: pushes are serialized by `sq`; every SQE names only buffers of this ring's entries or its
        // eventfd, which live as long as the ring. The queue holds one SQE per entry plus the poll, more than can
        // ever be outstanding.
        unsafe { self.ring.submission_shared().push(sqe).expect("one SQE per entry and the poll fit the queue") };
    }

    fn commit(&self, slot: usize, commit_id: u64) {
        self.push(&commit_sqe(self.fd, self.qid, slot, commit_id));
    }

    fn hand_back(&self, slot: usize, commit_id: u64) {
        self.commits.lock().expect("commit queue").push((slot, commit_id));
        // SAFETY: writes 8 bytes from a live u64 to our eventfd. It can only fail on counter overflow, which 2^64
        // wake-ups would take.
        unsafe { libc::write(self.wake.as_raw_fd(), (&1u64 as *const u64).cast(), 8) };
    }
}

/// The 80-byte command area of a FUSE ring SQE: `struct fuse_uring_cmd_req` (flags, commit_id, qid).
pub(super) fn cmd_req(qid: usize, commit_id: u64) -> [u8; 80] {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_le_bytes());
    cmd[16..18].copy_from_slice(&(qid as u16).to_le_bytes());
    cmd
}

pub(super) fn register_sqe(fd: i32, qid: usize, slot: usize, ent: &Entry) -> squeue::Entry128 {
    let sqe = opcode::UringCmd80::new(types::Fd(fd), CMD_REGISTER)
        .cmd(cmd_req(qid, 0))
        .addr(Some(ent.iov.as_ptr() as u64))
        .build()
        .user_data(slot as u64);
    // The kernel wants the iovec count in the SQE's `len` (offset 24), which io-uring's builder leaves 0.
    // SAFETY: `Entry128` is `#[repr(C)]` over the kernel's 128-byte SQE, plain bytes with no invariants.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[24..28].copy_from_slice(&2u32.to_le_bytes());
    // SAFETY: as above, back from the same bytes with one field set.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

fn commit_sqe(fd: i32, qid: usize, slot: usize, commit_id: u64) -> squeue::Entry128 {
    opcode::UringCmd80::new(types::Fd(fd), CMD_COMMIT_AND_FETCH)
        .cmd(cmd_req(qid, commit_id))
        .build()
        .user_data(slot as u64)
}

fn wake_sqe(wake: &File) -> squeue::Entry128 {
    squeue::Entry128::from(
        opcode::PollAdd::new(types::Fd(wake.as_raw_fd()), libc::POLLIN as u32).build().user_data(WAKE),
    )
}

type Ring = IoUring<squeue::Entry128, cqueue::Entry>;

/// Signals the mount that this queue registered (or failed to).
pub(super) type Ready = (Mutex<(usize, Option<io::Error>)>, std::sync::Condvar);

/// The thread of queue `qid`: registers its entries, says so on `ready`, then serves until the mount goes away.
pub(super) fn run(conn: &Arc<Conn>, qid: usize, ready: &Ready) {
    let started = start(conn, qid);
    let queue = {
        let (lock, cv) = ready;
        let mut g = lock.lock().expect("ready lock");
        g.0 += 1;
        cv.notify_all();
        match started {
            Ok(r) => r,
            Err(e) => {
                g.1.get_or_insert(e);
                return;
            }
        }
    };
    let mut scratch = vec![0u8; IN_HEADER_BYTES + 256];
    let mut done = Vec::with_capacity(RING_DEPTH as usize + 1);
    while !conn.stop.load(Ordering::Relaxed) {
        if let Err(e) = queue.ring.submitter().submit_and_wait(1) {
            // A signal, or completions to reap before more can be submitted: reap what there is, then again.
            if !matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)) {
                return conn.abort(&format!("queue {qid}: io_uring_enter: {e}"));
            }
        }
        done.clear();
        // SAFETY: only this thread reads the completion queue.
        done.extend(unsafe { queue.ring.completion_shared() }.map(|c: cqueue::Entry| (c.user_data(), c.result())));
        for &(token, res) in &done {
            if token == WAKE {
                rearm_and_commit(&queue);
            } else if res == -libc::ENOTCONN || res == -libc::ECANCELED {
                return; // The mount went away.
            } else if res < 0 {
                // An entry the kernel failed is not fetching any more: requests queued on this CPU would wait
                // forever, so the bench ends the mount and fails instead.
                let e = io::Error::from_raw_os_error(-res);
                return conn.abort(&format!("queue {qid}: entry {token}'s command failed: {e}"));
            } else {
                conn.ring_requests.fetch_add(1, Ordering::Relaxed);
                serve(conn, &queue, token as usize, &mut scratch);
            }
        }
    }
}

fn start(conn: &Conn, qid: usize) -> io::Result<Arc<Queue>> {
    pin_to_cpu(qid);
    let ring: Ring = IoUring::builder().setup_cqsize((RING_DEPTH + 1) * 2).build(RING_DEPTH + 1)?;
    // SAFETY: eventfd(2) returns a new descriptor or -1; a new one is owned by the File made of it.
    let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if wake < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `wake` is a fresh descriptor nobody else owns.
    let wake = unsafe { File::from_raw_fd(wake) };
    let payload_bytes = MAX_WRITE as usize;
    let mut entries: Vec<Entry> = (0..RING_DEPTH)
        .map(|_| Entry {
            header: Aligned::new(RING_HEADER_BYTES),
            payload: Aligned::new(payload_bytes),
            iov: [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; 2],
        })
        .collect();
    for ent in &mut entries {
        ent.iov = [
            libc::iovec { iov_base: ent.header.ptr.cast(), iov_len: RING_HEADER_BYTES },
            libc::iovec { iov_base: ent.payload.ptr.cast(), iov_len: payload_bytes },
        ];
    }
    let fd = conn.dev.as_raw_fd();
    let memory = Arc::new(Memory { entries });
    let queue = Queue { qid, fd, ring, sq: Mutex::new(()), memory, commits: Mutex::new(Vec::new()), wake };
    for (slot, ent) in queue.memory.entries.iter().enumerate() {
        queue.push(&register_sqe(fd, qid, slot, ent));
    }
    queue.push(&wake_sqe(&queue.wake));
    queue.ring.submit()?;
    Ok(Arc::new(queue))
}

/// Serves the request in entry `slot`: in place ([`Dispatch::Inline`]) or on the pool, which hands the commit
/// back to this thread ([`Dispatch::Pool`]) or submits it itself ([`Dispatch::PoolSubmits`]).
fn serve(conn: &Arc<Conn>, queue: &Arc<Queue>, slot: usize, scratch: &mut [u8]) {
    let ent = &queue.memory.entries[slot];
    let (h, commit_id, args) = request_in_a_row(ent.header.bytes(), ent.payload.bytes(), scratch);
    let (rt, submits) = match &conn.dispatch {
        Dispatch::Inline => {
            let result = handle(&h, args, ent.payload.bytes()).unwrap_or(Err(libc::ENOSYS));
            finish_reply(ent.header.bytes(), h.unique, result);
            return queue.commit(slot, commit_id);
        }
        Dispatch::Pool(rt) => (rt, false),
        Dispatch::PoolSubmits(rt) => (rt, true),
    };
    let (args, queue) = (args.to_vec(), queue.clone());
    rt.spawn(async move {
        let ent = &queue.memory.entries[slot];
        let result = handle(&h, &args, ent.payload.bytes()).unwrap_or(Err(libc::ENOSYS));
        finish_reply(ent.header.bytes(), h.unique, result);
        if submits {
            queue.commit(slot, commit_id);
            let _ = queue.ring.submit();
        } else {
            queue.hand_back(slot, commit_id);
        }
    });
}

/// The request in an entry as `/dev/fuse` would have it after the in header: the op's fixed argument came in
/// `op_in`, the rest in the payload. Returns the header, the commit id, and the arguments (in `scratch`).
pub(super) fn request_in_a_row<'a>(header: &[u8], payload: &[u8], scratch: &'a mut [u8]) -> (InHeader, u64, &'a [u8]) {
    let h = InHeader::parse(&header[..IN_HEADER_BYTES]).expect("a 40-byte header");
    let commit_id = u64_at(header, ENT_IN_OUT_OFFSET + 8);
    let payload_in = (u32_at(header, ENT_IN_OUT_OFFSET + 16) as usize).min(payload.len());
    let op_in = (h.len as usize).saturating_sub(IN_HEADER_BYTES + payload_in).min(128);
    let args_len = (op_in + payload_in).min(scratch.len());
    scratch[..op_in].copy_from_slice(&header[OP_IN_OFFSET..OP_IN_OFFSET + op_in]);
    scratch[op_in..args_len].copy_from_slice(&payload[..args_len - op_in]);
    (h, commit_id, &scratch[..args_len])
}

/// Writes the reply's `fuse_out_header` and payload size into an entry's header (its body is in the payload).
pub(super) fn finish_reply(header: &mut [u8], unique: u64, result: Result<usize, i32>) {
    let (error, len) = match result {
        Ok(len) => (0, len),
        Err(errno) => (-errno, 0),
    };
    header[..OUT_HEADER_BYTES].copy_from_slice(&out_header(OUT_HEADER_BYTES + len, error, unique));
    header[ENT_IN_OUT_OFFSET + 16..ENT_IN_OUT_OFFSET + 20].copy_from_slice(&(len as u32).to_le_bytes());
}

/// On the eventfd's wake-up: polls it again, then commits what the workers handed back (in that order, so a
/// hand-back after the drain still wakes the ring).
fn rearm_and_commit(queue: &Queue) {
    let mut count = 0u64;
    // SAFETY: reads 8 bytes into a live u64 (EAGAIN when already drained: nothing to do).
    unsafe { libc::read(queue.wake.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
    queue.push(&wake_sqe(&queue.wake));
    let commits = std::mem::take(&mut *queue.commits.lock().expect("commit queue"));
    for (slot, commit_id) in commits {
        queue.commit(slot, commit_id);
    }
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it; sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

#[cfg(test)]
mod tests {
    use super::super::server::{FILE_INO, LOOKUP, READ, ROOT_INO, byte_at};
    use super::*;

    fn in_header(len: usize, opcode: u32, unique: u64, nodeid: u64) -> [u8; IN_HEADER_BYTES] {
        let mut h = [0u8; IN_HEADER_BYTES];
        h[0..4].copy_from_slice(&(len as u32).to_le_bytes());
        h[4..8].copy_from_slice(&opcode.to_le_bytes());
        h[8..16].copy_from_slice(&unique.to_le_bytes());
        h[16..24].copy_from_slice(&nodeid.to_le_bytes());
        h
    }

    fn ring_entry() -> Entry {
        Entry {
            header: Aligned::new(RING_HEADER_BYTES),
            payload: Aligned::new(MAX_WRITE as usize),
            iov: [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; 2],
        }
    }

    #[test]
    fn the_ring_command_area_is_fuse_uring_cmd_req() {
        let cmd = cmd_req(3, 0x1122_3344_5566_7788);
        assert_eq!(u64_at(&cmd, 0), 0, "flags");
        assert_eq!(u64_at(&cmd, 8), 0x1122_3344_5566_7788, "commit_id");
        assert_eq!(u16::from_le_bytes([cmd[16], cmd[17]]), 3, "qid");
        assert!(cmd[18..].iter().all(|b| *b == 0));
    }

    #[test]
    fn a_register_sqe_carries_two_iovecs() {
        let ent = ring_entry();
        let sqe = register_sqe(7, 1, 5, &ent);
        // SAFETY: `Entry128` is the kernel's 128-byte SQE, plain bytes.
        let raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        assert_eq!(raw[0], 46, "IORING_OP_URING_CMD");
        assert_eq!(i32::from_le_bytes(raw[4..8].try_into().unwrap()), 7, "fd");
        assert_eq!(u32_at(&raw, 8), CMD_REGISTER, "cmd_op");
        assert_eq!(u64_at(&raw, 16), ent.iov.as_ptr() as u64, "addr");
        assert_eq!(u32_at(&raw, 24), 2, "len: the iovec count");
        assert_eq!(u64_at(&raw, 32), 5, "user_data: the slot");
        assert_eq!(u16::from_le_bytes([raw[48 + 16], raw[48 + 17]]), 1, "qid in the command area");
    }

    /// A READ as the ring delivers it (its `fuse_read_in` in `op_in`, nothing in the payload) is served like the
    /// same READ from `/dev/fuse`, its reply in place; a LOOKUP's name comes in the payload with nothing in op_in.
    #[test]
    fn a_ring_request_is_put_back_in_a_row_and_answered_in_place() {
        let ent = ring_entry();
        let mut read_in = [0u8; 40];
        read_in[8..16].copy_from_slice(&8192u64.to_le_bytes());
        read_in[16..20].copy_from_slice(&100u32.to_le_bytes());
        let h = ent.header.bytes();
        h[..IN_HEADER_BYTES].copy_from_slice(&in_header(IN_HEADER_BYTES + 40, READ, 77, FILE_INO));
        h[OP_IN_OFFSET..OP_IN_OFFSET + 40].copy_from_slice(&read_in);
        h[ENT_IN_OUT_OFFSET + 8..ENT_IN_OUT_OFFSET + 16].copy_from_slice(&99u64.to_le_bytes());
        let mut scratch = vec![0u8; IN_HEADER_BYTES + 256];
        let (req, commit_id, args) = request_in_a_row(ent.header.bytes(), ent.payload.bytes(), &mut scratch);
        assert_eq!((req.opcode, req.unique, commit_id, args), (READ, 77, 99, &read_in[..]));
        let result = handle(&req, args, ent.payload.bytes()).expect("a reply");
        finish_reply(ent.header.bytes(), req.unique, result);
        let h = ent.header.bytes();
        assert_eq!(u32_at(h, 0) as usize, OUT_HEADER_BYTES + 100);
        assert_eq!(i32::from_le_bytes(h[4..8].try_into().unwrap()), 0, "no error");
        assert_eq!(u64_at(h, 8), 77, "unique");
        assert_eq!(u32_at(h, ENT_IN_OUT_OFFSET + 16), 100, "payload_sz");
        let body = ent.payload.bytes();
        assert!((0..100).all(|i| body[i] == byte_at(8192 + i as u64)));

        let h = ent.header.bytes();
        h[..IN_HEADER_BYTES].copy_from_slice(&in_header(IN_HEADER_BYTES + 2, LOOKUP, 78, ROOT_INO));
        h[ENT_IN_OUT_OFFSET + 16..ENT_IN_OUT_OFFSET + 20].copy_from_slice(&2u32.to_le_bytes());
        ent.payload.bytes()[..2].copy_from_slice(b"f\0");
        let (req, _, args) = request_in_a_row(ent.header.bytes(), ent.payload.bytes(), &mut scratch);
        assert_eq!(args, b"f\0");
        let result = handle(&req, args, ent.payload.bytes()).expect("a reply");
        assert_eq!(result, Ok(128), "a fuse_entry_out");
        assert_eq!(u64_at(ent.payload.bytes(), 0), FILE_INO);
    }
}
