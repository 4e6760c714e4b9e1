//! A minimal FUSE server in memory (one read-only file, `/f`) served either by threads reading `/dev/fuse` or by
//! FUSE over io_uring (Linux 6.14+, with `enable_uring`), so the two kernel paths are measured against each other
//! with nothing else in the way. It is the seed of weft-fuse's ring transport: fuser 0.18 has none.
//!
//! The ring protocol (kernel `fs/fuse/dev_uring.c`, uapi `fuse_uring_*`, ABI 7.42+): once FUSE_INIT is answered
//! with `FUSE_OVER_IO_URING`, the server registers entries on every queue (one per possible CPU) with
//! `IORING_OP_URING_CMD` SQE128s (`FUSE_IO_URING_CMD_REGISTER`; two iovecs: a 288-byte header and a payload
//! buffer of at least `max_write`). Once every queue holds one, the kernel sends each request on the queue of the
//! CPU its caller runs on, as the completion of one of those commands: the `fuse_in_header` in the header's
//! `in_out`, the op's fixed argument in `op_in`, the rest in the payload. The reply is written in place
//! (`fuse_out_header` in `in_out`, its body in the payload, its size in `payload_sz`) and sent with
//! `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`, which also waits for the entry's next request. FORGET and INTERRUPT still
//! come by `/dev/fuse` reads, and so does every request before all queues are registered (the ring: [`super::ring`]).
//!
//! Requests are served where they are read ([`Dispatch::Inline`], libfuse's passthrough_hp) or on a tokio runtime
//! ([`Dispatch::Pool`], as weft-fuse serves every request), so the ring is measured as weft-fuse would use it.
//!
//! FFI fence: this file and `ring.rs` are the crate's only io_uring and mount(2) code; each `unsafe` block says
//! why it holds.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use super::ring;

/// Which kernel path carries the requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Threads blocked in `read(2)` on `/dev/fuse`, replies by `writev(2)`: what fuser and libfuse do by default.
    DevFuse,
    /// FUSE over io_uring: one ring per CPU, each served by a thread pinned to that CPU.
    Uring,
}

/// Where a request is served once the transport delivered it.
#[derive(Clone, Debug)]
pub enum Dispatch {
    /// On the thread that received it: the transport's best case.
    Inline,
    /// On this tokio runtime, the receiving thread going back for the next request at once: as weft-fuse works.
    /// The ring's commit goes back to the ring's thread to be submitted.
    Pool(tokio::runtime::Handle),
    /// As `Pool`, but the worker submits the ring's commit itself (libfuse's way); over `/dev/fuse` as `Pool`.
    PoolSubmits(tokio::runtime::Handle),
}

/// The one file the server holds: `/f`, `FILE_BYTES` long, whose byte at offset `o` is [`byte_at`]`(o)`.
pub const FILE_BYTES: u64 = 64 << 20;
pub(super) const MAX_WRITE: u32 = 128 << 10;
const MAX_PAGES: u16 = (MAX_WRITE / 4096) as u16;
pub(super) const IN_HEADER_BYTES: usize = 40;
pub(super) const OUT_HEADER_BYTES: usize = 16;
const READ_BUF_BYTES: usize = MAX_WRITE as usize + 4096;
pub(super) const ROOT_INO: u64 = 1;
pub(super) const FILE_INO: u64 = 2;

// Opcodes (uapi fuse.h).
pub(super) const LOOKUP: u32 = 1;
const FORGET: u32 = 2;
const GETATTR: u32 = 3;
const OPEN: u32 = 14;
pub(super) const READ: u32 = 15;
const RELEASE: u32 = 18;
const FLUSH: u32 = 25;
const INIT: u32 = 26;
const OPENDIR: u32 = 27;
const RELEASEDIR: u32 = 29;
const INTERRUPT: u32 = 36;
const DESTROY: u32 = 38;
const BATCH_FORGET: u32 = 42;

const FUSE_INIT_EXT: u32 = 1 << 30;
const FUSE_MAX_PAGES: u32 = 1 << 22;
/// `FUSE_OVER_IO_URING` is bit 41 of the 64-bit init flags: bit 9 of `flags2`.
const FLAGS2_OVER_IO_URING: u32 = 1 << 9;
const FOPEN_DIRECT_IO: u32 = 1;

