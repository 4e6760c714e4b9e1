//! Owning wrappers over verbs objects: device context + protection domain, memory regions, completion queues and
//! queue pairs. Each wrapper holds an `Arc` of the device, so the context and PD outlive every object made from
//! them, and destroys its object in `Drop` (queue pair before its CQs: `Endpoint` declares them in that order).

use std::ffi::{CStr, c_int, c_void};
use std::sync::Arc;

use std::os::fd::RawFd;
use std::time::Duration;

use super::ffi::{
    self, IbvCompChannel, IbvContext, IbvDeviceAttr, IbvMr, IbvPortAttr, IbvQpAttr, IbvQpInitAttr, IbvWc, Verbs,
};
use super::{RdmaError, Result};

/// Which device, port and GID to use.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// Device name (e.g. `rxe0`, `mlx5_0`); `None` takes the first one.
    pub name: Option<String>,
    pub port: u8,
    /// GID table index; `None` prefers the IPv4-mapped RoCEv2 GID on Ethernet ports (it routes on IPv4-only
    /// networks) and index 0 otherwise.
    pub gid_index: Option<u8>,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        Self { name: None, port: 1, gid_index: None }
    }
}

pub(super) struct DeviceInner {
    pub verbs: &'static Verbs,
    pub ctx: *mut IbvContext,
    pub pd: *mut c_void,
    pub name: String,
    pub port: u8,
    pub port_attr: IbvPortAttr,
    pub gid_index: u8,
    pub gid: [u8; 16],
    /// Outstanding RDMA READs this side may initiate and accept (device limits).
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    /// Whether `ctx` is this value's to close: false for a context librdmacm opened ([`Device::from_cm_context`]).
    pub owns_ctx: bool,
}

// SAFETY: libibverbs objects may be used from any thread (rdma-core documents the verbs as thread safe); the
// wrapper only reads its plain fields after construction.
unsafe impl Send for DeviceInner {}
// SAFETY: as above; no interior mutability on the Rust side.
unsafe impl Sync for DeviceInner {}

impl Drop for DeviceInner {
    fn drop(&mut self) {
        // SAFETY: pd and ctx were created by open() and every object made from them holds an Arc of self, so
        // none is alive any more; each is released exactly once.
        unsafe {
            (self.verbs.dealloc_pd)(self.pd);
            if self.owns_ctx {
                (self.verbs.close_device)(self.ctx);
            }
        }
    }
}

/// An opened verbs device with one protection domain; cheap to clone.
#[derive(Clone)]
pub struct Device {
    pub(super) inner: Arc<DeviceInner>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.inner.name)
            .field("port", &self.inner.port)
            .field("gid_index", &self.inner.gid_index)
            .finish()
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// Names of the RDMA devices present (empty when there are none).
pub fn list_devices() -> Result<Vec<String>> {
    let verbs = ffi::verbs().map_err(RdmaError::Library)?;
    let (list, n) = device_list(verbs)?;
    let mut names = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: list holds n valid device pointers until free_device_list.
        names.push(device_name(verbs, unsafe { *list.add(i) }));
    }
    // SAFETY: list came from get_device_list and is freed once.
    unsafe { (verbs.free_device_list)(list) };
    Ok(names)
}

fn device_list(verbs: &Verbs) -> Result<(*mut *mut c_void, usize)> {
    let mut n: c_int = 0;
    // SAFETY: n is a valid out-pointer; the returned array is released by the caller.
    let list = unsafe { (verbs.get_device_list)(&mut n) };
    if list.is_null() {
        let e = std::io::Error::from_raw_os_error(errno());
        return Err(RdmaError::NoDevice(format!("ibv_get_device_list: {e} (is the ib_uverbs module loaded?)")));
    }
    Ok((list, usize::try_from(n).unwrap_or(0)))
}

fn device_name(verbs: &Verbs, dev: *mut c_void) -> String {
    // SAFETY: dev is a valid device from the current list; the name is NUL-terminated and owned by the device.
    let name = unsafe { (verbs.get_device_name)(dev) };
    if name.is_null() {
        return String::from("?");
    }
    // SAFETY: non-NULL, NUL-terminated, valid while the list is.
    unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
}

