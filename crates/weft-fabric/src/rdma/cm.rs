//! RDMA CM (librdmacm, loaded with `dlopen` as libibverbs is): the passive side of the connection manager, which
//! NFS over RDMA uses (the Linux client connects to port 20049 with `rdma_connect`). Weft's own fabric swaps queue
//! pair numbers over a TCP side channel instead; a kernel client speaks only CM.
//!
//! [`CmListener`] binds and listens; [`CmListener::next_request`] returns each connect request as a
//! [`CmRequest`] (the client's private data, its address, a [`Device`] over the context librdmacm opened for
//! it) on a connection-own event channel; [`CmRequest::into_conn`] creates the RC queue pair and one completion
//! queue, the caller posts its receives and then [`CmConn::accept`]s. [`CmConn`] posts sends, receives, RDMA READs
//! and RDMA WRITEs from registered memory and waits for completions; nothing here registers memory per call.
//!
//! Layouts of `rdma_cm_id`, `rdma_cm_event` and `rdma_conn_param` are from rdma-core 44's `rdma_cma.h` (x86_64);
//! the const assertions pin the offsets this code reads.

use std::ffi::{CStr, c_int, c_uint, c_void};
use std::mem::{offset_of, size_of};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use super::ffi::{self, IbvContext, IbvQpCap, IbvQpInitAttr, IbvRecvWr, IbvSendWr, IbvSge, IbvWc};
use super::verbs::{CompChannel, Cq, Device, MemoryRegion};
use super::{RdmaError, Result};

const RDMA_PS_TCP: c_uint = 0x0106;
pub const EVENT_CONNECT_REQUEST: u32 = 4;
pub const EVENT_ESTABLISHED: u32 = 9;
pub const EVENT_DISCONNECTED: u32 = 10;

#[repr(C)]
struct EventChannel {
    fd: c_int,
}

/// The head of `struct rdma_cm_id` up to the route's two addresses (`sockaddr_storage` each).
#[repr(C)]
struct CmId {
    verbs: *mut IbvContext,
    channel: *mut EventChannel,
    context: *mut c_void,
    qp: *mut c_void,
    src_addr: [u64; 16],
    dst_addr: [u64; 16],
}

#[repr(C)]
#[derive(Clone, Copy)]
struct ConnParam {
    private_data: *const c_void,
    private_data_len: u8,
    responder_resources: u8,
    initiator_depth: u8,
    flow_control: u8,
    retry_count: u8,
    rnr_retry_count: u8,
    srq: u8,
    qp_num: u32,
}

#[repr(C)]
struct CmEvent {
    id: *mut CmId,
    listen_id: *mut CmId,
    event: c_uint,
    status: c_int,
    conn: ConnParam,
}

const _: () = {
    assert!(offset_of!(CmId, qp) == 24);
    assert!(offset_of!(CmId, dst_addr) == 160);
    assert!(size_of::<ConnParam>() == 24);
    assert!(offset_of!(ConnParam, qp_num) == 16);
    assert!(offset_of!(CmEvent, event) == 16);
    assert!(offset_of!(CmEvent, conn) == 24);
};

type CreateEventChannelFn = unsafe extern "C" fn() -> *mut EventChannel;
type DestroyEventChannelFn = unsafe extern "C" fn(*mut EventChannel);
type CreateIdFn = unsafe extern "C" fn(*mut EventChannel, *mut *mut CmId, *mut c_void, c_uint) -> c_int;
type IdFn = unsafe extern "C" fn(*mut CmId) -> c_int;
type DestroyQpFn = unsafe extern "C" fn(*mut CmId);
type BindAddrFn = unsafe extern "C" fn(*mut CmId, *const libc::sockaddr) -> c_int;
type ListenFn = unsafe extern "C" fn(*mut CmId, c_int) -> c_int;
type GetEventFn = unsafe extern "C" fn(*mut EventChannel, *mut *mut CmEvent) -> c_int;
type AckEventFn = unsafe extern "C" fn(*mut CmEvent) -> c_int;
type CreateQpFn = unsafe extern "C" fn(*mut CmId, *mut c_void, *mut IbvQpInitAttr) -> c_int;
type AcceptFn = unsafe extern "C" fn(*mut CmId, *mut ConnParam) -> c_int;
type RejectFn = unsafe extern "C" fn(*mut CmId, *const c_void, u8) -> c_int;
type MigrateIdFn = unsafe extern "C" fn(*mut CmId, *mut EventChannel) -> c_int;
type ResolveAddrFn = unsafe extern "C" fn(*mut CmId, *const libc::sockaddr, *const libc::sockaddr, c_int) -> c_int;
type ResolveRouteFn = unsafe extern "C" fn(*mut CmId, c_int) -> c_int;
type ConnectFn = unsafe extern "C" fn(*mut CmId, *mut ConnParam) -> c_int;