/// The file's content: a pattern no two nearby 4 KiB blocks share, so a read of the wrong offset is caught.
pub fn byte_at(offset: u64) -> u8 {
    (offset.wrapping_mul(31) ^ (offset >> 12)) as u8
}

/// What every thread serving one mount shares.
pub(super) struct Conn {
    pub(super) dev: File,
    pub(super) stop: AtomicBool,
    pub(super) dispatch: Dispatch,
    /// Requests served through the ring so far.
    pub(super) ring_requests: AtomicU64,
    /// Where it is mounted (to abort it).
    mountpoint: CString,
}

impl Conn {
    /// Ends the connection as `umount -f` does: every request waiting on the mount fails with ENOTCONN.
    /// For a queue that cannot go on, so the bench fails instead of its callers waiting forever.
    pub(super) fn abort(&self, why: &str) {
        eprintln!("fuse-transport: aborting the mount: {why}");
        self.stop.store(true, Ordering::SeqCst);
        // SAFETY: `mountpoint` is a valid NUL-terminated path. MNT_FORCE makes FUSE abort the connection (its
        // umount_begin) whether or not the unmount then succeeds; `Server`'s drop detaches it after.
        if unsafe { libc::umount2(self.mountpoint.as_ptr(), libc::MNT_FORCE) } != 0 {
            eprintln!("fuse-transport: umount2(MNT_FORCE): {}", io::Error::last_os_error());
        }
    }
}

/// A mounted server; unmounts (lazily) and stops its threads when dropped.
pub struct Server {
    conn: Arc<Conn>,
    threads: Vec<JoinHandle<()>>,
    /// Which transport the kernel actually uses (the ring only once every queue has registered).
    pub transport: Transport,
}