impl Device {
    /// Opens a device, allocates its protection domain and picks the GID; errors (never panics) when libibverbs
    /// or the device is missing or the port is down.
    pub fn open(cfg: &DeviceConfig) -> Result<Self> {
        let verbs = ffi::verbs().map_err(RdmaError::Library)?;
        let (list, n) = device_list(verbs)?;
        let mut chosen = None;
        let mut seen = Vec::new();
        for i in 0..n {
            // SAFETY: list holds n valid device pointers until free_device_list.
            let dev = unsafe { *list.add(i) };
            let name = device_name(verbs, dev);
            if chosen.is_none() && cfg.name.as_deref().is_none_or(|want| want == name) {
                chosen = Some((dev, name.clone()));
            }
            seen.push(name);
        }
        let ctx = chosen.as_ref().map(|(dev, _)| {
            // SAFETY: dev is valid until the list is freed; the opened context does not depend on the list.
            unsafe { (verbs.open_device)(*dev) }
        });
        let open_errno = errno();
        // SAFETY: list came from get_device_list and is freed once, after its last use above.
        unsafe { (verbs.free_device_list)(list) };
        let Some((_, name)) = chosen else {
            return Err(RdmaError::NoDevice(match &cfg.name {
                Some(want) => format!("device {want} not found (present: {seen:?})"),
                None => "no RDMA devices present".to_string(),
            }));
        };
        let ctx = ctx.unwrap_or(std::ptr::null_mut());
        if ctx.is_null() {
            return Err(RdmaError::Verbs { op: "ibv_open_device", errno: open_errno });
        }
        // SAFETY: ctx is a freshly opened context.
        let pd = unsafe { (verbs.alloc_pd)(ctx) };
        if pd.is_null() {
            let e = errno();
            // SAFETY: ctx is open and owns nothing else yet.
            unsafe { (verbs.close_device)(ctx) };
            return Err(RdmaError::Verbs { op: "ibv_alloc_pd", errno: e });
        }
        // From here on DeviceInner's Drop releases pd and ctx on every error path.
        let mut inner = DeviceInner {
            verbs,
            ctx,
            pd,
            name,
            port: cfg.port,
            port_attr: IbvPortAttr::default(),
            gid_index: 0,
            gid: [0; 16],
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            owns_ctx: true,
        };
        finish_open(&mut inner, cfg)?;
        Ok(Self { inner: Arc::new(inner) })
    }

