//! A seeded random-operation file exerciser in the manner of fsx (Apple's File System eXerciser): writes, reads,
//! truncates down and up, mmap writes and reads, syncs and close-and-reopen on one file, every read compared with
//! an in-memory model. Two targets: a path on the FUSE mount ([`PathFile`], with mmap) and the native client
//! ([`NativeFile`]). A failure panics with the seed, the op number, the op and the ops before it, and the command
//! that replays it (`WEFT_FSX_SEED`, `WEFT_FSX_OPS`).

use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;

use bytes::{Bytes, BytesMut};
use weft_client::{Client, File, OpenMode};

/// What an exerciser run does: how many ops, on a file of at most `file_bytes_max`, ops of at most `op_bytes_max`.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub seed: u64,
    pub ops: u32,
    pub file_bytes_max: u64,
    pub op_bytes_max: u64,
    /// Whether mmap reads and writes are among the ops (the mount only).
    pub mmap: bool,
}

impl Plan {
    /// The seeds a test runs: `WEFT_FSX_SEED` (one seed, to replay a failure) or `default`.
    pub fn seeds(default: &[u64]) -> Vec<u64> {
        match std::env::var("WEFT_FSX_SEED") {
            Ok(s) => vec![s.parse().expect("WEFT_FSX_SEED is a number")],
            Err(_) => default.to_vec(),
        }
    }

    /// `default` ops, or `WEFT_FSX_OPS` (the soak runs set it high).
    pub fn ops(default: u32) -> u32 {
        std::env::var("WEFT_FSX_OPS").ok().map_or(default, |s| s.parse().expect("WEFT_FSX_OPS is a number"))
    }
}

#[derive(Clone, Debug)]
pub enum Op {
    Read { offset: u64, len: u64 },
    Write { offset: u64, len: u64 },
    MapRead { offset: u64, len: u64 },
    MapWrite { offset: u64, len: u64 },
    Truncate { size: u64 },
    Sync,
    Reopen,
}

/// xorshift64*: small, seeded, the same sequence everywhere.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
}

/// The next op for a file of `size` bytes. Offsets favour row and unit edges less than uniform would miss them, so
/// a few ops in each run start or end exactly on a 4 KiB boundary.
fn next_op(rng: &mut Rng, plan: &Plan, size: u64) -> Op {
    let pick = rng.below(100);
    let len = 1 + rng.below(plan.op_bytes_max);
    let aligned = rng.below(4) == 0;
    let align = |v: u64| if aligned { v - v % 4096 } else { v };
    let anywhere = align(rng.below(plan.file_bytes_max));
    match pick {
        0..=24 => {
            let offset = align(rng.below(size.max(1)));
            Op::Read { offset, len: len.min(size.saturating_sub(offset)).max(1) }
        }
        25..=49 => Op::Write { offset: anywhere, len: len.min(plan.file_bytes_max - anywhere) },
        50..=59 if plan.mmap && size > 0 => {
            let offset = rng.below(size);
            Op::MapRead { offset, len: len.min(size - offset) }
        }
        60..=71 if plan.mmap => Op::MapWrite { offset: anywhere, len: len.min(plan.file_bytes_max - anywhere) },
        72..=87 => Op::Truncate { size: align(rng.below(plan.file_bytes_max + 1)) },
        88..=92 => Op::Sync,
        93..=99 => Op::Reopen,
        _ => Op::Read { offset: 0, len: size.max(1) },
    }
}

/// The bytes op number `n` writes: recognisable in a dump (the low byte of the op number in every fourth byte).
fn payload(seed: u64, n: u32, len: u64) -> Vec<u8> {
    let mut out = crate::common::pattern(seed ^ (u64::from(n) << 32), 0, len as usize);
    out.iter_mut().step_by(4).for_each(|b| *b = n as u8);
    out
}

/// One file an exerciser drives.
#[allow(async_fn_in_trait)]
pub trait Target {
    async fn read(&mut self, offset: u64, len: u64) -> Result<Vec<u8>, String>;
    async fn write(&mut self, offset: u64, data: Vec<u8>) -> Result<(), String>;
    async fn map_read(&mut self, offset: u64, len: u64) -> Result<Vec<u8>, String>;
    /// Writes through a shared mapping (growing the file first, as fsx does, when it ends past the size).
    async fn map_write(&mut self, offset: u64, data: Vec<u8>, size: u64) -> Result<(), String>;
    async fn truncate(&mut self, size: u64) -> Result<(), String>;
    async fn sync(&mut self) -> Result<(), String>;
    async fn reopen(&mut self) -> Result<(), String>;
    /// The file's size as a fresh stat sees it.
    async fn stat_size(&mut self) -> Result<u64, String>;
}