impl Server {
    /// Requests served through the ring so far (0 over `/dev/fuse`).
    pub fn ring_requests(&self) -> u64 {
        self.conn.ring_requests.load(Ordering::Relaxed)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.conn.stop.store(true, Ordering::SeqCst);
        // SAFETY: `mountpoint` is a valid NUL-terminated path; MNT_DETACH never blocks on the server.
        unsafe { libc::umount2(self.conn.mountpoint.as_ptr(), libc::MNT_DETACH) };
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Mounts the server on `dir` (root only) and starts `readers` `/dev/fuse` readers; with `Transport::Uring`, one
/// ring thread per possible CPU too. Returns once the kernel's INIT is answered and, for the ring, every queue is
/// registered.
pub fn mount(dir: &Path, transport: Transport, readers: usize, dispatch: Dispatch) -> io::Result<Server> {
    let mountpoint = CString::new(dir.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
    let dev = mount_dev(&mountpoint)?;
    let conn =
        Arc::new(Conn { dev, stop: AtomicBool::new(false), dispatch, ring_requests: AtomicU64::new(0), mountpoint });
    let init = Arc::new((Mutex::new(None::<bool>), Condvar::new()));
    let mut server = Server { conn: conn.clone(), threads: Vec::new(), transport: Transport::DevFuse };
    for i in 0..readers.max(1) {
        let (conn, init) = (conn.clone(), init.clone());
        let want_uring = transport == Transport::Uring;
        server.threads.push(
            std::thread::Builder::new()
                .name(format!("fuse-dev-{i}"))
                .spawn(move || dev_loop(&conn, &init, want_uring))?,
        );
    }
    // The kernel sends INIT once the mount is made; a reader answers it. Wait for the answer.
    let uring_granted = {
        let (lock, cv) = &*init;
        let mut g = lock.lock().expect("init lock");
        while g.is_none() {
            g = cv.wait(g).expect("init lock");
        }
        g.expect("set")
    };
    if transport == Transport::Uring {
        if !uring_granted {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the kernel did not offer FUSE_OVER_IO_URING (is /sys/module/fuse/parameters/enable_uring Y?)",
            ));
        }
        start_rings(&mut server)?;
    }
    Ok(server)
}

fn mount_dev(mountpoint: &CString) -> io::Result<File> {
    let dev = File::options().read(true).write(true).open("/dev/fuse")?;
    let data = CString::new(format!("fd={},rootmode=40000,user_id=0,group_id=0,allow_other", dev.as_raw_fd()))
        .map_err(io::Error::other)?;
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            c"weft-fuse-transport".as_ptr(),
            mountpoint.as_ptr(),
            c"fuse.weft-fuse-transport".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(dev)
}

/// Starts one ring thread per queue and waits until every one registered its entries.
fn start_rings(server: &mut Server) -> io::Result<()> {
    let queues = possible_cpus()?;
    let ready: Arc<ring::Ready> = Arc::new((Mutex::new((0, None)), Condvar::new()));
    for qid in 0..queues {
        let (conn, ready) = (server.conn.clone(), ready.clone());
        server.threads.push(
            std::thread::Builder::new()
                .name(format!("fuse-ring-{qid}"))
                .spawn(move || ring::run(&conn, qid, &ready))?,
        );
    }
    let (lock, cv) = &*ready;
    let mut g = lock.lock().expect("ready lock");
    while g.0 < queues {
        g = cv.wait(g).expect("ready lock");
    }
    if let Some(e) = g.1.take() {
        return Err(e);
    }
    server.transport = Transport::Uring;
    Ok(())
}

fn possible_cpus() -> io::Result<usize> {
    // The kernel makes one queue per possible CPU (`num_possible_cpus()`); /sys says which those are ("0-1").
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    cpu_count(&text).ok_or_else(|| io::Error::other(format!("cannot read the CPU list {text:?}")))
}

/// The number of CPUs in a kernel CPU list such as `0-3,8,10-11`.
pub(super) fn cpu_count(list: &str) -> Option<usize> {
    let mut count = 0;
    for part in list.trim().split(',') {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let (lo, hi): (usize, usize) = (lo.parse().ok()?, hi.parse().ok()?);
        count += hi.checked_sub(lo)? + 1;
    }
    Some(count)
}

fn dev_loop(conn: &Arc<Conn>, init: &(Mutex<Option<bool>>, Condvar), want_uring: bool) {
    let mut buf = vec![0u8; READ_BUF_BYTES];
    let mut out = vec![0u8; READ_BUF_BYTES];
    while !conn.stop.load(Ordering::Relaxed) {
        // SAFETY: `buf` is writable for its whole length.
        let n = unsafe { libc::read(conn.dev.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            match io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR | libc::EAGAIN | libc::ENOENT) => continue,
                _ => return, // ENODEV: unmounted.
            }
        }
        let req = &buf[..n as usize];
        let Some(h) = InHeader::parse(req) else { return };
        if h.opcode == INIT {
            let granted = answer_init(&conn.dev, &h, &req[IN_HEADER_BYTES..], want_uring);
            let (lock, cv) = init;
            *lock.lock().expect("init lock") = Some(granted);
            cv.notify_all();
            continue;
        }
        if h.opcode == DESTROY {
            reply_dev(&conn.dev, h.unique, Ok(0), &out);
            return;
        }
        let args = &req[IN_HEADER_BYTES..(h.len as usize).clamp(IN_HEADER_BYTES, req.len())];
        match &conn.dispatch {
            Dispatch::Inline => {
                let Some(result) = handle(&h, args, &mut out) else { continue };
                reply_dev(&conn.dev, h.unique, result, &out);
            }
            Dispatch::Pool(rt) | Dispatch::PoolSubmits(rt) => {
                let (args, conn) = (args.to_vec(), conn.clone());
                rt.spawn(async move {
                    let mut out = vec![0u8; reply_bytes_max(&h, &args)];
                    if let Some(result) = handle(&h, &args, &mut out) {
                        reply_dev(&conn.dev, h.unique, result, &out);
                    }
                });
            }
        }
    }
}

/// The largest reply body a request can get: its READ size, else a few hundred bytes.
fn reply_bytes_max(h: &InHeader, args: &[u8]) -> usize {
    if h.opcode == READ && args.len() >= 24 { (u32_at(args, 16) as usize).min(MAX_WRITE as usize) } else { 256 }
}