    /// A device over a context librdmacm opened (`rdma_cm_id.verbs`): its own protection domain on that context,
    /// which is not closed when the device goes (librdmacm owns it).
    ///
    /// # Safety
    /// `ctx` must be an open verbs context that stays open for the life of the process (librdmacm keeps the
    /// contexts of every device it found open until it is unloaded, which never happens here).
    pub(super) unsafe fn from_cm_context(ctx: *mut IbvContext, port: u8) -> Result<Self> {
        let verbs = ffi::verbs().map_err(RdmaError::Library)?;
        // SAFETY: the caller guarantees ctx is open.
        let pd = unsafe { (verbs.alloc_pd)(ctx) };
        if pd.is_null() {
            return Err(RdmaError::Verbs { op: "ibv_alloc_pd", errno: errno() });
        }
        // SAFETY: ctx is open; device is set by libibverbs on every context.
        let name = device_name(verbs, unsafe { (*ctx).device });
        let mut inner = DeviceInner {
            verbs,
            ctx,
            pd,
            name,
            port,
            port_attr: IbvPortAttr::default(),
            gid_index: 0,
            gid: [0; 16],
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            owns_ctx: false,
        };
        finish_open(&mut inner, &DeviceConfig { port, ..DeviceConfig::default() })?;
        Ok(Self { inner: Arc::new(inner) })
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The GID this device's endpoints are addressed by.
    pub fn gid(&self) -> [u8; 16] {
        self.inner.gid
    }
}

/// Queries the device limits, the port and the GID of a device whose context and PD are open.
fn finish_open(inner: &mut DeviceInner, cfg: &DeviceConfig) -> Result<()> {
    let (verbs, ctx) = (inner.verbs, inner.ctx);
    {
        let mut dev_attr = IbvDeviceAttr { raw: [0; 232] };
        // SAFETY: ctx is open; dev_attr is a writable buffer of sizeof(struct ibv_device_attr).
        let rc = unsafe { (verbs.query_device)(ctx, &mut dev_attr) };
        if rc != 0 {
            return Err(RdmaError::Verbs { op: "ibv_query_device", errno: rc });
        }
        let int_at = |o: usize| {
            i32::from_ne_bytes([dev_attr.raw[o], dev_attr.raw[o + 1], dev_attr.raw[o + 2], dev_attr.raw[o + 3]])
        };
        // Cap at 16: enough READs in flight to cover a transfer unit pipeline, and a sane bound for the SQ.
        let clamp = |v: i32| u8::try_from(v.clamp(1, 16)).unwrap_or(1);
        inner.max_rd_atomic = clamp(int_at(ffi::DEVICE_ATTR_MAX_QP_INIT_RD_ATOM_OFFSET));
        inner.max_dest_rd_atomic = clamp(int_at(ffi::DEVICE_ATTR_MAX_QP_RD_ATOM_OFFSET));
        // SAFETY: ctx is open; port_attr is a zeroed struct ibv_port_attr (the exported call fills its prefix).
        let rc = unsafe { (verbs.query_port)(ctx, cfg.port, &mut inner.port_attr) };
        if rc != 0 {
            return Err(RdmaError::Verbs { op: "ibv_query_port", errno: rc });
        }
        if inner.port_attr.state != ffi::IBV_PORT_ACTIVE {
            return Err(RdmaError::NoDevice(format!(
                "port {} of {} is not active (state {})",
                cfg.port, inner.name, inner.port_attr.state
            )));
        }
        let (gid_index, gid) = pick_gid(inner, cfg.gid_index)?;
        inner.gid_index = gid_index;
        inner.gid = gid;
    }
    Ok(())
}

fn query_gid(inner: &DeviceInner, index: u8) -> Option<[u8; 16]> {
    let mut gid = [0u8; 16];
    // SAFETY: ctx is open; gid is a 16-byte union ibv_gid.
    let rc = unsafe { (inner.verbs.query_gid)(inner.ctx, inner.port, c_int::from(index), &mut gid) };
    (rc == 0).then_some(gid)
}

fn pick_gid(inner: &DeviceInner, wanted: Option<u8>) -> Result<(u8, [u8; 16])> {
    if let Some(index) = wanted {
        return query_gid(inner, index).map(|g| (index, g)).ok_or_else(|| {
            RdmaError::NoDevice(format!("GID index {index} of {} port {} is not valid", inner.name, inner.port))
        });
    }
    if inner.port_attr.link_layer != ffi::IBV_LINK_LAYER_ETHERNET {
        return Ok((0, query_gid(inner, 0).unwrap_or([0; 16])));
    }
    let len = u8::try_from(inner.port_attr.gid_tbl_len.clamp(0, 255)).unwrap_or(0);
    let mut first_valid = None;
    for index in 0..len {
        let Some(gid) = query_gid(inner, index) else { continue };
        if gid == [0; 16] {
            continue;
        }
        if gid[..10] == [0; 10] && gid[10..12] == [0xff, 0xff] {
            return Ok((index, gid));
        }
        first_valid.get_or_insert((index, gid));
    }
    first_valid.ok_or_else(|| {
        RdmaError::NoDevice(format!("{} port {} has no GID (does its netdev have an address?)", inner.name, inner.port))
    })
}

/// A region a peer advertised: its address, length and rkey. Also what a chunk of a request names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteRegion {
    pub addr: u64,
    pub len: u64,
    pub rkey: u32,
}

impl RemoteRegion {
    pub const ENCODED_BYTES: usize = 20;

    /// True when `chunk` lies entirely inside this region and uses its rkey: the check a server makes before it
    /// touches a client's memory.
    pub fn contains(&self, chunk: &RemoteRegion) -> bool {
        chunk.rkey == self.rkey
            && chunk.addr >= self.addr
            && chunk.addr.checked_add(chunk.len).is_some_and(|end| end <= self.addr.saturating_add(self.len))
    }

