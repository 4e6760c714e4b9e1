//! Raw libibverbs ABI: the few structs and entry points Weft uses, loaded with `dlopen` at run time.
//!
//! Why hand-written and not bindgen: the verbs ABI (`IBVERBS_1.1`, rdma-core's `libibverbs.so.1`) has been stable
//! for over a decade, Weft needs about twenty symbols and a dozen structs, and bindgen would pull libclang into every
//! build (CI builds this feature). Every layout below was read off Debian's rdma-core 44 `verbs.h` with a C program
//! printing `sizeof`/`offsetof`; the `const` assertions at the bottom pin those numbers so a wrong edit fails to
//! compile. Loading at run time (not linking) means the feature builds on a host without rdma-core and a program
//! without RDMA fails with a clear error instead of a loader error.
//!
//! The data-path verbs (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`) are `static inline` in `verbs.h`: they call
//! through the provider's function table in `ibv_context.ops`, which is what [`Verbs::post_send`] and friends do.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::mem::{align_of, offset_of, size_of};
use std::sync::OnceLock;

pub const IBV_QPT_RC: c_uint = 2;
pub const IBV_QPS_INIT: c_uint = 1;
pub const IBV_QPS_RTR: c_uint = 2;
pub const IBV_QPS_RTS: c_uint = 3;

pub const IBV_QP_STATE: c_int = 1 << 0;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;

pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 1 << 1;
pub const IBV_ACCESS_REMOTE_READ: c_int = 1 << 2;

pub const IBV_WR_RDMA_WRITE: c_uint = 0;
pub const IBV_WR_SEND: c_uint = 2;
pub const IBV_WR_RDMA_READ: c_uint = 4;
pub const IBV_SEND_SIGNALED: c_uint = 2;

pub const IBV_WC_SUCCESS: c_uint = 0;
pub const IBV_PORT_ACTIVE: c_uint = 4;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct IbvSge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

#[repr(C)]
pub struct IbvSendWr {
    pub wr_id: u64,
    pub next: *mut IbvSendWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
    pub opcode: c_uint,
    pub send_flags: c_uint,
    pub imm_data: u32,
    /// `wr.rdma.remote_addr`; the union is 32 bytes (its `atomic` arm is the largest).
    pub remote_addr: u64,
    pub rkey: u32,
    pub _wr_rest: [u32; 5],
    pub _qp_type: u32,
    /// The `bind_mw` / `tso` union, unused here.
    pub _tail: [u64; 6],
}