struct Cm {
    create_event_channel: CreateEventChannelFn,
    destroy_event_channel: DestroyEventChannelFn,
    create_id: CreateIdFn,
    destroy_id: IdFn,
    bind_addr: BindAddrFn,
    listen: ListenFn,
    get_cm_event: GetEventFn,
    ack_cm_event: AckEventFn,
    create_qp: CreateQpFn,
    destroy_qp: DestroyQpFn,
    accept: AcceptFn,
    reject: RejectFn,
    disconnect: IdFn,
    migrate_id: MigrateIdFn,
    resolve_addr: ResolveAddrFn,
    resolve_route: ResolveRouteFn,
    connect: ConnectFn,
}

const LIBRARY: &CStr = c"librdmacm.so.1";

fn cm() -> Result<&'static Cm> {
    static CM: OnceLock<std::result::Result<Cm, String>> = OnceLock::new();
    CM.get_or_init(load).as_ref().map_err(|e| RdmaError::Library(e.clone()))
}

fn load() -> std::result::Result<Cm, String> {
    // libibverbs first: librdmacm needs it, and its error is the clearer one.
    ffi::verbs()?;
    // SAFETY: dlopen with a valid NUL-terminated name; never closed, so the symbols stay valid (static table).
    let handle = unsafe { libc::dlopen(LIBRARY.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(format!("cannot load {} (install rdma-core's librdmacm1)", LIBRARY.to_string_lossy()));
    }
    macro_rules! sym {
        ($name:literal, $ty:ty) => {{
            let name: &CStr = $name;
            // SAFETY: valid handle and NUL-terminated name.
            let ptr = unsafe { libc::dlsym(handle, name.as_ptr()) };
            if ptr.is_null() {
                return Err(format!("librdmacm lacks {}", name.to_string_lossy()));
            }
            // SAFETY: the symbol is the librdmacm function of that name and the type its prototype in rdma_cma.h;
            // data and function pointers have the same size on every platform librdmacm supports.
            unsafe { std::mem::transmute::<*mut c_void, $ty>(ptr) }
        }};
    }
    Ok(Cm {
        create_event_channel: sym!(c"rdma_create_event_channel", CreateEventChannelFn),
        destroy_event_channel: sym!(c"rdma_destroy_event_channel", DestroyEventChannelFn),
        create_id: sym!(c"rdma_create_id", CreateIdFn),
        destroy_id: sym!(c"rdma_destroy_id", IdFn),
        bind_addr: sym!(c"rdma_bind_addr", BindAddrFn),
        listen: sym!(c"rdma_listen", ListenFn),
        get_cm_event: sym!(c"rdma_get_cm_event", GetEventFn),
        ack_cm_event: sym!(c"rdma_ack_cm_event", AckEventFn),
        create_qp: sym!(c"rdma_create_qp", CreateQpFn),
        destroy_qp: sym!(c"rdma_destroy_qp", DestroyQpFn),
        accept: sym!(c"rdma_accept", AcceptFn),
        reject: sym!(c"rdma_reject", RejectFn),
        disconnect: sym!(c"rdma_disconnect", IdFn),
        migrate_id: sym!(c"rdma_migrate_id", MigrateIdFn),
        resolve_addr: sym!(c"rdma_resolve_addr", ResolveAddrFn),
        resolve_route: sym!(c"rdma_resolve_route", ResolveRouteFn),
        connect: sym!(c"rdma_connect", ConnectFn),
    })
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

fn check(rc: c_int, op: &'static str) -> Result<()> {
    if rc != 0 { Err(RdmaError::Verbs { op, errno: errno() }) } else { Ok(()) }
}

/// An event channel, destroyed on drop (after every id on it).
struct Channel {
    cm: &'static Cm,
    ptr: *mut EventChannel,
}

impl Channel {
    fn new(cm: &'static Cm) -> Result<Self> {
        // SAFETY: no arguments; checked for NULL.
        let ptr = unsafe { (cm.create_event_channel)() };
        if ptr.is_null() {
            return Err(RdmaError::Verbs { op: "rdma_create_event_channel", errno: errno() });
        }
        Ok(Channel { cm, ptr })
    }

    /// The next event, copied out and acknowledged: (event, status, its id, the connect parameters and private
    /// data of a connect request).
    fn next(&self) -> Result<(u32, i32, *mut CmId, ConnParam, Vec<u8>)> {
        let mut ev: *mut CmEvent = std::ptr::null_mut();
        // SAFETY: the channel is live; ev is a valid out-pointer. Blocks until an event comes.
        check(unsafe { (self.cm.get_cm_event)(self.ptr, &mut ev) }, "rdma_get_cm_event")?;
        // SAFETY: ev is a live event until acknowledged below; its private data (if any) is private_data_len bytes.
        let out = unsafe {
            let e = &*ev;
            let pd = if e.conn.private_data.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(e.conn.private_data.cast::<u8>(), e.conn.private_data_len as usize).to_vec()
            };
            (e.event, e.status, e.id, e.conn, pd)
        };
        // SAFETY: acknowledged once, after its last use.
        unsafe { (self.cm.ack_cm_event)(ev) };
        Ok(out)
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: every id on the channel was destroyed or migrated first (field order of the owners).
        unsafe { (self.cm.destroy_event_channel)(self.ptr) };
    }
}

// SAFETY: librdmacm objects may be used from any thread; each is used by one owner at a time.
unsafe impl Send for Channel {}

/// A listening CM id on its own event channel.
pub struct CmListener {
    id: *mut CmId,
    chan: Channel,
    /// Devices by librdmacm context, made once each (a device per connection would mean a PD per connection).
    devices: Mutex<Vec<(usize, Device)>>,
}

// SAFETY: see Channel; the listener's id is only used by the thread calling next_request.
unsafe impl Send for CmListener {}

impl std::fmt::Debug for CmListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmListener").finish_non_exhaustive()
    }
}