    /// The sub-range `offset..offset + len` of this region.
    pub fn slice(&self, offset: u64, len: u64) -> Result<RemoteRegion> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(RemoteRegion { addr: self.addr + offset, len, rkey: self.rkey }),
            _ => Err(RdmaError::OutOfBounds { what: "remote slice", offset, len, region_len: self.len }),
        }
    }

    pub fn encode(&self) -> [u8; Self::ENCODED_BYTES] {
        let mut b = [0u8; Self::ENCODED_BYTES];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self> {
        let b: &[u8; Self::ENCODED_BYTES] = b
            .get(..Self::ENCODED_BYTES)
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| RdmaError::Protocol(format!("region descriptor shorter than {}", Self::ENCODED_BYTES)))?;
        let region = Self {
            addr: u64::from_le_bytes(b[0..8].try_into().unwrap_or_default()),
            len: u64::from_le_bytes(b[8..16].try_into().unwrap_or_default()),
            rkey: u32::from_le_bytes(b[16..20].try_into().unwrap_or_default()),
        };
        if region.addr.checked_add(region.len).is_none() {
            return Err(RdmaError::Protocol(format!("region {:#x}+{} wraps", region.addr, region.len)));
        }
        Ok(region)
    }
}

/// A page-aligned buffer, pre-faulted and registered once with the device's PD.
///
/// The peer may read or write it (per the access given at registration) at any moment while it is advertised;
/// callers look at its bytes only after the message that orders the transfer (a reply, a completion).
pub struct MemoryRegion {
    pub(super) dev: Arc<DeviceInner>,
    mr: *mut IbvMr,
    ptr: *mut u8,
    len: usize,
    /// The mapping is this value's (made by [`MemoryRegion::new`]) and is unmapped on drop; false for memory
    /// registered with [`MemoryRegion::register_external`], which belongs to someone else.
    owned: bool,
}