fn reply_dev(dev: &File, unique: u64, result: Result<usize, i32>, body: &[u8]) {
    let (error, len) = match result {
        Ok(len) => (0, len),
        Err(errno) => (-errno, 0),
    };
    let header = out_header(OUT_HEADER_BYTES + len, error, unique);
    let iov = [
        libc::iovec { iov_base: header.as_ptr() as *mut _, iov_len: header.len() },
        libc::iovec { iov_base: body.as_ptr() as *mut _, iov_len: len },
    ];
    // SAFETY: both iovecs point into live buffers of at least their lengths. A failed reply (the request was
    // interrupted, the mount went away) needs nothing from us.
    unsafe { libc::writev(dev.as_raw_fd(), iov.as_ptr(), 2) };
}

pub(super) fn out_header(len: usize, error: i32, unique: u64) -> [u8; OUT_HEADER_BYTES] {
    let mut h = [0u8; OUT_HEADER_BYTES];
    h[0..4].copy_from_slice(&(len as u32).to_le_bytes());
    h[4..8].copy_from_slice(&error.to_le_bytes());
    h[8..16].copy_from_slice(&unique.to_le_bytes());
    h
}

/// The parts of `fuse_in_header` the server reads.
#[derive(Clone, Copy, Debug)]
pub(super) struct InHeader {
    pub(super) len: u32,
    pub(super) opcode: u32,
    pub(super) unique: u64,
    pub(super) nodeid: u64,
}

impl InHeader {
    pub(super) fn parse(b: &[u8]) -> Option<InHeader> {
        if b.len() < IN_HEADER_BYTES {
            return None;
        }
        Some(InHeader { len: u32_at(b, 0), opcode: u32_at(b, 4), unique: u64_at(b, 8), nodeid: u64_at(b, 16) })
    }
}

pub(super) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

pub(super) fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Answers FUSE_INIT on `/dev/fuse`; asks for the ring when `want_uring` and the kernel offers it. Returns whether
/// the ring was granted.
fn answer_init(dev: &File, h: &InHeader, args: &[u8], want_uring: bool) -> bool {
    if args.len() < 16 {
        reply_dev(dev, h.unique, Err(libc::EPROTO), &[]);
        return false;
    }
    let (major, minor, flags) = (u32_at(args, 0), u32_at(args, 4), u32_at(args, 12));
    let flags2 = if args.len() >= 20 && flags & FUSE_INIT_EXT != 0 { u32_at(args, 16) } else { 0 };
    let uring = want_uring && flags2 & FLAGS2_OVER_IO_URING != 0;
    let mut out = [0u8; 64];
    out[0..4].copy_from_slice(&7u32.to_le_bytes());
    out[4..8].copy_from_slice(&minor.to_le_bytes());
    out[8..12].copy_from_slice(&(128u32 << 10).to_le_bytes()); // max_readahead
    out[12..16].copy_from_slice(&((FUSE_INIT_EXT | FUSE_MAX_PAGES) & flags).to_le_bytes());
    out[16..18].copy_from_slice(&16u16.to_le_bytes()); // max_background
    out[18..20].copy_from_slice(&12u16.to_le_bytes()); // congestion_threshold
    out[20..24].copy_from_slice(&MAX_WRITE.to_le_bytes());
    out[24..28].copy_from_slice(&1u32.to_le_bytes()); // time_gran
    out[28..30].copy_from_slice(&MAX_PAGES.to_le_bytes());
    out[32..36].copy_from_slice(&(if uring { FLAGS2_OVER_IO_URING } else { 0 }).to_le_bytes());
    if major != 7 {
        reply_dev(dev, h.unique, Err(libc::EPROTO), &[]);
        return false;
    }
    reply_dev(dev, h.unique, Ok(out.len()), &out);
    uring
}