fn sockaddr_of(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid (AF_UNSPEC) value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from(*a.ip()).to_be() },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in and suitably aligned.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

fn addr_from(raw: &[u64; 16]) -> Option<SocketAddr> {
    let b: Vec<u8> = raw.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let family = u16::from_ne_bytes([b[0], b[1]]) as c_int;
    let port = u16::from_be_bytes([b[2], b[3]]);
    match family {
        libc::AF_INET => Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::new(b[4], b[5], b[6], b[7])), port)),
        libc::AF_INET6 => {
            let o: [u8; 16] = b[8..24].try_into().ok()?;
            Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(o)), port))
        }
        _ => None,
    }
}

impl CmListener {
    /// Binds `addr` (port 20049 for NFS) and listens with `backlog` pending requests.
    pub fn bind(addr: SocketAddr, backlog: u32) -> Result<Self> {
        let cm = cm()?;
        let chan = Channel::new(cm)?;
        let mut id: *mut CmId = std::ptr::null_mut();
        // SAFETY: the channel is live; id is a valid out-pointer.
        check(unsafe { (cm.create_id)(chan.ptr, &mut id, std::ptr::null_mut(), RDMA_PS_TCP) }, "rdma_create_id")?;
        let me = CmListener { id, chan, devices: Mutex::new(Vec::new()) };
        let (ss, _) = sockaddr_of(addr);
        // SAFETY: id is live; ss holds a sockaddr of the family it names.
        check(unsafe { (cm.bind_addr)(me.id, (&ss as *const libc::sockaddr_storage).cast()) }, "rdma_bind_addr")
            .map_err(|e| match e {
                RdmaError::Verbs { errno, .. } if errno == libc::ENODEV || errno == libc::EADDRNOTAVAIL => {
                    RdmaError::NoDevice(format!("no RDMA device serves {addr}"))
                }
                e => e,
            })?;
        let backlog = c_int::try_from(backlog).unwrap_or(c_int::MAX);
        // SAFETY: id is live and bound.
        check(unsafe { (cm.listen)(me.id, backlog) }, "rdma_listen")?;
        Ok(me)
    }