#[repr(C)]
pub struct IbvRecvWr {
    pub wr_id: u64,
    pub next: *mut IbvRecvWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct IbvWc {
    pub wr_id: u64,
    pub status: c_uint,
    pub opcode: c_uint,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct IbvQpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

#[repr(C)]
pub struct IbvQpInitAttr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub cap: IbvQpCap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
}

/// `union ibv_gid` holds two `__be64`, so the route (and everything embedding it) is 8-aligned.
#[repr(C, align(8))]
#[derive(Debug, Clone, Copy, Default)]
pub struct IbvGlobalRoute {
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct IbvAhAttr {
    pub grh: IbvGlobalRoute,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct IbvQpAttr {
    pub qp_state: c_uint,
    pub cur_qp_state: c_uint,
    pub path_mtu: c_uint,
    pub path_mig_state: c_uint,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: IbvQpCap,
    pub ah_attr: IbvAhAttr,
    pub alt_ah_attr: IbvAhAttr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_port_attr`; the exported `ibv_query_port` fills the compat prefix, the rest stays zeroed.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct IbvPortAttr {
    pub state: c_uint,
    pub max_mtu: c_uint,
    pub active_mtu: c_uint,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// `struct ibv_device_attr` is 232 bytes; only the read-atomic limits are read, at their `offsetof`.
#[repr(C, align(8))]
pub struct IbvDeviceAttr {
    pub raw: [u8; 232],
}
pub const DEVICE_ATTR_MAX_QP_RD_ATOM_OFFSET: usize = 144;
pub const DEVICE_ATTR_MAX_QP_INIT_RD_ATOM_OFFSET: usize = 156;

/// The head of `struct ibv_mr` (48 bytes).
#[repr(C)]
pub struct IbvMr {
    pub context: *mut IbvContext,
    pub pd: *mut c_void,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// The head of `struct ibv_qp`, up to `qp_num` (the mutex and condvar after it are the library's).
#[repr(C)]
pub struct IbvQpHead {
    pub context: *mut IbvContext,
    pub qp_context: *mut c_void,
    pub pd: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
}

pub type ReqNotifyCqFn = unsafe extern "C" fn(cq: *mut c_void, solicited_only: c_int) -> c_int;
pub type PollCqFn = unsafe extern "C" fn(cq: *mut c_void, num_entries: c_int, wc: *mut IbvWc) -> c_int;
pub type PostSendFn = unsafe extern "C" fn(qp: *mut c_void, wr: *mut IbvSendWr, bad: *mut *mut IbvSendWr) -> c_int;
pub type PostRecvFn = unsafe extern "C" fn(qp: *mut c_void, wr: *mut IbvRecvWr, bad: *mut *mut IbvRecvWr) -> c_int;

/// Indices into `struct ibv_context_ops` (32 pointers).
const OPS_POLL_CQ: usize = 11;
const OPS_REQ_NOTIFY_CQ: usize = 12;
const OPS_POST_SEND: usize = 25;
const OPS_POST_RECV: usize = 26;

/// `struct ibv_comp_channel`: completion events arrive as readable data on `fd`.
#[repr(C)]
pub struct IbvCompChannel {
    pub context: *mut IbvContext,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// The head of `struct ibv_context`: the device pointer and the provider's function table.
#[repr(C)]
pub struct IbvContext {
    pub device: *mut c_void,
    pub ops: [Option<unsafe extern "C" fn()>; 32],
    pub cmd_fd: c_int,
}

// Layouts pinned against rdma-core 44's verbs.h (x86_64); see the module doc.
const _: () = {
    assert!(size_of::<IbvSge>() == 16);
    assert!(size_of::<IbvSendWr>() == 128);
    assert!(offset_of!(IbvSendWr, num_sge) == 24);
    assert!(offset_of!(IbvSendWr, opcode) == 28);
    assert!(offset_of!(IbvSendWr, send_flags) == 32);
    assert!(offset_of!(IbvSendWr, remote_addr) == 40);
    assert!(offset_of!(IbvSendWr, rkey) == 48);
    assert!(offset_of!(IbvSendWr, _qp_type) == 72);
    assert!(offset_of!(IbvSendWr, _tail) == 80);
    assert!(size_of::<IbvRecvWr>() == 32);
    assert!(size_of::<IbvWc>() == 48);
    assert!(offset_of!(IbvWc, status) == 8);
    assert!(offset_of!(IbvWc, byte_len) == 20);
    assert!(offset_of!(IbvWc, qp_num) == 28);
    assert!(offset_of!(IbvWc, wc_flags) == 36);
    assert!(offset_of!(IbvWc, sl) == 44);
    assert!(size_of::<IbvQpCap>() == 20);
    assert!(size_of::<IbvQpInitAttr>() == 64);
    assert!(offset_of!(IbvQpInitAttr, cap) == 32);
    assert!(offset_of!(IbvQpInitAttr, qp_type) == 52);
    assert!(size_of::<IbvQpAttr>() == 144);
    assert!(align_of::<IbvQpAttr>() == 8);
    assert!(align_of::<IbvAhAttr>() == 8);
    assert!(offset_of!(IbvQpAttr, cap) == 36);
    assert!(offset_of!(IbvQpAttr, ah_attr) == 56);
    assert!(offset_of!(IbvQpAttr, alt_ah_attr) == 88);
    assert!(offset_of!(IbvQpAttr, pkey_index) == 120);
    assert!(offset_of!(IbvQpAttr, max_rd_atomic) == 126);
    assert!(offset_of!(IbvQpAttr, port_num) == 129);
    assert!(offset_of!(IbvQpAttr, timeout) == 130);
    assert!(offset_of!(IbvQpAttr, rate_limit) == 136);
    assert!(size_of::<IbvAhAttr>() == 32);
    assert!(offset_of!(IbvAhAttr, dlid) == 24);
    assert!(offset_of!(IbvAhAttr, is_global) == 29);
    assert!(offset_of!(IbvAhAttr, port_num) == 30);
    assert!(size_of::<IbvGlobalRoute>() == 24);
    assert!(offset_of!(IbvGlobalRoute, flow_label) == 16);
    assert!(offset_of!(IbvGlobalRoute, sgid_index) == 20);
    assert!(size_of::<IbvPortAttr>() == 52);
    assert!(offset_of!(IbvPortAttr, active_mtu) == 8);
    assert!(offset_of!(IbvPortAttr, gid_tbl_len) == 12);
    assert!(offset_of!(IbvPortAttr, lid) == 34);
    assert!(offset_of!(IbvPortAttr, link_layer) == 46);
    assert!(offset_of!(IbvPortAttr, port_cap_flags2) == 48);
    assert!(size_of::<IbvDeviceAttr>() == 232);
    assert!(offset_of!(IbvMr, lkey) == 36);
    assert!(offset_of!(IbvMr, rkey) == 40);
    assert!(offset_of!(IbvQpHead, qp_num) == 52);
    assert!(offset_of!(IbvContext, ops) == 8);
    assert!(offset_of!(IbvContext, ops) + OPS_POLL_CQ * 8 == 96);
    assert!(offset_of!(IbvContext, ops) + OPS_REQ_NOTIFY_CQ * 8 == 104);
    assert!(offset_of!(IbvContext, ops) + OPS_POST_SEND * 8 == 208);
    assert!(offset_of!(IbvContext, ops) + OPS_POST_RECV * 8 == 216);
    assert!(offset_of!(IbvContext, cmd_fd) == 264);
    assert!(size_of::<IbvCompChannel>() == 16);
    assert!(offset_of!(IbvCompChannel, fd) == 8);
};

/// The exported libibverbs entry points Weft calls, resolved once per process.
pub type GetDeviceListFn = unsafe extern "C" fn(num: *mut c_int) -> *mut *mut c_void;
pub type FreeDeviceListFn = unsafe extern "C" fn(list: *mut *mut c_void);
pub type GetDeviceNameFn = unsafe extern "C" fn(dev: *mut c_void) -> *const c_char;
pub type OpenDeviceFn = unsafe extern "C" fn(dev: *mut c_void) -> *mut IbvContext;
pub type CloseDeviceFn = unsafe extern "C" fn(ctx: *mut IbvContext) -> c_int;
pub type QueryDeviceFn = unsafe extern "C" fn(ctx: *mut IbvContext, attr: *mut IbvDeviceAttr) -> c_int;
pub type QueryPortFn = unsafe extern "C" fn(ctx: *mut IbvContext, port: u8, attr: *mut IbvPortAttr) -> c_int;
pub type QueryGidFn = unsafe extern "C" fn(ctx: *mut IbvContext, port: u8, index: c_int, gid: *mut [u8; 16]) -> c_int;
pub type AllocPdFn = unsafe extern "C" fn(ctx: *mut IbvContext) -> *mut c_void;
pub type DeallocPdFn = unsafe extern "C" fn(pd: *mut c_void) -> c_int;
pub type RegMrFn = unsafe extern "C" fn(pd: *mut c_void, addr: *mut c_void, len: usize, access: c_int) -> *mut IbvMr;
pub type DeregMrFn = unsafe extern "C" fn(mr: *mut IbvMr) -> c_int;
pub type CreateCqFn = unsafe extern "C" fn(
    ctx: *mut IbvContext,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut c_void,
    comp_vector: c_int,
) -> *mut c_void;
pub type DestroyCqFn = unsafe extern "C" fn(cq: *mut c_void) -> c_int;
pub type CreateQpFn = unsafe extern "C" fn(pd: *mut c_void, attr: *mut IbvQpInitAttr) -> *mut c_void;
pub type ModifyQpFn = unsafe extern "C" fn(qp: *mut c_void, attr: *mut IbvQpAttr, mask: c_int) -> c_int;
pub type DestroyQpFn = unsafe extern "C" fn(qp: *mut c_void) -> c_int;
pub type CreateCompChannelFn = unsafe extern "C" fn(ctx: *mut IbvContext) -> *mut IbvCompChannel;
pub type DestroyCompChannelFn = unsafe extern "C" fn(channel: *mut IbvCompChannel) -> c_int;
pub type GetCqEventFn =
    unsafe extern "C" fn(channel: *mut IbvCompChannel, cq: *mut *mut c_void, cq_context: *mut *mut c_void) -> c_int;
pub type AckCqEventsFn = unsafe extern "C" fn(cq: *mut c_void, nevents: c_uint);
pub type WcStatusStrFn = unsafe extern "C" fn(status: c_uint) -> *const c_char;

pub struct Verbs {
    pub get_device_list: GetDeviceListFn,
    pub free_device_list: FreeDeviceListFn,
    pub get_device_name: GetDeviceNameFn,
    pub open_device: OpenDeviceFn,
    pub close_device: CloseDeviceFn,
    pub query_device: QueryDeviceFn,
    pub query_port: QueryPortFn,
    pub query_gid: QueryGidFn,
    pub alloc_pd: AllocPdFn,
    pub dealloc_pd: DeallocPdFn,
    pub reg_mr: RegMrFn,
    pub dereg_mr: DeregMrFn,
    pub create_cq: CreateCqFn,
    pub destroy_cq: DestroyCqFn,
    pub create_qp: CreateQpFn,
    pub modify_qp: ModifyQpFn,
    pub destroy_qp: DestroyQpFn,
    pub wc_status_str: WcStatusStrFn,
    pub create_comp_channel: CreateCompChannelFn,
    pub destroy_comp_channel: DestroyCompChannelFn,
    pub get_cq_event: GetCqEventFn,
    pub ack_cq_events: AckCqEventsFn,
}

const LIBRARY: &CStr = c"libibverbs.so.1";

/// Loads libibverbs once; later calls return the same table or the same error.
pub fn verbs() -> Result<&'static Verbs, String> {
    static VERBS: OnceLock<Result<Verbs, String>> = OnceLock::new();
    VERBS.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> Result<Verbs, String> {
    // SAFETY: dlopen with a valid NUL-terminated name; the handle is never closed, so every symbol resolved from
    // it stays valid for the life of the process (the table lives in a static).
    let handle = unsafe { libc::dlopen(LIBRARY.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(format!(
            "cannot load {}: {} (install rdma-core's libibverbs1)",
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
                return Err(format!("libibverbs lacks {}: {}", name.to_string_lossy(), dlerror()));
            }
            // SAFETY: the symbol is the libibverbs function of that name; the field's type is its C prototype from
            // verbs.h (IBVERBS_1.1, the default version dlsym returns), and a data pointer and a function pointer
            // have the same size on every platform libibverbs supports.
            unsafe { std::mem::transmute::<*mut c_void, $ty>(ptr) }
        }};
    }
    Ok(Verbs {
        get_device_list: sym!(c"ibv_get_device_list", GetDeviceListFn),
        free_device_list: sym!(c"ibv_free_device_list", FreeDeviceListFn),
        get_device_name: sym!(c"ibv_get_device_name", GetDeviceNameFn),
        open_device: sym!(c"ibv_open_device", OpenDeviceFn),
        close_device: sym!(c"ibv_close_device", CloseDeviceFn),
        query_device: sym!(c"ibv_query_device", QueryDeviceFn),
        query_port: sym!(c"ibv_query_port", QueryPortFn),
        query_gid: sym!(c"ibv_query_gid", QueryGidFn),
        alloc_pd: sym!(c"ibv_alloc_pd", AllocPdFn),
        dealloc_pd: sym!(c"ibv_dealloc_pd", DeallocPdFn),
        reg_mr: sym!(c"ibv_reg_mr", RegMrFn),
        dereg_mr: sym!(c"ibv_dereg_mr", DeregMrFn),
        create_cq: sym!(c"ibv_create_cq", CreateCqFn),
        destroy_cq: sym!(c"ibv_destroy_cq", DestroyCqFn),
        create_qp: sym!(c"ibv_create_qp", CreateQpFn),
        modify_qp: sym!(c"ibv_modify_qp", ModifyQpFn),
        destroy_qp: sym!(c"ibv_destroy_qp", DestroyQpFn),
        wc_status_str: sym!(c"ibv_wc_status_str", WcStatusStrFn),
        create_comp_channel: sym!(c"ibv_create_comp_channel", CreateCompChannelFn),
        destroy_comp_channel: sym!(c"ibv_destroy_comp_channel", DestroyCompChannelFn),
        get_cq_event: sym!(c"ibv_get_cq_event", GetCqEventFn),
        ack_cq_events: sym!(c"ibv_ack_cq_events", AckCqEventsFn),
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

impl Verbs {
    /// `ibv_poll_cq`: the provider's `ops.poll_cq`.
    ///
    /// # Safety
    /// `ctx` must be the open context that created `cq`, and `cq` must be live.
    pub unsafe fn poll_cq(&self, ctx: *mut IbvContext, cq: *mut c_void, wc: &mut [IbvWc]) -> c_int {
        // SAFETY: the caller guarantees ctx is a live context; providers always fill ops.poll_cq, and the slot's
        // prototype is PollCqFn (verbs.h). A missing entry reports an error instead of jumping to NULL.
        unsafe {
            match (*ctx).ops[OPS_POLL_CQ] {
                Some(f) => std::mem::transmute::<unsafe extern "C" fn(), PollCqFn>(f)(
                    cq,
                    c_int::try_from(wc.len()).unwrap_or(c_int::MAX),
                    wc.as_mut_ptr(),
                ),
                None => -libc::EOPNOTSUPP,
            }
        }
    }

    /// `ibv_req_notify_cq`: the provider's `ops.req_notify_cq`; arms the CQ for one completion event.
    ///
    /// # Safety
    /// As for [`Verbs::poll_cq`].
    pub unsafe fn req_notify_cq(&self, ctx: *mut IbvContext, cq: *mut c_void) -> c_int {
        // SAFETY: as for poll_cq; the slot's prototype is ReqNotifyCqFn.
        unsafe {
            match (*ctx).ops[OPS_REQ_NOTIFY_CQ] {
                Some(f) => std::mem::transmute::<unsafe extern "C" fn(), ReqNotifyCqFn>(f)(cq, 0),
                None => libc::EOPNOTSUPP,
            }
        }
    }

    /// `ibv_post_send`: the provider's `ops.post_send`; returns 0 or an errno.
    ///
    /// # Safety
    /// `ctx` must own the live `qp`; every SGE in `wr` must lie in memory registered with the QP's PD and stay
    /// valid until its completion is polled.
    pub unsafe fn post_send(&self, ctx: *mut IbvContext, qp: *mut c_void, wr: &mut IbvSendWr) -> c_int {
        let mut bad: *mut IbvSendWr = std::ptr::null_mut();
        // SAFETY: as for poll_cq; the slot's prototype is PostSendFn.
        unsafe {
            match (*ctx).ops[OPS_POST_SEND] {
                Some(f) => std::mem::transmute::<unsafe extern "C" fn(), PostSendFn>(f)(qp, wr, &mut bad),
                None => libc::EOPNOTSUPP,
            }
        }
    }

    /// `ibv_post_recv`: the provider's `ops.post_recv`; returns 0 or an errno.
    ///
    /// # Safety
    /// As for [`Verbs::post_send`].
    pub unsafe fn post_recv(&self, ctx: *mut IbvContext, qp: *mut c_void, wr: &mut IbvRecvWr) -> c_int {
        let mut bad: *mut IbvRecvWr = std::ptr::null_mut();
        // SAFETY: as for poll_cq; the slot's prototype is PostRecvFn.
        unsafe {
            match (*ctx).ops[OPS_POST_RECV] {
                Some(f) => std::mem::transmute::<unsafe extern "C" fn(), PostRecvFn>(f)(qp, wr, &mut bad),
                None => libc::EOPNOTSUPP,
            }
        }
    }
}