/// Serves one request whose arguments (after the in header) are `args`; writes the reply's body into `out`.
/// `None`: no reply is due (FORGET, INTERRUPT).
pub(super) fn handle(h: &InHeader, args: &[u8], out: &mut [u8]) -> Option<Result<usize, i32>> {
    Some(match h.opcode {
        FORGET | BATCH_FORGET | INTERRUPT => return None,
        LOOKUP if h.nodeid == ROOT_INO && args.split(|b| *b == 0).next() == Some(b"f") => {
            out[0..8].copy_from_slice(&FILE_INO.to_le_bytes());
            out[8..40].fill(0); // generation, entry and attribute timeouts 0: every stat asks again
            write_attr(&mut out[40..128], FILE_INO);
            Ok(128)
        }
        LOOKUP => Err(libc::ENOENT),
        GETATTR if h.nodeid == ROOT_INO || h.nodeid == FILE_INO => {
            out[0..16].fill(0);
            write_attr(&mut out[16..104], h.nodeid);
            Ok(104)
        }
        OPEN if h.nodeid == FILE_INO => Ok(open_out(out, FOPEN_DIRECT_IO)),
        OPENDIR if h.nodeid == ROOT_INO => Ok(open_out(out, 0)),
        READ if args.len() >= 24 => {
            let (offset, size) = (u64_at(args, 8), u32_at(args, 16) as usize);
            let n = (FILE_BYTES.saturating_sub(offset) as usize).min(size).min(out.len());
            for (i, b) in out[..n].iter_mut().enumerate() {
                *b = byte_at(offset + i as u64);
            }
            Ok(n)
        }
        RELEASE | FLUSH | RELEASEDIR => Ok(0),
        GETATTR | OPEN | OPENDIR | READ => Err(libc::EINVAL),
        _ => Err(libc::ENOSYS),
    })
}

fn open_out(out: &mut [u8], open_flags: u32) -> usize {
    out[0..8].copy_from_slice(&1u64.to_le_bytes());
    out[8..12].copy_from_slice(&open_flags.to_le_bytes());
    out[12..16].fill(0);
    16
}

/// `struct fuse_attr` (88 bytes) of the root directory or the file.
fn write_attr(out: &mut [u8], ino: u64) {
    out.fill(0);
    let (size, mode, nlink) =
        if ino == ROOT_INO { (0u64, libc::S_IFDIR | 0o755, 2u32) } else { (FILE_BYTES, libc::S_IFREG | 0o644, 1) };
    out[0..8].copy_from_slice(&ino.to_le_bytes());
    out[8..16].copy_from_slice(&size.to_le_bytes());
    out[16..24].copy_from_slice(&size.div_ceil(512).to_le_bytes());
    out[60..64].copy_from_slice(&mode.to_le_bytes());
    out[64..68].copy_from_slice(&nlink.to_le_bytes());
    out[80..84].copy_from_slice(&4096u32.to_le_bytes()); // blksize
}

/// Sets `/sys/module/fuse/parameters/enable_uring` to Y for as long as the guard lives, then back as it was. What it
/// was is also written to [`URING_MARKER`] first, so a run killed with `kill -9` is put right by the next
/// ([`put_right_leftovers`]).
pub struct UringEnabled {
    was: Option<String>,
}

/// The kernel's switch for FUSE over io_uring (absent when the kernel is built without it).
pub const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";
/// While a run has changed [`ENABLE_URING`]: the run's pid and the value to put back, one per line.
pub const URING_MARKER: &str = "/run/weft-bench-fuse-transport.enable_uring";
/// The file system type of this bench's mounts (`fuse.` and the name mount(2) is given).
const FSTYPE: &str = "fuse.weft-fuse-transport";
/// Mountpoints are directories named this and the pid of the run that made them.
pub const MOUNT_DIR_PREFIX: &str = "weft-bench-fuse-transport-";

impl UringEnabled {
    pub fn new() -> io::Result<UringEnabled> {
        let was = std::fs::read_to_string(ENABLE_URING)?;
        if was.trim() == "Y" {
            return Ok(UringEnabled { was: None });
        }
        std::fs::write(URING_MARKER, format!("{}\n{}\n", std::process::id(), was.trim()))?;
        std::fs::write(ENABLE_URING, "Y")?;
        Ok(UringEnabled { was: Some(was) })
    }
}