    /// Blocks until the next connect request; other events on the listener are skipped.
    pub fn next_request(&self) -> Result<CmRequest> {
        let cm = cm()?;
        loop {
            let (event, status, id, conn, private_data) = self.chan.next()?;
            if event != EVENT_CONNECT_REQUEST {
                tracing::debug!(event, status, "rdma cm: listener event skipped");
                continue;
            }
            let chan = Channel::new(cm)?;
            // The connection's later events (established, disconnected) go to its own channel and thread.
            // SAFETY: id is the new request's id, live and not yet destroyed; chan is live.
            if let Err(e) = check(unsafe { (cm.migrate_id)(id, chan.ptr) }, "rdma_migrate_id") {
                // SAFETY: rejecting and destroying the request's id once.
                unsafe {
                    (cm.reject)(id, std::ptr::null(), 0);
                    (cm.destroy_id)(id);
                }
                return Err(e);
            }
            // SAFETY: id is live; verbs is the context librdmacm opened for the device the request came on, and
            // dst_addr is the peer's sockaddr.
            let (ctx, peer) = unsafe { ((*id).verbs, addr_from(&(*id).dst_addr)) };
            let dev = match self.device(ctx) {
                Ok(d) => d,
                Err(e) => {
                    // SAFETY: as above.
                    unsafe {
                        (cm.reject)(id, std::ptr::null(), 0);
                        (cm.destroy_id)(id);
                    }
                    return Err(e);
                }
            };
            return Ok(CmRequest {
                id,
                chan: Some(chan),
                dev,
                peer: peer.unwrap_or(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)),
                private_data,
                initiator_depth: conn.initiator_depth,
                responder_resources: conn.responder_resources,
            });
        }
    }

    fn device(&self, ctx: *mut IbvContext) -> Result<Device> {
        let mut devs = self.devices.lock().expect("devices");
        if let Some((_, d)) = devs.iter().find(|(c, _)| *c == ctx as usize) {
            return Ok(d.clone());
        }
        // SAFETY: librdmacm keeps the contexts it opened open while loaded, and it is never unloaded.
        let d = unsafe { Device::from_cm_context(ctx, 1)? };
        devs.push((ctx as usize, d.clone()));
        Ok(d)
    }
}

impl Drop for CmListener {
    fn drop(&mut self) {
        // SAFETY: the listener's id is destroyed once, before its channel (a field dropped after this).
        unsafe { (self.chan.cm.destroy_id)(self.id) };
    }
}

/// A connect request not yet accepted; dropping it rejects the request.
pub struct CmRequest {
    id: *mut CmId,
    chan: Option<Channel>,
    pub dev: Device,
    pub peer: SocketAddr,
    /// The client's private data (RFC 8797 for NFS), as sent.
    pub private_data: Vec<u8>,
    pub initiator_depth: u8,
    pub responder_resources: u8,
}

// SAFETY: see Channel.
unsafe impl Send for CmRequest {}