/// Runs `plan` against `target`, checking every read and, after every reopen, the size.
pub async fn run(what: &str, plan: Plan, target: &mut impl Target) {
    let mut model: Vec<u8> = Vec::new();
    let mut rng = Rng::new(plan.seed);
    let mut recent: VecDeque<(u32, Op)> = VecDeque::with_capacity(16);
    for n in 1..=plan.ops {
        let op = next_op(&mut rng, &plan, model.len() as u64);
        if recent.len() == 16 {
            recent.pop_front();
        }
        recent.push_back((n, op.clone()));
        let fail = |why: String| -> ! {
            let log: Vec<String> = recent.iter().map(|(n, op)| format!("  {n}: {op:?}")).collect();
            panic!(
                "fsx {what}: seed {} op {n} {op:?}: {why}\nlast ops:\n{}\nreplay: WEFT_FSX_SEED={} WEFT_FSX_OPS={} \
                 cargo test --release -p weft --test integration exercisers::",
                plan.seed,
                log.join("\n"),
                plan.seed,
                plan.ops
            )
        };
        match op {
            Op::Read { offset, len } | Op::MapRead { offset, len } => {
                let mapped = matches!(op, Op::MapRead { .. });
                let got = if mapped { target.map_read(offset, len).await } else { target.read(offset, len).await };
                let got = got.unwrap_or_else(|e| fail(e));
                let lo = (offset as usize).min(model.len());
                let hi = ((offset + len) as usize).min(model.len());
                compare(&got, &model[lo..hi], offset).unwrap_or_else(|e| fail(e));
            }
            Op::Write { offset, len } | Op::MapWrite { offset, len } => {
                let data = payload(plan.seed, n, len);
                let end = (offset + len) as usize;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[offset as usize..end].copy_from_slice(&data);
                let r = if matches!(op, Op::MapWrite { .. }) {
                    target.map_write(offset, data, model.len() as u64).await
                } else {
                    target.write(offset, data).await
                };
                r.unwrap_or_else(|e| fail(e));
            }
            Op::Truncate { size } => {
                model.resize(size as usize, 0);
                target.truncate(size).await.unwrap_or_else(|e| fail(e));
            }
            Op::Sync => target.sync().await.unwrap_or_else(|e| fail(e)),
            Op::Reopen => {
                target.reopen().await.unwrap_or_else(|e| fail(e));
                let size = target.stat_size().await.unwrap_or_else(|e| fail(e));
                if size != model.len() as u64 {
                    fail(format!("size {size} after reopen, {} expected", model.len()));
                }
            }
        }
    }
    // Last, the whole file once more.
    target.reopen().await.unwrap_or_else(|e| panic!("fsx {what}: seed {}: final reopen: {e}", plan.seed));
    let got = target.read(0, model.len() as u64 + 1).await.unwrap_or_else(|e| panic!("fsx {what}: final read: {e}"));
    if let Err(e) = compare(&got, &model, 0) {
        panic!("fsx {what}: seed {} after {} ops, the whole file: {e}", plan.seed, plan.ops);
    }
}

/// `Ok` when `got == want`, else where they first differ and both sides' bytes there.
fn compare(got: &[u8], want: &[u8], offset: u64) -> Result<(), String> {
    if got == want {
        return Ok(());
    }
    let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
    let show = |b: &[u8]| format!("{:02x?}", &b[at.min(b.len())..(at + 16).min(b.len())]);
    Err(format!(
        "{} bytes read, {} expected; first difference at file offset {}: got {} want {}",
        got.len(),
        want.len(),
        offset + at as u64,
        show(got),
        show(want)
    ))
}

/// A file on the FUSE mount, through the kernel (pread, pwrite, ftruncate, mmap, fsync, close and open).
pub struct PathFile {
    path: PathBuf,
    file: std::fs::File,
}

impl PathFile {
    pub fn create(path: PathBuf) -> PathFile {
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        PathFile { path, file }
    }

    /// Maps `[offset, offset + len)` shared, read-write, and runs `f` on those bytes (the one unsafe of the tests'
    /// exerciser: mmap has no safe wrapper in the tree).
    #[allow(unsafe_code)]
    fn with_map<R>(&self, offset: u64, len: u64, f: impl FnOnce(&mut [u8]) -> R) -> Result<R, String> {
        let page = 4096u64;
        let start = offset - offset % page;
        let span = (offset + len - start) as usize;
        // SAFETY: a fresh shared mapping of this open file; no other reference to it exists, it is unmapped below,
        // and the file is at least `offset + len` bytes long (the callers grow it first), so every byte of the
        // slice is backed by the file.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.file.as_raw_fd(),
                start as libc::off_t,
            );
            if p == libc::MAP_FAILED {
                return Err(format!("mmap: {}", std::io::Error::last_os_error()));
            }
            let bytes = std::slice::from_raw_parts_mut(p.cast::<u8>(), span);
            let r = f(&mut bytes[(offset - start) as usize..]);
            let synced = libc::msync(p, span, libc::MS_SYNC);
            let err = std::io::Error::last_os_error();
            libc::munmap(p, span);
            if synced != 0 {
                return Err(format!("msync: {err}"));
            }
            Ok(r)
        }
    }
}