// SAFETY: the buffer is owned by this value and the MR handle is thread-safe (see DeviceInner).
unsafe impl Send for MemoryRegion {}
// SAFETY: shared access only hands out &[u8]; mutation needs &mut self.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// Maps `len` bytes, touches them (first touch of memory is slow; do it before the data path) and registers
    /// them for local writes plus the remote access asked for.
    pub fn new(dev: &Device, len: usize, remote_read: bool, remote_write: bool) -> Result<Self> {
        if len == 0 {
            return Err(RdmaError::OutOfBounds { what: "memory region", offset: 0, len: 0, region_len: 0 });
        }
        // SAFETY: anonymous private mapping of len bytes; MAP_POPULATE pre-faults it. Checked for MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(RdmaError::Verbs { op: "mmap", errno: errno() });
        }
        let mut access = ffi::IBV_ACCESS_LOCAL_WRITE;
        if remote_read {
            access |= ffi::IBV_ACCESS_REMOTE_READ;
        }
        if remote_write {
            access |= ffi::IBV_ACCESS_REMOTE_WRITE;
        }
        let inner = &dev.inner;
        // SAFETY: pd is live (held by the Arc); ptr..ptr+len is a mapping this value owns until Drop, which
        // deregisters before unmapping.
        let mr = unsafe { (inner.verbs.reg_mr)(inner.pd, ptr, len, access) };
        if mr.is_null() {
            let e = errno();
            // SAFETY: unmapping the mapping made above, never registered.
            unsafe { libc::munmap(ptr, len) };
            return Err(RdmaError::Verbs { op: "ibv_reg_mr", errno: e });
        }
        Ok(Self { dev: Arc::clone(inner), mr, ptr: ptr.cast(), len, owned: true })
    }

    /// Registers memory this value does not own (a server zone, a client's arena or I/O buffer) for local writes,
    /// and with `remote` for remote read and write too (a client's memory, which the server reaches; never a
    /// server's, since only the server initiates transfers). The pages are pinned while registered, so a late transfer lands in them and
    /// never in memory reused since; dropping the value deregisters and leaves the memory alone.
    ///
    /// # Safety
    /// `[ptr, ptr + len)` must be mapped now, and nothing may rely on its contents staying unchanged by the
    /// peer while the registration is advertised: the caller hands the range out only for transfers it orders.
    /// The Rust accessors ([`MemoryRegion::as_slice`], [`MemoryRegion::as_mut_slice`]) must not be used on an
    /// external region (they would alias the owner's references); only its address and keys are.
    pub unsafe fn register_external(dev: &Device, ptr: *mut u8, len: usize, remote: bool) -> Result<Self> {
        if len == 0 || ptr.is_null() {
            return Err(RdmaError::OutOfBounds { what: "memory region", offset: ptr as u64, len: 0, region_len: 0 });
        }
        let mut access = ffi::IBV_ACCESS_LOCAL_WRITE;
        if remote {
            access |= ffi::IBV_ACCESS_REMOTE_READ | ffi::IBV_ACCESS_REMOTE_WRITE;
        }
        let inner = &dev.inner;
        // SAFETY: pd is live (held by the Arc); the caller guarantees the range is mapped; ibv_reg_mr pins it.
        let mr = unsafe { (inner.verbs.reg_mr)(inner.pd, ptr.cast(), len, access) };
        if mr.is_null() {
            return Err(RdmaError::Verbs { op: "ibv_reg_mr", errno: errno() });
        }
        Ok(Self { dev: Arc::clone(inner), mr, ptr, len, owned: false })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len is a live mapping owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self gives exclusive access on the Rust side.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }

    pub fn lkey(&self) -> u32 {
        // SAFETY: mr is live until Drop.
        unsafe { (*self.mr).lkey }
    }

    pub fn rkey(&self) -> u32 {
        // SAFETY: mr is live until Drop.
        unsafe { (*self.mr).rkey }
    }

    /// The descriptor to advertise to a peer.
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion { addr: self.addr(), len: self.len as u64, rkey: self.rkey() }
    }

    /// Checks `offset..offset + len` against the region.
    pub(super) fn check(&self, what: &'static str, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(RdmaError::OutOfBounds {
                what,
                offset: offset as u64,
                len: len as u64,
                region_len: self.len as u64,
            }),
        }
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: mr (and, when owned, the mapping) belong to self and are released once, the MR first so the
        // device stops referencing the pages before they go away.
        unsafe {
            (self.dev.verbs.dereg_mr)(self.mr);
            if self.owned {
                libc::munmap(self.ptr.cast(), self.len);
            }
        }
    }
}

/// Other descriptors a completion-channel wait may also watch.
pub(super) const EXTRA_FDS_MAX: usize = 2;

/// A completion channel: CQs bound to it signal armed completions as readable data on its fd, so a waiter can
/// sleep (or hand the fd to an event loop) instead of spinning.
pub(super) struct CompChannel {
    dev: Arc<DeviceInner>,
    ptr: *mut IbvCompChannel,
}

// SAFETY: see DeviceInner.
unsafe impl Send for CompChannel {}

impl CompChannel {
    pub fn new(dev: &Arc<DeviceInner>) -> Result<Self> {
        // SAFETY: ctx is live.
        let ptr = unsafe { (dev.verbs.create_comp_channel)(dev.ctx) };
        if ptr.is_null() {
            return Err(RdmaError::Verbs { op: "ibv_create_comp_channel", errno: errno() });
        }
        Ok(Self { dev: Arc::clone(dev), ptr })
    }

    pub fn fd(&self) -> RawFd {
        // SAFETY: the channel is live until Drop.
        unsafe { (*self.ptr).fd }
    }