impl CmRequest {
    /// Creates the RC queue pair (one completion queue for sends and receives, on a completion channel).
    pub fn into_conn(mut self, send_wr: u32, recv_wr: u32, send_sge: u32) -> Result<CmConn> {
        let cm = cm()?;
        let inner = Arc::clone(&self.dev.inner);
        let channel = CompChannel::new(&inner)?;
        let cq = Cq::new(&inner, send_wr + recv_wr, Some(&channel))?;
        let mut attr = IbvQpInitAttr {
            qp_context: std::ptr::null_mut(),
            send_cq: cq.ptr,
            recv_cq: cq.ptr,
            srq: std::ptr::null_mut(),
            cap: IbvQpCap {
                max_send_wr: send_wr,
                max_recv_wr: recv_wr,
                max_send_sge: send_sge,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ffi::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: id is live; pd belongs to id->verbs (the device was made from that context); cq is live.
        check(unsafe { (cm.create_qp)(self.id, inner.pd, &mut attr) }, "rdma_create_qp")?;
        // SAFETY: rdma_create_qp succeeded, so id->qp is the new QP.
        let qp = unsafe { (*self.id).qp };
        let id = std::mem::replace(&mut self.id, std::ptr::null_mut());
        let chan = self.chan.take().expect("a request has its channel");
        Ok(CmConn {
            cm,
            id,
            qp,
            cq,
            comp: channel,
            chan,
            dev: self.dev.clone(),
            peer: self.peer,
            max_rd_atomic: inner.max_rd_atomic,
            max_dest_rd_atomic: inner.max_dest_rd_atomic,
            requested: (self.initiator_depth, self.responder_resources),
            established: false,
        })
    }
}

impl Drop for CmRequest {
    fn drop(&mut self) {
        if self.id.is_null() {
            return;
        }
        let cm = self.chan.as_ref().expect("channel").cm;
        // SAFETY: a request never turned into a connection: rejected and destroyed once, before its channel.
        unsafe {
            (cm.reject)(self.id, std::ptr::null(), 0);
            (cm.destroy_id)(self.id);
        }
    }
}

/// Which work request a completion is for, as the caller tagged it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    /// Bytes received (receives only).
    pub byte_len: u32,
}

/// One accepted (or about to be) CM connection with its RC queue pair.
pub struct CmConn {
    cm: &'static Cm,
    id: *mut CmId,
    qp: *mut c_void,
    // Drop order: the QP (in Drop), then the CQ, then its completion channel, then the id's channel.
    cq: Cq,
    comp: CompChannel,
    chan: Channel,
    dev: Device,
    pub peer: SocketAddr,
    max_rd_atomic: u8,
    max_dest_rd_atomic: u8,
    requested: (u8, u8),
    established: bool,
}

// SAFETY: see Channel; one thread drives a connection.
unsafe impl Send for CmConn {}

impl CmConn {
    /// The active side (tests and tools: a client of an RDMA CM server): resolves `addr`, creates the queue pair
    /// as [`CmRequest::into_conn`] does and connects with `private_data`. The caller posts its receives before it
    /// sends its first message.
    pub fn connect(addr: SocketAddr, private_data: &[u8], send_wr: u32, recv_wr: u32) -> Result<CmConn> {
        const RESOLVE_MS: c_int = 5_000;
        let cm = cm()?;
        let chan = Channel::new(cm)?;
        let mut id: *mut CmId = std::ptr::null_mut();
        // SAFETY: the channel is live; id is a valid out-pointer.
        check(unsafe { (cm.create_id)(chan.ptr, &mut id, std::ptr::null_mut(), RDMA_PS_TCP) }, "rdma_create_id")?;
        let (ss, _) = sockaddr_of(addr);
        let expect = |chan: &Channel, want: u32, what: &str| -> Result<()> {
            let (event, status, ..) = chan.next()?;
            if event != want {
                return Err(RdmaError::Protocol(format!("rdma cm: {what}: event {event} (status {status})")));
            }
            Ok(())
        };
        let resolved = (|| -> Result<Device> {
            // SAFETY: id is live; ss holds a sockaddr of the family it names; NULL source: any.
            let rc = unsafe {
                (cm.resolve_addr)(id, std::ptr::null(), (&ss as *const libc::sockaddr_storage).cast(), RESOLVE_MS)
            };
            check(rc, "rdma_resolve_addr")?;
            expect(&chan, 0, "resolving the address")?;
            // SAFETY: id is live with its address resolved.
            check(unsafe { (cm.resolve_route)(id, RESOLVE_MS) }, "rdma_resolve_route")?;
            expect(&chan, 2, "resolving the route")?;
            // SAFETY: id is live and bound to a device; librdmacm keeps its contexts open while loaded.
            unsafe { Device::from_cm_context((*id).verbs, 1) }
        })();
        let dev = match resolved {
            Ok(d) => d,
            Err(e) => {
                // SAFETY: the id is destroyed once, before its channel (dropped after).
                unsafe { (cm.destroy_id)(id) };
                return Err(e);
            }
        };
        // From here the request owns the id (destroyed on every error path by its Drop).
        let req = CmRequest {
            id,
            chan: Some(chan),
            dev,
            peer: addr,
            private_data: Vec::new(),
            initiator_depth: 1,
            responder_resources: 1,
        };
        let mut conn = req.into_conn(send_wr, recv_wr, 1)?;
        let mut p = ConnParam {
            private_data: private_data.as_ptr().cast(),
            private_data_len: u8::try_from(private_data.len()).unwrap_or(u8::MAX),
            responder_resources: conn.max_dest_rd_atomic,
            initiator_depth: conn.max_rd_atomic,
            flow_control: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: 0,
            qp_num: 0,
        };
        // SAFETY: id is live with its QP; p points at private_data, valid for the call.
        check(unsafe { (cm.connect)(conn.id, &mut p) }, "rdma_connect")?;
        let (event, status, ..) = conn.chan.next()?;
        if event != EVENT_ESTABLISHED {
            return Err(RdmaError::Protocol(format!("rdma cm: connecting: event {event} (status {status})")));
        }
        conn.established = true;
        Ok(conn)
    }

    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// Accepts with `private_data` (at most 56 bytes) and waits for the connection to be established.
    pub fn accept(&mut self, private_data: &[u8]) -> Result<()> {
        assert!(private_data.len() <= 56, "CM private data of an accept is at most 56 bytes");
        // The request's values are already from this side's view (the CM swaps the peer's): our initiator depth
        // (RDMA READs we may have outstanding, bounded by the client's responder resources) and our responder
        // resources (READs the client may issue to us: Linux's client issues none).
        let (initiator_depth, responder_resources) = self.requested;
        let mut p = ConnParam {
            private_data: private_data.as_ptr().cast(),
            private_data_len: private_data.len() as u8,
            responder_resources: responder_resources.min(self.max_dest_rd_atomic),
            initiator_depth: initiator_depth.min(self.max_rd_atomic),
            flow_control: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: 0,
            qp_num: 0,
        };
        // SAFETY: id is live with its QP; p points at private_data, valid for the call.
        check(unsafe { (self.cm.accept)(self.id, &mut p) }, "rdma_accept")?;
        let (event, status, ..) = self.chan.next()?;
        if event != EVENT_ESTABLISHED {
            return Err(RdmaError::Protocol(format!(
                "rdma cm: event {event} (status {status}) instead of ESTABLISHED"
            )));
        }
        self.established = true;
        Ok(())
    }

