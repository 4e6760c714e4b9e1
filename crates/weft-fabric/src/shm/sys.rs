//! Every system-level operation of the `shm` fabric, and all of its `unsafe`: the memfd arena (create, seal,
//! check, map shared), passing its descriptor with SCM_RIGHTS, copies into and out of a shared mapping, and
//! process_vm_readv/writev into the client's address space.
#![allow(unsafe_code)]

use std::fs::File;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use memmap2::{MmapOptions, MmapRaw};
use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use nix::sys::uio::{RemoteIoVec, process_vm_readv, process_vm_writev};
use nix::unistd::Pid;

fn nix_err(e: nix::Error) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// A memfd of `len` bytes whose size is sealed: the server that maps it can trust it never shrinks under the
/// mapping (which would turn the server's accesses into SIGBUS).
pub fn create_arena_fd(len: u64) -> io::Result<OwnedFd> {
    let fd = memfd_create(c"weft-arena", MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING).map_err(nix_err)?;
    let file = File::from(fd);
    file.set_len(len)?;
    let seals = SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL;
    fcntl(&file, FcntlArg::F_ADD_SEALS(seals)).map_err(nix_err)?;
    Ok(OwnedFd::from(file))
}

/// Refuses a descriptor that is not a size-sealed memfd of at least `len` bytes.
pub fn check_arena_fd(fd: &OwnedFd, len: u64) -> io::Result<()> {
    let seals = fcntl(fd, FcntlArg::F_GET_SEALS)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("the arena is not a sealable memfd: {e}")))?;
    let seals = SealFlag::from_bits_truncate(seals);
    if !seals.contains(SealFlag::F_SEAL_SHRINK) {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "the arena memfd is not sealed against shrinking"));
    }
    let size = File::from(fd.try_clone()?).metadata()?.len();
    if size < len {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the arena memfd holds {size} bytes, the client claims {len}"),
        ));
    }
    Ok(())
}

/// A shared, read-write mapping of an arena, populated at map time (first touch is slow on this machine class).
/// Accessed only by copies with checked bounds: no reference into memory another process writes ever exists.
pub struct SharedMap {
    map: MmapRaw,
}

impl SharedMap {
    pub fn map(fd: &OwnedFd, len: u64) -> io::Result<SharedMap> {
        let len = usize::try_from(len).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "arena too large"))?;
        let map = MmapOptions::new().len(len).populate().map_raw(fd.as_raw_fd())?;
        Ok(SharedMap { map })
    }

    /// The mapping's base address, for a fabric that registers the arena with a device (`rdma`).
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    fn range(&self, offset: u64, len: usize) -> io::Result<usize> {
        let start = usize::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
        match start.checked_add(len) {
            Some(end) if end <= self.map.len() => Ok(start),
            _ => Err(io::Error::new(io::ErrorKind::InvalidInput, "range outside the arena")),
        }
    }

    /// Copies `src` into the mapping at `offset`.
    pub fn copy_in(&self, offset: u64, src: &[u8]) -> io::Result<()> {
        let start = self.range(offset, src.len())?;
        // SAFETY: `range` checked that [start, start + len) lies inside the live mapping, which is writable and
        // shared; `src` is ordinary memory of this process and cannot overlap the mapping it did not come from.
        // The peer may touch these bytes concurrently only if it breaks the protocol (a buffer belongs to one
        // in-flight request); then it reads torn bytes of its own request, which a plain byte copy tolerates.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.map.as_mut_ptr().add(start), src.len()) };
        Ok(())
    }

    /// Copies from the mapping at `offset` into `dst`.
    pub fn copy_out(&self, offset: u64, dst: &mut [u8]) -> io::Result<()> {
        let start = self.range(offset, dst.len())?;
        // SAFETY: as in `copy_in`, the source range is inside the live mapping and `dst` is distinct memory.
        unsafe { std::ptr::copy_nonoverlapping(self.map.as_ptr().add(start), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }
}

/// Sends the hello bytes, with `fd` attached as SCM_RIGHTS when given. Non-blocking sockets may answer WouldBlock.
pub fn send_hello(sock: RawFd, hello: &[u8], fd: Option<RawFd>) -> io::Result<usize> {
    let iov = [IoSlice::new(hello)];
    let fds: Vec<RawFd> = fd.into_iter().collect();
    let cmsgs: Vec<ControlMessage<'_>> =
        if fds.is_empty() { Vec::new() } else { vec![ControlMessage::ScmRights(&fds)] };
    sendmsg::<()>(sock, &iov, &cmsgs, MsgFlags::MSG_NOSIGNAL, None).map_err(nix_err)
}

/// Receives up to `buf.len()` hello bytes and at most one descriptor passed with them.
pub fn recv_hello(sock: RawFd, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut iov = [IoSliceMut::new(buf)];
    let mut space = nix::cmsg_space!([RawFd; 2]);
    let msg = recvmsg::<()>(sock, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC).map_err(nix_err)?;
    let mut received: Vec<OwnedFd> = Vec::new();
    for c in msg.cmsgs().map_err(nix_err)? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for fd in fds {
                // SAFETY: the kernel just installed `fd` in this process for us (SCM_RIGHTS); nothing else owns it,
                // so wrapping it makes it closed exactly once, including the extra ones we refuse below.
                received.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    let n = msg.bytes;
    if received.len() > 1 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "more than one descriptor in the hello"));
    }
    Ok((n, received.pop()))
}

/// Copies `local` into the client's memory at `remote` (process_vm_writev); the whole length or an error.
pub fn vm_write(pid: i32, local: &[IoSlice<'_>], remote: &[RemoteIoVec]) -> io::Result<()> {
    let want: usize = remote.iter().map(|r| r.len).sum();
    let n = process_vm_writev(Pid::from_raw(pid), local, remote).map_err(nix_err)?;
    if n != want {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("wrote {n} of {want} bytes to the client")));
    }
    Ok(())
}

/// Copies from the client's memory at `remote` into `local` (process_vm_readv); the whole length or an error.
pub fn vm_read(pid: i32, local: &mut [IoSliceMut<'_>], remote: &[RemoteIoVec]) -> io::Result<()> {
    let want: usize = remote.iter().map(|r| r.len).sum();
    let n = process_vm_readv(Pid::from_raw(pid), local, remote).map_err(nix_err)?;
    if n != want {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("read {n} of {want} bytes from the client")));
    }
    Ok(())
}

pub use nix::sys::uio::RemoteIoVec as RemoteVec;