    /// Sleeps until a completion event arrives, one of `extra` is readable (or hung up), or `timeout` passes;
    /// returns the CQ the event was for (already acknowledged, and disarmed: notifications are one-shot), if one
    /// came, and which of `extra` are ready. A signal ends the sleep early with nothing ready.
    pub fn wait_with(
        &self,
        extra: &[RawFd],
        timeout: Duration,
    ) -> Result<(Option<*mut c_void>, [bool; EXTRA_FDS_MAX])> {
        assert!(extra.len() <= EXTRA_FDS_MAX, "{} extra fds, at most {EXTRA_FDS_MAX}", extra.len());
        let idle = libc::pollfd { fd: -1, events: 0, revents: 0 }; // poll(2) skips negative fds
        let mut pfds = [idle; 1 + EXTRA_FDS_MAX];
        pfds[0] = libc::pollfd { fd: self.fd(), events: libc::POLLIN, revents: 0 };
        for (p, &fd) in pfds[1..].iter_mut().zip(extra) {
            *p = libc::pollfd { fd, events: libc::POLLIN | libc::POLLRDHUP, revents: 0 };
        }
        let timeout_ms = c_int::try_from(timeout.as_millis().max(1)).unwrap_or(c_int::MAX);
        // SAFETY: pfds is a valid array of pfds.len() pollfds for the duration of the call.
        let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout_ms) };
        let mut ready = [false; EXTRA_FDS_MAX];
        if n < 0 {
            let e = errno();
            return if e == libc::EINTR {
                Ok((None, ready))
            } else {
                Err(RdmaError::Verbs { op: "poll(completion channel)", errno: e })
            };
        }
        for (r, p) in ready.iter_mut().zip(&pfds[1..]) {
            *r = p.revents != 0;
        }
        if pfds[0].revents & libc::POLLIN == 0 {
            return Ok((None, ready));
        }
        let mut cq: *mut c_void = std::ptr::null_mut();
        let mut cq_context: *mut c_void = std::ptr::null_mut();
        // SAFETY: the channel is live and readable, so this does not block; both out-pointers are valid.
        let rc = unsafe { (self.dev.verbs.get_cq_event)(self.ptr, &mut cq, &mut cq_context) };
        if rc != 0 {
            return Err(RdmaError::Verbs { op: "ibv_get_cq_event", errno: errno() });
        }
        // SAFETY: cq is the live CQ the event was for; acknowledged at once (ibv_destroy_cq waits for acks).
        unsafe { (self.dev.verbs.ack_cq_events)(cq, 1) };
        Ok((Some(cq), ready))
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // SAFETY: every CQ bound to the channel is destroyed first (Endpoint field order); released once.
        unsafe { (self.dev.verbs.destroy_comp_channel)(self.ptr) };
    }
}

/// A completion queue, polled, optionally bound to a completion channel.
pub(super) struct Cq {
    dev: Arc<DeviceInner>,
    pub ptr: *mut c_void,
}

// SAFETY: see DeviceInner.
unsafe impl Send for Cq {}

impl Cq {
    pub fn new(dev: &Arc<DeviceInner>, entries: u32, channel: Option<&CompChannel>) -> Result<Self> {
        let entries = c_int::try_from(entries).unwrap_or(c_int::MAX);
        let channel = channel.map_or(std::ptr::null_mut(), |c| c.ptr.cast::<c_void>());
        // SAFETY: ctx is live; channel is NULL or a live channel of the same context that outlives the CQ.
        let ptr = unsafe { (dev.verbs.create_cq)(dev.ctx, entries, std::ptr::null_mut(), channel, 0) };
        if ptr.is_null() {
            return Err(RdmaError::Verbs { op: "ibv_create_cq", errno: errno() });
        }
        Ok(Self { dev: Arc::clone(dev), ptr })
    }

    /// Asks for one event on the CQ's channel at the next completion.
    pub fn arm(&self) -> Result<()> {
        // SAFETY: this CQ was created on dev.ctx and is live until Drop.
        let rc = unsafe { self.dev.verbs.req_notify_cq(self.dev.ctx, self.ptr) };
        if rc != 0 {
            return Err(RdmaError::Verbs { op: "ibv_req_notify_cq", errno: rc });
        }
        Ok(())
    }

    /// Fills `wc` with up to its length of completions; returns how many.
    pub fn poll(&self, wc: &mut [IbvWc]) -> Result<usize> {
        // SAFETY: this CQ was created on dev.ctx and is live until Drop.
        let n = unsafe { self.dev.verbs.poll_cq(self.dev.ctx, self.ptr, wc) };
        usize::try_from(n).map_err(|_| RdmaError::Verbs { op: "ibv_poll_cq", errno: -n })
    }