    /// The connection's CM event channel fd (readable when the client disconnects).
    pub fn event_fd(&self) -> c_int {
        // SAFETY: the channel is live.
        unsafe { (*self.chan.ptr).fd }
    }

    fn post_send_wr(&self, wr: &mut IbvSendWr) -> Result<()> {
        let inner = &self.dev.inner;
        // SAFETY: qp is live on inner.ctx; every SGE names registered memory of this device's PD that the caller
        // keeps alive until the completion.
        let rc = unsafe { inner.verbs.post_send(inner.ctx, self.qp, wr) };
        if rc != 0 {
            return Err(RdmaError::Verbs { op: "ibv_post_send", errno: rc });
        }
        Ok(())
    }

    fn send_wr(wr_id: u64, sge: &mut [IbvSge], opcode: c_uint, remote: Option<(u64, u32)>) -> IbvSendWr {
        let (remote_addr, rkey) = remote.unwrap_or((0, 0));
        IbvSendWr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: sge.as_mut_ptr(),
            num_sge: sge.len() as c_int,
            opcode,
            send_flags: ffi::IBV_SEND_SIGNALED,
            imm_data: 0,
            remote_addr,
            rkey,
            _wr_rest: [0; 5],
            _qp_type: 0,
            _tail: [0; 6],
        }
    }

    /// Posts a receive of `len` bytes at `offset` of `mr`.
    pub fn post_recv(&self, mr: &MemoryRegion, offset: usize, len: usize, wr_id: u64) -> Result<()> {
        mr.check("receive buffer", offset, len)?;
        let mut sge = IbvSge { addr: mr.addr() + offset as u64, length: len as u32, lkey: mr.lkey() };
        let mut wr = IbvRecvWr { wr_id, next: std::ptr::null_mut(), sg_list: &mut sge, num_sge: 1 };
        let inner = &self.dev.inner;
        // SAFETY: qp is live; the SGE lies in mr (checked), which the caller keeps registered until completion.
        let rc = unsafe { inner.verbs.post_recv(inner.ctx, self.qp, &mut wr) };
        if rc != 0 {
            return Err(RdmaError::Verbs { op: "ibv_post_recv", errno: rc });
        }
        Ok(())
    }

