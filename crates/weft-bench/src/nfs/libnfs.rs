//! libnfs's synchronous API (`libnfs.so.13`, libnfs 4.0, Debian's `libnfs13`), loaded with `dlopen` at run time
//! as the rdma fabric loads libibverbs: the weft binary does not link it, so it builds and runs without it, and
//! only `weft bench nfs` fails (clearly) where it is missing. All unsafe code of the NFS bench lives here.
//!
//! Why hand-written and not a crate: the Rust wrappers of libnfs on crates.io (`libnfs` 0.1, `libnfs-sys` 0.2, last
//! released 2022, Rust 2015, docs.rs cannot build them) run bindgen 0.46 at build time (headers and libclang on
//! every build machine) and link the library into the binary; the dozen
//! entry points used here have had the same C prototypes since libnfs 2.0 — except `nfs_pread`/`nfs_pwrite`, whose
//! argument order changed in libnfs 5.0 (buffer before offset); so the library is opened by its 4.x soname,
//! `libnfs.so.13`, whose prototypes (from `nfsc/libnfs.h` of libnfs-dev 4.0.0) are the ones below.
//!
//! An [`Nfs`] is one `nfs_context`: one TCP connection to one server, used from one thread at a time (libnfs's
//! sync calls run the context's event loop on the calling thread; the context is `Send`, not `Sync`).
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::OnceLock;

/// `struct nfs_url` of libnfs.h: three C strings owned by libnfs.
#[repr(C)]
struct NfsUrl {
    server: *mut c_char,
    path: *mut c_char,
    file: *mut c_char,
}

/// `struct nfs_stat_64` of libnfs.h (every field, for the C layout; the bench reads few).
#[repr(C)]
#[allow(dead_code)]
#[derive(Default, Debug, Clone, Copy)]
pub struct Stat64 {
    pub dev: u64,
    pub ino: u64,
    pub mode: u64,
    pub nlink: u64,
    pub uid: u64,
    pub gid: u64,
    pub rdev: u64,
    pub size: u64,
    pub blksize: u64,
    pub blocks: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atime_nsec: u64,
    pub mtime_nsec: u64,
    pub ctime_nsec: u64,
    pub used: u64,
}

const _: () = assert!(std::mem::size_of::<Stat64>() == 17 * 8);

type Ctx = c_void;
type Fh = c_void;

type InitContextFn = unsafe extern "C" fn() -> *mut Ctx;
type DestroyContextFn = unsafe extern "C" fn(*mut Ctx);
type GetErrorFn = unsafe extern "C" fn(*mut Ctx) -> *mut c_char;
type ParseUrlDirFn = unsafe extern "C" fn(*mut Ctx, *const c_char) -> *mut NfsUrl;
type DestroyUrlFn = unsafe extern "C" fn(*mut NfsUrl);
type SetAutoreconnectFn = unsafe extern "C" fn(*mut Ctx, c_int);
type MountFn = unsafe extern "C" fn(*mut Ctx, *const c_char, *const c_char) -> c_int;
type CreateFn = unsafe extern "C" fn(*mut Ctx, *const c_char, c_int, c_int, *mut *mut Fh) -> c_int;
type OpenFn = unsafe extern "C" fn(*mut Ctx, *const c_char, c_int, *mut *mut Fh) -> c_int;
type CloseFn = unsafe extern "C" fn(*mut Ctx, *mut Fh) -> c_int;
type PreadFn = unsafe extern "C" fn(*mut Ctx, *mut Fh, u64, u64, *mut c_void) -> c_int;
type PwriteFn = unsafe extern "C" fn(*mut Ctx, *mut Fh, u64, u64, *const c_void) -> c_int;
type FsyncFn = unsafe extern "C" fn(*mut Ctx, *mut Fh) -> c_int;
type Stat64Fn = unsafe extern "C" fn(*mut Ctx, *const c_char, *mut Stat64) -> c_int;
type UnlinkFn = unsafe extern "C" fn(*mut Ctx, *const c_char) -> c_int;
type GetReadmaxFn = unsafe extern "C" fn(*mut Ctx) -> u64;
type GetWritemaxFn = unsafe extern "C" fn(*mut Ctx) -> u64;

struct Lib {
    init_context: InitContextFn,
    destroy_context: DestroyContextFn,
    get_error: GetErrorFn,
    parse_url_dir: ParseUrlDirFn,
    destroy_url: DestroyUrlFn,
    set_autoreconnect: SetAutoreconnectFn,
    mount: MountFn,
    create: CreateFn,
    open: OpenFn,
    close: CloseFn,
    pread: PreadFn,
    pwrite: PwriteFn,
    fsync: FsyncFn,
    stat64: Stat64Fn,
    unlink: UnlinkFn,
    get_readmax: GetReadmaxFn,
    get_writemax: GetWritemaxFn,
}

const LIBRARY: &CStr = c"libnfs.so.13";

/// Loads libnfs once; later calls return the same table or the same error.
fn lib() -> Result<&'static Lib, String> {
    static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// Whether libnfs loads here (the error says what to install).