    pub fn status_text(&self, status: u32) -> String {
        // SAFETY: ibv_wc_status_str returns a static string for any value.
        let s = unsafe { (self.dev.verbs.wc_status_str)(status) };
        if s.is_null() {
            return format!("status {status}");
        }
        // SAFETY: non-NULL static NUL-terminated string.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: the QP using this CQ is destroyed first (Endpoint field order); released once.
        unsafe { (self.dev.verbs.destroy_cq)(self.ptr) };
    }
}

/// An RC queue pair.
pub(super) struct Qp {
    dev: Arc<DeviceInner>,
    pub ptr: *mut c_void,
    pub qpn: u32,
}

// SAFETY: see DeviceInner.
unsafe impl Send for Qp {}

impl Qp {
    pub fn new_rc(dev: &Arc<DeviceInner>, send_cq: &Cq, recv_cq: &Cq, send_wr: u32, recv_wr: u32) -> Result<Self> {
        let mut attr = IbvQpInitAttr {
            qp_context: std::ptr::null_mut(),
            send_cq: send_cq.ptr,
            recv_cq: recv_cq.ptr,
            srq: std::ptr::null_mut(),
            cap: ffi::IbvQpCap {
                max_send_wr: send_wr,
                max_recv_wr: recv_wr,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ffi::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: pd and both CQs are live; attr is a valid ibv_qp_init_attr.
        let ptr = unsafe { (dev.verbs.create_qp)(dev.pd, &mut attr) };
        if ptr.is_null() {
            return Err(RdmaError::Verbs { op: "ibv_create_qp", errno: errno() });
        }
        // SAFETY: ptr is a live struct ibv_qp whose head IbvQpHead describes.
        let qpn = unsafe { (*ptr.cast::<ffi::IbvQpHead>()).qp_num };
        Ok(Self { dev: Arc::clone(dev), ptr, qpn })
    }

    pub fn modify(&self, attr: &mut IbvQpAttr, mask: c_int, op: &'static str) -> Result<()> {
        // SAFETY: the QP is live; attr is a full struct ibv_qp_attr.
        let rc = unsafe { (self.dev.verbs.modify_qp)(self.ptr, attr, mask) };
        if rc != 0 {
            return Err(RdmaError::Verbs { op, errno: rc });
        }
        Ok(())
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: the QP is owned by self and destroyed once, before its CQs (Endpoint field order).
        unsafe { (self.dev.verbs.destroy_qp)(self.ptr) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REGION: RemoteRegion = RemoteRegion { addr: 0x1000, len: 0x2000, rkey: 7 };

    #[test]
    fn contains_checks_bounds_and_rkey() {
        assert!(REGION.contains(&REGION));
        assert!(REGION.contains(&RemoteRegion { addr: 0x2000, len: 0x1000, rkey: 7 }));
        assert!(!REGION.contains(&RemoteRegion { addr: 0x2000, len: 0x1001, rkey: 7 }), "runs past the end");
        assert!(!REGION.contains(&RemoteRegion { addr: 0xfff, len: 1, rkey: 7 }), "starts before");
        assert!(!REGION.contains(&RemoteRegion { addr: 0x1000, len: 1, rkey: 8 }), "other rkey");
        assert!(!REGION.contains(&RemoteRegion { addr: u64::MAX, len: 2, rkey: 7 }), "wraps");
    }

    #[test]
    fn slice_stays_inside() {
        assert_eq!(REGION.slice(0x1000, 0x1000).unwrap(), RemoteRegion { addr: 0x2000, len: 0x1000, rkey: 7 });
        assert!(REGION.slice(0x1000, 0x1001).is_err());
        assert!(REGION.slice(u64::MAX, 2).is_err());
    }

    #[test]
    fn descriptor_round_trips_and_rejects_bad_input() {
        assert_eq!(RemoteRegion::decode(&REGION.encode()).unwrap(), REGION);
        assert!(RemoteRegion::decode(&REGION.encode()[..19]).is_err());
        let wrapping = RemoteRegion { addr: u64::MAX, len: 2, rkey: 1 }.encode();
        assert!(RemoteRegion::decode(&wrapping).is_err());
    }
}