impl Drop for UringEnabled {
    fn drop(&mut self) {
        if let Some(was) = &self.was {
            let _ = std::fs::write(ENABLE_URING, was.trim());
            let _ = std::fs::remove_file(URING_MARKER);
        }
    }
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// What an earlier run killed before its guards ran left behind: `enable_uring` as that run set it (put back
/// from [`URING_MARKER`]) and its mounts (detached, their directories removed). A live run's are left alone.
/// Returns what was put right, one line each, for the log.
pub fn put_right_leftovers() -> Vec<String> {
    let mut done = Vec::new();
    if let Ok(marker) = std::fs::read_to_string(URING_MARKER) {
        let mut lines = marker.lines();
        let (pid, was) = (lines.next().and_then(|p| p.parse::<u32>().ok()), lines.next());
        if let (Some(pid), Some(was)) = (pid, was)
            && !pid_alive(pid)
            && matches!(was, "Y" | "N")
            && std::fs::write(ENABLE_URING, was).is_ok()
        {
            let _ = std::fs::remove_file(URING_MARKER);
            done.push(format!("enable_uring put back to {was} (run {pid} died before it could)"));
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    for line in mounts.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let (Some(&point), Some(&fstype)) = (fields.get(1), fields.get(2)) else { continue };
        let Some(pid) = point.rsplit_once(MOUNT_DIR_PREFIX).and_then(|(_, rest)| rest.split('/').next()) else {
            continue;
        };
        if fstype != FSTYPE || pid.parse::<u32>().map_or(true, pid_alive) {
            continue;
        }
        // /proc/self/mounts writes a space in a path as \040; these paths have none, and one that did would not
        // be found, which is harmless.
        let Ok(c) = CString::new(point) else { continue };
        // SAFETY: a valid NUL-terminated path that outlives the call.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
            let _ = std::fs::remove_dir(point);
            done.push(format!("detached {point} (run {pid} died with it mounted)"));
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use super::*;

    #[test]
    fn cpu_lists_count_every_range() {
        assert_eq!(cpu_count("0-1\n"), Some(2));
        assert_eq!(cpu_count("0"), Some(1));
        assert_eq!(cpu_count("0-3,8,10-11"), Some(7));
        assert_eq!(cpu_count("3-1"), None);
        assert_eq!(cpu_count("x"), None);
    }

    fn check_mount(dir: &Path) {
        let f = File::open(dir.join("f")).expect("open /f");
        assert_eq!(f.metadata().expect("stat /f").len(), FILE_BYTES);
        let mut buf = vec![0u8; 3 * 4096 + 17];
        for (i, offset) in [0, 4095, 1 << 20, FILE_BYTES - 4096, FILE_BYTES - 10].into_iter().enumerate() {
            let n = f.read_at(&mut buf, offset).expect("read");
            let want = (FILE_BYTES - offset).min(buf.len() as u64) as usize;
            assert_eq!(n, want, "read {i} at {offset}");
            assert!((0..n).all(|j| buf[j] == byte_at(offset + j as u64)), "bytes of read {i} at {offset}");
        }
        let missing = std::fs::metadata(dir.join("nope")).expect_err("no such name");
        assert_eq!(missing.raw_os_error(), Some(libc::ENOENT));
    }

    /// An aborted connection (what a ring queue that cannot go on does) fails the mount's callers with ENOTCONN
    /// instead of leaving them waiting.
    #[test]
    fn an_aborted_connection_fails_its_callers() {
        let dir = std::env::temp_dir().join(format!("weft-fuse-transport-abort-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mountpoint");
        let server = mount(&dir, Transport::DevFuse, 1, Dispatch::Inline).expect("mount over /dev/fuse (root)");
        check_mount(&dir);
        // A file held open keeps the mount busy, so the forced unmount only aborts, as with callers in flight.
        let f = File::open(dir.join("f")).expect("open /f");
        server.conn.abort("the test asks");
        let e = f.read_at(&mut [0u8; 4096], 0).expect_err("an aborted mount answers nothing");
        assert_eq!(e.raw_os_error(), Some(libc::ENOTCONN), "{e}");
        drop(f);
        drop(server);
        std::fs::remove_dir(&dir).expect("the mountpoint is empty once unmounted");
    }

    /// Held by the tests that change `enable_uring` or its marker: the module parameter is the machine's.
    static URING_SWITCH: Mutex<()> = Mutex::new(());

    /// A run killed with `kill -9` leaves its mount and `enable_uring` as it set them; the next run detaches the
    /// mount, removes its directory and puts `enable_uring` back, and leaves a live run's mount alone.
    #[test]
    fn a_killed_runs_mount_and_switch_are_put_right_by_the_next() {
        let mut child = std::process::Command::new("true").spawn().expect("spawn true");
        let dead = child.id();
        child.wait().expect("wait");
        let parent = std::env::temp_dir();
        let dead_dir = parent.join(format!("{MOUNT_DIR_PREFIX}{dead}"));
        let live_dir = parent.join(format!("{MOUNT_DIR_PREFIX}{}", std::process::id()));
        for d in [&dead_dir, &live_dir] {
            std::fs::create_dir_all(d).expect("mountpoint");
        }
        // The killed run's mount: its /dev/fuse closed with the process, the mount left behind.
        let dead_c = CString::new(dead_dir.to_str().expect("utf-8")).expect("path");
        drop(mount_dev(&dead_c).expect("mount (root)"));
        let live = mount(&live_dir, Transport::DevFuse, 1, Dispatch::Inline).expect("mount over /dev/fuse (root)");
        let _switch = URING_SWITCH.lock().unwrap_or_else(|p| p.into_inner());
        let switch = Path::new(ENABLE_URING).exists().then(|| std::fs::read_to_string(ENABLE_URING).expect("read"));
        if switch.is_some() {
            std::fs::write(URING_MARKER, format!("{dead}\nN\n")).expect("marker");
            std::fs::write(ENABLE_URING, "Y").expect("enable_uring (root)");
        }
        let done = put_right_leftovers();
        let mounted = |d: &Path| {
            std::fs::read_to_string("/proc/self/mounts").expect("mounts").contains(&format!(" {} ", d.display()))
        };
        assert!(!mounted(&dead_dir) && !dead_dir.exists(), "the dead run's mount detached and removed: {done:?}");
        assert!(mounted(&live_dir), "a live run's mount stays: {done:?}");
        check_mount(&live_dir);
        if let Some(was) = switch {
            assert_eq!(std::fs::read_to_string(ENABLE_URING).expect("read").trim(), "N", "{done:?}");
            assert!(!Path::new(URING_MARKER).exists());
            std::fs::write(ENABLE_URING, was.trim()).expect("put the switch back as the test found it");
        }
        drop(live);
        std::fs::remove_dir(&live_dir).expect("the mountpoint is empty once unmounted");
    }

    /// Both transports, each with both dispatches, serve the file's bytes through a real mount (root: mount(2)
    /// and the module parameter).
    #[test]
    fn both_transports_serve_the_files_bytes() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().expect("runtime");
        let dir = std::env::temp_dir().join(format!("weft-fuse-transport-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mountpoint");
        let pool = rt.handle().clone();
        for dispatch in [Dispatch::Inline, Dispatch::Pool(pool.clone()), Dispatch::PoolSubmits(pool)] {
            let server = mount(&dir, Transport::DevFuse, 2, dispatch.clone()).expect("mount over /dev/fuse (root)");
            assert_eq!(server.transport, Transport::DevFuse);
            check_mount(&dir);
            assert_eq!(server.ring_requests(), 0);
            drop(server);
            if !Path::new(ENABLE_URING).exists() {
                // A kernel built without CONFIG_FUSE_IO_URING: there is no ring to test, and the bench says so too.
                eprintln!("skipping the ring half: {ENABLE_URING} does not exist on this kernel");
                continue;
            }
            let _switch = URING_SWITCH.lock().unwrap_or_else(|p| p.into_inner());
            let _enabled = UringEnabled::new().expect("setting enable_uring (tests run as root)");
            let server = mount(&dir, Transport::Uring, 1, dispatch).expect("mount over io_uring");
            assert_eq!(server.transport, Transport::Uring);
            check_mount(&dir);
            assert!(server.ring_requests() >= 5, "the reads went by the ring: {}", server.ring_requests());
            drop(server);
        }
        std::fs::remove_dir(&dir).expect("the mountpoint is empty once unmounted");
    }
}