pub fn available() -> Result<(), String> {
    lib().map(|_| ())
}

fn load() -> Result<Lib, String> {
    // SAFETY: dlopen with a valid NUL-terminated name; the handle is never closed, so every symbol resolved from
    // it stays valid for the life of the process (the table lives in a static).
    let handle = unsafe { libc::dlopen(LIBRARY.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(format!(
            "cannot load {}: {} (install Debian's libnfs13, e.g. with libnfs-utils or libnfs-dev: make deps)",
            LIBRARY.to_string_lossy(),
            dlerror()
        ));
    }
    macro_rules! sym {
        ($name:literal, $ty:ty) => {{
            let name: &CStr = $name;
            // SAFETY: valid handle and NUL-terminated name.
            let ptr = unsafe { libc::dlsym(handle, name.as_ptr()) };
            if ptr.is_null() {
                return Err(format!("libnfs lacks {}: {}", name.to_string_lossy(), dlerror()));
            }
            // SAFETY: the symbol is the libnfs function of that name and the field's type its C prototype from
            // libnfs.h 4.0.0 (the soname pins that ABI); data and function pointers have the same size here.
            unsafe { std::mem::transmute::<*mut c_void, $ty>(ptr) }
        }};
    }
    Ok(Lib {
        init_context: sym!(c"nfs_init_context", InitContextFn),
        destroy_context: sym!(c"nfs_destroy_context", DestroyContextFn),
        get_error: sym!(c"nfs_get_error", GetErrorFn),
        parse_url_dir: sym!(c"nfs_parse_url_dir", ParseUrlDirFn),
        destroy_url: sym!(c"nfs_destroy_url", DestroyUrlFn),
        set_autoreconnect: sym!(c"nfs_set_autoreconnect", SetAutoreconnectFn),
        mount: sym!(c"nfs_mount", MountFn),
        create: sym!(c"nfs_create", CreateFn),
        open: sym!(c"nfs_open", OpenFn),
        close: sym!(c"nfs_close", CloseFn),
        pread: sym!(c"nfs_pread", PreadFn),
        pwrite: sym!(c"nfs_pwrite", PwriteFn),
        fsync: sym!(c"nfs_fsync", FsyncFn),
        stat64: sym!(c"nfs_stat64", Stat64Fn),
        unlink: sym!(c"nfs_unlink", UnlinkFn),
        get_readmax: sym!(c"nfs_get_readmax", GetReadmaxFn),
        get_writemax: sym!(c"nfs_get_writemax", GetWritemaxFn),
    })
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl* call on this thread; it is
    // copied out at once.
    let msg = unsafe { libc::dlerror() };
    if msg.is_null() {
        return "unknown error".to_string();
    }
    // SAFETY: non-NULL and NUL-terminated, see above.
    unsafe { CStr::from_ptr(msg) }.to_string_lossy().into_owned()
}

fn cstr(s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("{s:?} contains a NUL byte"))
}

/// One mounted libnfs context.
pub struct Nfs {
    lib: &'static Lib,
    ctx: *mut Ctx,
}

// SAFETY: an nfs_context has no thread affinity; it is used by one thread at a time (`Nfs` is not `Sync`, every
// call takes `&mut self` or `&self` on the owning thread).
unsafe impl Send for Nfs {}

/// An open file of an [`Nfs`] context; closed by [`Nfs::close`] (or leaked with the context, which frees it).
pub struct File(*mut Fh);

impl Nfs {
    /// Parses `url` (`nfs://server/export/path?version=3&nfsport=N&mountport=M`: the query sets the context's
    /// options, so no portmapper is asked) and mounts its directory. Reconnects are off: a dropped connection is
    /// an error of the operation, not a silent retry inside a timed loop.
    pub fn mount(url: &str) -> Result<Nfs, String> {
        let lib = lib()?;
        // SAFETY: no arguments; NULL is checked.
        let ctx = unsafe { (lib.init_context)() };
        if ctx.is_null() {
            return Err("nfs_init_context failed".into());
        }
        let nfs = Nfs { lib, ctx };
        let c_url = cstr(url)?;
        // SAFETY: live context, NUL-terminated URL; the result is NULL or a url we destroy below.
        let u = unsafe { (lib.parse_url_dir)(ctx, c_url.as_ptr()) };
        if u.is_null() {
            return Err(format!("{url}: {}", nfs.error()));
        }
        // SAFETY: live context.
        unsafe { (lib.set_autoreconnect)(ctx, 0) };
        // SAFETY: `u` is a live nfs_url whose server and path are NUL-terminated strings owned by it (path may be
        // NULL for a URL without one, which nfs_mount rejects with an error).
        let rc = unsafe { (lib.mount)(ctx, (*u).server, (*u).path) };
        // SAFETY: `u` came from nfs_parse_url_dir and is destroyed once.
        unsafe { (lib.destroy_url)(u) };
        if rc != 0 {
            return Err(format!("mounting {url}: {}", nfs.error()));
        }
        Ok(nfs)
    }

