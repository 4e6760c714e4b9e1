//! What std lacks here: statvfs(3) for the space and the file system identity of the object root, statfs(2) for its
//! kind (memory-backed ones are never mapped), read-only mappings of object files
//! for reads served from the page cache, and fallocate(2) to reserve space before a write (so a full disk fails the
//! write before any byte changes) and to punch out the appended part of a write that failed. The only `unsafe` of
//! this crate lives in this module.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// statvfs(3) of the file system holding `path`.
fn statvfs(path: &Path) -> io::Result<libc::statvfs> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c` is a NUL-terminated path that outlives the call; `st` points to writable memory of the right
    // type, which statvfs fills completely when it returns 0.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it initialised the struct.
    Ok(unsafe { st.assume_init() })
}

/// Whether the file system holding `path` is memory-backed (tmpfs, hugetlbfs): there a read fault on a hole of a
/// mapping allocates a page, and on a full file system the process gets SIGBUS instead of an error, so objects
/// there are never mapped (`ObjectStore::read_mapped`). Unknown (statfs failed): treated as memory-backed.
pub fn faults_allocate(path: &Path) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else { return true };
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: `c` is a NUL-terminated path that outlives the call; `st` points to writable memory of the right
    // type, which statfs fills completely when it returns 0.
    let rc = unsafe { libc::statfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return true;
    }
    // SAFETY: statfs returned 0, so it initialised the struct.
    let st = unsafe { st.assume_init() };
    // `f_type` is `__fsword_t`, not i64 on every target.
    #[allow(clippy::unnecessary_cast)]
    let kind = st.f_type as i64;
    kind == TMPFS_MAGIC || kind == HUGETLBFS_MAGIC
}

/// (bytes total, bytes available to unprivileged users) of the file system holding `path`.
pub fn space(path: &Path) -> io::Result<(u64, u64)> {
    let st = statvfs(path)?;
    let frag = st.f_frsize;
    Ok((st.f_blocks * frag, st.f_bavail * frag))
}

/// (`st_dev`, statvfs `f_fsid`) of the file system holding `path`: its identity (`weft_proto::space`).
pub fn device(path: &Path) -> io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path)?.dev();
    Ok((dev, statvfs(path)?.f_fsid))
}

/// Maps `len` bytes of `f` from `offset` (a multiple of the page size) read-only, with the pages populated up front
/// so the checksum pass and the socket send take no page faults.
pub fn map_populated(f: &File, offset: u64, len: usize) -> io::Result<memmap2::Mmap> {
    // SAFETY: the mapping is read-only, and the bytes must not change while it lives. Weft's own writers and
    // truncates of this range are excluded by the range lock the caller holds for the mapping's whole life (see
    // `store::MappedRead`); object files belong to the data server alone, and changing them from outside while it
    // runs is unsupported (as for any storage daemon's files).
    unsafe { memmap2::MmapOptions::new().offset(offset).len(len).populate().map(f) }
}

/// Reserves disk blocks for `[offset, offset + len)` of `f` without changing its size or contents
/// (`FALLOC_FL_KEEP_SIZE`). `Ok(false)`: the file system cannot reserve (no fallocate support), nothing was done.
pub fn reserve(f: &File, offset: u64, len: u64) -> io::Result<bool> {
    fallocate(f, libc::FALLOC_FL_KEEP_SIZE, offset, len)
}

/// Deallocates `[offset, offset + len)` of `f`: it reads as zeros afterwards; the size does not change.
/// `Ok(false)`: the file system cannot punch holes, nothing was done.
pub fn punch_hole(f: &File, offset: u64, len: u64) -> io::Result<bool> {
    fallocate(f, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, offset, len)
}

fn fallocate(f: &File, mode: libc::c_int, offset: u64, len: u64) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    if len == 0 {
        return Ok(true);
    }
    let (Ok(off), Ok(n)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    loop {
        // SAFETY: fallocate(2) on a descriptor `f` owns for the whole call; it touches no memory of ours.
        let rc = unsafe { libc::fallocate(f.as_raw_fd(), mode, off, n) };
        if rc == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EOPNOTSUPP | libc::ENOSYS) => return Ok(false),
            _ => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/dev/shm` is a tmpfs on Linux; the build's own directory is on a disk file system in every CI we run.
    #[test]
    fn memory_backed_file_systems_are_told_apart() {
        assert!(faults_allocate(Path::new("/dev/shm")), "/dev/shm is a tmpfs");
        assert!(!faults_allocate(Path::new(env!("CARGO_MANIFEST_DIR"))), "the source tree is on a disk");
        assert!(faults_allocate(Path::new("/no/such/dir")), "unknown counts as memory-backed");
    }
}