impl Target for PathFile {
    async fn read(&mut self, offset: u64, len: u64) -> Result<Vec<u8>, String> {
        let mut buf = vec![0u8; len as usize];
        let mut got = 0;
        while got < buf.len() {
            match self.file.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) => return Err(format!("pread: {e}")),
            }
        }
        buf.truncate(got);
        Ok(buf)
    }

    async fn write(&mut self, offset: u64, data: Vec<u8>) -> Result<(), String> {
        self.file.write_all_at(&data, offset).map_err(|e| format!("pwrite: {e}"))
    }

    async fn map_read(&mut self, offset: u64, len: u64) -> Result<Vec<u8>, String> {
        self.with_map(offset, len, |b| b[..len as usize].to_vec())
    }

    async fn map_write(&mut self, offset: u64, data: Vec<u8>, size: u64) -> Result<(), String> {
        let now = self.file.metadata().map_err(|e| format!("fstat: {e}"))?.len();
        if now < size {
            self.file.set_len(size).map_err(|e| format!("ftruncate up for mmap: {e}"))?;
        }
        self.with_map(offset, data.len() as u64, |b| b[..data.len()].copy_from_slice(&data))
    }

    async fn truncate(&mut self, size: u64) -> Result<(), String> {
        self.file.set_len(size).map_err(|e| format!("ftruncate: {e}"))
    }

    async fn sync(&mut self) -> Result<(), String> {
        self.file.sync_all().map_err(|e| format!("fsync: {e}"))
    }

    async fn reopen(&mut self) -> Result<(), String> {
        self.file = OpenOptions::new().read(true).write(true).open(&self.path).map_err(|e| format!("open: {e}"))?;
        Ok(())
    }

    async fn stat_size(&mut self) -> Result<u64, String> {
        std::fs::metadata(&self.path).map(|m| m.len()).map_err(|e| format!("stat: {e}"))
    }
}

/// A file through the native client: `File::write_at`, `read_at`, `truncate`, `sync`, `close` and open again.
pub struct NativeFile {
    client: Client,
    path: String,
    file: Option<File>,
}

impl NativeFile {
    pub async fn create(client: Client, path: &str) -> NativeFile {
        let f = client.create_path(path, 0o644, true, false).await.unwrap();
        drop(f);
        let file = client.open(path, OpenMode::ReadWrite).await.unwrap();
        NativeFile { client, path: path.to_string(), file: Some(file) }
    }

    fn file(&self) -> &File {
        self.file.as_ref().expect("open")
    }
}

impl Target for NativeFile {
    async fn read(&mut self, offset: u64, len: u64) -> Result<Vec<u8>, String> {
        let got = self.file().read_at(offset, BytesMut::zeroed(len as usize)).await.map_err(|e| e.to_string())?;
        Ok(got.to_vec())
    }

    async fn write(&mut self, offset: u64, data: Vec<u8>) -> Result<(), String> {
        self.file().write_at(offset, Bytes::from(data)).await.map_err(|e| e.to_string())
    }

    async fn map_read(&mut self, offset: u64, len: u64) -> Result<Vec<u8>, String> {
        self.read(offset, len).await
    }

    async fn map_write(&mut self, offset: u64, data: Vec<u8>, _size: u64) -> Result<(), String> {
        self.write(offset, data).await
    }

    async fn truncate(&mut self, size: u64) -> Result<(), String> {
        self.file().truncate(size).await.map_err(|e| e.to_string())
    }

    async fn sync(&mut self) -> Result<(), String> {
        self.file().sync().await.map_err(|e| e.to_string())
    }

    async fn reopen(&mut self) -> Result<(), String> {
        let f = self.file.take().expect("open");
        f.close().await.map_err(|e| format!("close: {e}"))?;
        self.file = Some(self.client.open(&self.path, OpenMode::ReadWrite).await.map_err(|e| e.to_string())?);
        Ok(())
    }

    async fn stat_size(&mut self) -> Result<u64, String> {
        Ok(self.file().size())
    }
}