    /// The context's last error message.
    fn error(&self) -> String {
        // SAFETY: live context; the result is NULL or a NUL-terminated string owned by the context, copied out.
        let p = unsafe { (self.lib.get_error)(self.ctx) };
        if p.is_null() {
            return "unknown libnfs error".into();
        }
        // SAFETY: non-NULL and NUL-terminated, see above.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    fn check(&self, what: &str, path: &str, rc: c_int) -> Result<c_int, String> {
        if rc < 0 {
            Err(format!("{what} {path}: {} ({})", self.error(), std::io::Error::from_raw_os_error(-rc)))
        } else {
            Ok(rc)
        }
    }

    /// The largest READ and WRITE the server takes (FSINFO), bytes.
    pub fn rwmax(&self) -> (u64, u64) {
        // SAFETY: live, mounted context.
        unsafe { ((self.lib.get_readmax)(self.ctx), (self.lib.get_writemax)(self.ctx)) }
    }

    /// `open(path, O_CREAT | flags, mode)`, path relative to the mount.
    pub fn create(&mut self, path: &str, flags: c_int, mode: c_int) -> Result<File, String> {
        let p = cstr(path)?;
        let mut fh = std::ptr::null_mut();
        // SAFETY: live context, NUL-terminated path, `fh` a writable out-pointer.
        let rc = unsafe { (self.lib.create)(self.ctx, p.as_ptr(), flags, mode, &mut fh) };
        self.check("create", path, rc)?;
        Ok(File(fh))
    }

    /// `open(path, flags)`.
    pub fn open(&mut self, path: &str, flags: c_int) -> Result<File, String> {
        let p = cstr(path)?;
        let mut fh = std::ptr::null_mut();
        // SAFETY: live context, NUL-terminated path, `fh` a writable out-pointer.
        let rc = unsafe { (self.lib.open)(self.ctx, p.as_ptr(), flags, &mut fh) };
        self.check("open", path, rc)?;
        Ok(File(fh))
    }

    pub fn close(&mut self, f: File) -> Result<(), String> {
        // SAFETY: `f` is an open handle of this context, consumed here (closed once).
        let rc = unsafe { (self.lib.close)(self.ctx, f.0) };
        self.check("close", "", rc).map(|_| ())
    }

    /// Reads into all of `buf` from `offset` (several calls if the library returns short), stopping at end of file;
    /// returns the bytes read.
    pub fn pread(&mut self, f: &File, offset: u64, buf: &mut [u8]) -> Result<usize, String> {
        let mut done = 0;
        while done < buf.len() {
            let rest = &mut buf[done..];
            // SAFETY: live context and open handle; `rest` is writable for its whole length, which is the count.
            let rc = unsafe {
                (self.lib.pread)(self.ctx, f.0, offset + done as u64, rest.len() as u64, rest.as_mut_ptr().cast())
            };
            let n = self.check("pread", "", rc)? as usize;
            if n == 0 {
                break;
            }
            done += n.min(rest.len());
        }
        Ok(done)
    }

    /// Writes all of `buf` at `offset` (UNSTABLE: [`Nfs::fsync`] commits).
    pub fn pwrite(&mut self, f: &File, offset: u64, buf: &[u8]) -> Result<(), String> {
        let mut done = 0;
        while done < buf.len() {
            let rest = &buf[done..];
            // SAFETY: live context and open handle; `rest` is readable for its whole length, which is the count.
            let rc = unsafe {
                (self.lib.pwrite)(self.ctx, f.0, offset + done as u64, rest.len() as u64, rest.as_ptr().cast())
            };
            let n = self.check("pwrite", "", rc)? as usize;
            if n == 0 {
                return Err("pwrite wrote nothing".into());
            }
            done += n.min(rest.len());
        }
        Ok(())
    }

    /// COMMIT of everything written through `f`.
    pub fn fsync(&mut self, f: &File) -> Result<(), String> {
        // SAFETY: live context and open handle.
        let rc = unsafe { (self.lib.fsync)(self.ctx, f.0) };
        self.check("fsync", "", rc).map(|_| ())
    }

    pub fn stat(&mut self, path: &str) -> Result<Stat64, String> {
        let p = cstr(path)?;
        let mut st = Stat64::default();
        // SAFETY: live context, NUL-terminated path, `st` a writable nfs_stat_64.
        let rc = unsafe { (self.lib.stat64)(self.ctx, p.as_ptr(), &mut st) };
        self.check("stat", path, rc)?;
        Ok(st)
    }

    pub fn unlink(&mut self, path: &str) -> Result<(), String> {
        let p = cstr(path)?;
        // SAFETY: live context, NUL-terminated path.
        let rc = unsafe { (self.lib.unlink)(self.ctx, p.as_ptr()) };
        self.check("unlink", path, rc).map(|_| ())
    }
}

impl Drop for Nfs {
    fn drop(&mut self) {
        // SAFETY: the context is live and destroyed once; it frees the handles still open on it.
        unsafe { (self.lib.destroy_context)(self.ctx) };
    }
}
