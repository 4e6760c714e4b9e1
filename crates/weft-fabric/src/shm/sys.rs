//! Every system-level operation of the `shm` fabric, and all of its `unsafe`: the memfd arena (create, seal,
//! check, map shared), passing its descriptor with SCM_RIGHTS, copies into and out of a shared mapping, and
//! process_vm_readv/writev into the client's address space.
#![allow(unsafe_code)]

use std::fs::File;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};

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

/// The connected peer's process as a pidfd: SO_PEERPIDFD (Linux 6.5+) names the very process that connected, so
/// no pid reuse can slip in; on older kernels `pidfd_open` of the SO_PEERCRED pid, which leaves the window
/// between the client's `connect` and this call (the caller checks liveness after the hello, see `ShmPeer`).
pub fn peer_pidfd(sock: &impl AsFd, pid: i32) -> io::Result<OwnedFd> {
    match nix::sys::socket::getsockopt(sock, nix::sys::socket::sockopt::PeerPidfd) {
        Ok(fd) => Ok(fd),
        Err(nix::Error::ENOPROTOOPT | nix::Error::EINVAL) => pidfd_open(pid),
        Err(e) => Err(nix_err(e)),
    }
}

/// pidfd_open(2): a descriptor naming process `pid` itself, not its number.
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: a plain system call with integer arguments; a non-negative result is a new descriptor we own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by the kernel to this process and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Whether the process a pidfd names has not exited: pidfd_send_signal(2) with signal 0 checks without signalling.
/// A zombie counts as alive (it still holds its pid number, so the number cannot name another process yet).
pub fn pidfd_alive(pidfd: &OwnedFd) -> io::Result<bool> {
    // SAFETY: a plain system call: a live descriptor, signal 0, no siginfo, no flags.
    let r = unsafe {
        libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), 0, std::ptr::null::<libc::siginfo_t>(), 0)
    };
    if r == 0 {
        return Ok(true);
    }
    match io::Error::last_os_error() {
        e if e.raw_os_error() == Some(libc::ESRCH) => Ok(false),
        // Not allowed to signal it: it exists.
        e if e.raw_os_error() == Some(libc::EPERM) => Ok(true),
        e => Err(e),
    }
}

/// Gives a bound socket file its mode (and group), before it gets its public name.
pub fn set_socket_mode(path: &std::path::Path, mode: u32, gid: Option<u32>) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(g) = gid {
        std::os::unix::fs::chown(path, None, Some(g))?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// A group's id from its name or number (`shm_socket_group`).
pub fn group_id(group: &str) -> io::Result<u32> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(group).map_err(nix_err)? {
        Some(g) => Ok(g.gid.as_raw()),
        None => Err(io::Error::new(io::ErrorKind::NotFound, format!("no group named {group:?}"))),
    }
}

/// Tests only: a forked child that takes uid/gid (no supplementary groups) and connects to the Unix socket at
/// `path`; returns the connect's errno (0: connected). The child makes only raw system calls before `_exit`.
#[cfg(test)]
pub fn connect_as(path: &std::path::Path, uid: u32, gid: u32) -> io::Result<i32> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: sockaddr_un is plain data, valid all zeros.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "socket path too long"));
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: the child runs only async-signal-safe system calls (setgroups, setresgid, setresuid, socket,
    // connect, _exit) on memory prepared before the fork, so the other threads of the test process do not matter.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(io::Error::last_os_error());
    }
    if child == 0 {
        // SAFETY: see above; every path ends in _exit.
        unsafe {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(gid, gid, gid) != 0
                || libc::setresuid(uid, uid, uid) != 0
            {
                libc::_exit(200);
            }
            let s = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            if s < 0 {
                libc::_exit(201);
            }
            let r = libc::connect(
                s,
                (&addr as *const libc::sockaddr_un).cast(),
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            );
            let errno = if r == 0 { 0 } else { *libc::__errno_location() };
            libc::_exit(errno.min(199));
        }
    }
    let mut status = 0;
    // SAFETY: waiting for the child forked above.
    if unsafe { libc::waitpid(child, &mut status, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    match libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)) {
        Some(c) if c < 200 => Ok(c),
        other => Err(io::Error::other(format!("the connecting child could not drop privileges ({other:?})"))),
    }
}