    /// Posts a SEND gathering `parts` (each `(mr, offset, len)`), signaled.
    pub fn post_send(&self, parts: &[(&MemoryRegion, usize, usize)], wr_id: u64) -> Result<()> {
        let mut sges = Vec::with_capacity(parts.len());
        for (mr, off, len) in parts {
            mr.check("send buffer", *off, *len)?;
            sges.push(IbvSge { addr: mr.addr() + *off as u64, length: *len as u32, lkey: mr.lkey() });
        }
        let mut wr = Self::send_wr(wr_id, &mut sges, ffi::IBV_WR_SEND, None);
        self.post_send_wr(&mut wr)
    }

    /// Posts an RDMA READ of `len` bytes from the peer's (`rkey`, `remote_addr`) into `mr` at `offset`, signaled.
    pub fn post_read(
        &self,
        mr: &MemoryRegion,
        offset: usize,
        len: usize,
        rkey: u32,
        remote_addr: u64,
        wr_id: u64,
    ) -> Result<()> {
        mr.check("read target", offset, len)?;
        let mut sge = [IbvSge { addr: mr.addr() + offset as u64, length: len as u32, lkey: mr.lkey() }];
        let mut wr = Self::send_wr(wr_id, &mut sge, ffi::IBV_WR_RDMA_READ, Some((remote_addr, rkey)));
        self.post_send_wr(&mut wr)
    }

    /// Posts an RDMA WRITE of `len` bytes at `offset` of `mr` to the peer's (`rkey`, `remote_addr`), signaled.
    pub fn post_write(
        &self,
        mr: &MemoryRegion,
        offset: usize,
        len: usize,
        rkey: u32,
        remote_addr: u64,
        wr_id: u64,
    ) -> Result<()> {
        mr.check("write source", offset, len)?;
        let mut sge = [IbvSge { addr: mr.addr() + offset as u64, length: len as u32, lkey: mr.lkey() }];
        let mut wr = Self::send_wr(wr_id, &mut sge, ffi::IBV_WR_RDMA_WRITE, Some((remote_addr, rkey)));
        self.post_send_wr(&mut wr)
    }

    /// Waits for the next completion (sleeping on the completion channel, waking every `tick` to let the caller
    /// check for shutdown: `Ok(None)`). A completion with an error status is an error naming it.
    pub fn next_completion(&self, tick: Duration) -> Result<Option<Completion>> {
        let mut wc = [IbvWc::default()];
        loop {
            if self.cq.poll(&mut wc)? == 1 {
                let w = wc[0];
                if w.status != ffi::IBV_WC_SUCCESS {
                    return Err(RdmaError::Completion {
                        op: "rpc-over-rdma",
                        status: w.status,
                        text: self.cq.status_text(w.status),
                    });
                }
                return Ok(Some(Completion { wr_id: w.wr_id, byte_len: w.byte_len }));
            }
            self.cq.arm()?;
            // A completion that came between the poll and the arm raises no event: poll once more.
            if self.cq.poll(&mut wc)? == 1 {
                let w = wc[0];
                if w.status != ffi::IBV_WC_SUCCESS {
                    return Err(RdmaError::Completion {
                        op: "rpc-over-rdma",
                        status: w.status,
                        text: self.cq.status_text(w.status),
                    });
                }
                return Ok(Some(Completion { wr_id: w.wr_id, byte_len: w.byte_len }));
            }
            let (cq, ready) = self.comp.wait_with(&[self.event_fd()], tick)?;
            if cq.is_none() && !ready[0] {
                return Ok(None);
            }
            if ready[0] {
                let (event, ..) = self.chan.next()?;
                if event == EVENT_DISCONNECTED {
                    return Err(RdmaError::Protocol("the client disconnected".into()));
                }
            }
        }
    }
}

impl Drop for CmConn {
    fn drop(&mut self) {
        // SAFETY: the id and its QP are this value's; disconnect (harmless when already down), then the QP, then
        // the id, each once; the CQ and channels go after (field drop order).
        unsafe {
            if self.established {
                (self.cm.disconnect)(self.id);
            }
            (self.cm.destroy_qp)(self.id);
            (self.cm.destroy_id)(self.id);
        }
    }
}
