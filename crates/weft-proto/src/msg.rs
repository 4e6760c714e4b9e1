//! Op codes and the request/response body of each op.
//!
//! Invariant: an op code, once assigned, is never reused or renumbered; retired ops leave a hole.
//! Ranges: 1–99 session and control, 100–199 metadata service, 200–299 data servers.

use serde::{Deserialize, Serialize};

use crate::capability::{Capability, Rights};
use crate::frame::FrameError;
use crate::layout::Layout;
use crate::space::SpaceStatDev;
use crate::types::*;

macro_rules! messages {
    ($( $(#[$m:meta])* $variant:ident = $code:literal : $req:ty => $resp:ty, idempotent = $idem:literal, data = $data:literal; )*) => {
        /// Every op code on the wire.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u16)]
        pub enum Op { $( $(#[$m])* $variant = $code, )* }

        impl Op {
            /// Every op, in code order (metrics resolve their per-op series from it).
            pub const ALL: &'static [Op] = &[ $( Op::$variant, )* ];
            /// The op's name as in this file (`"Create"`): the `op` label of metrics and logs, so dashboards
            /// depend on it: rename a variant only as deliberately as a metric.
            pub fn name(self) -> &'static str {
                match self { $( Op::$variant => stringify!($variant), )* }
            }
            pub fn from_u16(v: u16) -> Option<Op> {
                match v { $( $code => Some(Op::$variant), )* _ => None }
            }
            /// Re-executing the op gives the same outcome, so its reply need not be cached for retransmissions.
            pub fn is_idempotent(self) -> bool {
                match self { $( Op::$variant => $idem, )* }
            }
            /// The request may carry a bulk data payload after its body.
            pub fn request_has_data(self) -> bool {
                match self { $( Op::$variant => $data, )* }
            }
        }

        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        pub enum Request { $( $variant($req), )* }

        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        pub enum Response { $( $variant($resp), )* }

        impl Request {
            pub fn op(&self) -> Op {
                match self { $( Request::$variant(_) => Op::$variant, )* }
            }
            pub fn encode_body(&self) -> Vec<u8> {
                match self { $( Request::$variant(b) => encode(b), )* }
            }
            /// Decodes the body of a request whose header carried `op`.
            pub fn decode(op: u16, body: &[u8]) -> Result<Request, FrameError> {
                match Op::from_u16(op) {
                    $( Some(Op::$variant) => Ok(Request::$variant(decode(op, body)?)), )*
                    None => Err(FrameError::UnknownOp(op)),
                }
            }
        }

        impl Response {
            pub fn op(&self) -> Op {
                match self { $( Response::$variant(_) => Op::$variant, )* }
            }
            pub fn encode_body(&self) -> Vec<u8> {
                match self { $( Response::$variant(b) => encode(b), )* }
            }
            /// Decodes the body of a (non-error) reply to a request with `op`.
            pub fn decode(op: u16, body: &[u8]) -> Result<Response, FrameError> {
                match Op::from_u16(op) {
                    $( Some(Op::$variant) => Ok(Response::$variant(decode(op, body)?)), )*
                    None => Err(FrameError::UnknownOp(op)),
                }
            }
        }
    };
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    // Serializing plain data into a Vec cannot fail.
    postcard::to_stdvec(v).expect("postcard encoding of a wire type")
}

/// Decodes a whole body; trailing bytes are an error, so one frame has exactly one reading.
pub fn decode<'a, T: Deserialize<'a>>(op: u16, body: &'a [u8]) -> Result<T, FrameError> {
    let (v, rest) = postcard::take_from_bytes(body).map_err(|e| FrameError::BadBody { op, reason: e.to_string() })?;
    if !rest.is_empty() {
        return Err(FrameError::BadBody { op, reason: format!("{} trailing bytes", rest.len()) });
    }
    Ok(v)
}

/// Encodes any wire value (used for error bodies).
pub fn encode_value<T: Serialize>(v: &T) -> Vec<u8> {
    encode(v)
}

messages! {
    /// Liveness probe; no session needed.
    Null = 1: () => (), idempotent = true, data = false;
    SessionCreate = 2: SessionCreateReq => SessionCreateResp, idempotent = true, data = false;
    SessionDestroy = 3: () => (), idempotent = true, data = false;
    /// Mutual challenge–response, first half: the client's nonce and which key; the server's nonce and proof.
    AuthBegin = 4: AuthBeginReq => AuthBeginResp, idempotent = true, data = false;
    /// Second half: the client's proof. The connection is then authenticated.
    AuthFinish = 5: AuthFinishReq => (), idempotent = true, data = false;
    /// Binds an existing session to this (newly authenticated) connection, with a proof from the session secret.
    SessionBind = 6: SessionBindReq => (), idempotent = true, data = false;

    Lookup = 100: LookupReq => Attr, idempotent = true, data = false;
    GetAttr = 101: InoReq => Attr, idempotent = true, data = false;
    SetAttr = 102: SetAttrReq => Attr, idempotent = false, data = false;
    Create = 103: CreateReq => Attr, idempotent = false, data = false;
    Mkdir = 104: MkdirReq => Attr, idempotent = false, data = false;
    Rmdir = 105: NameReq => (), idempotent = false, data = false;
    Unlink = 106: NameReq => (), idempotent = false, data = false;
    Rename = 107: RenameReq => (), idempotent = false, data = false;
    Symlink = 108: SymlinkReq => Attr, idempotent = false, data = false;
    Readlink = 109: InoReq => String, idempotent = true, data = false;
    Link = 110: LinkReq => Attr, idempotent = false, data = false;
    Readdir = 111: ReaddirReq => ReaddirResp, idempotent = true, data = false;
    Statfs = 112: () => StatFs, idempotent = true, data = false;
    /// `weft setstripe`: the layout policy of a directory.
    SetLayout = 113: SetLayoutReq => Attr, idempotent = false, data = false;
    /// LAYOUTCOMMIT: the client publishes size and mtime at fsync/close; the largest size wins.
    Commit = 114: CommitReq => Attr, idempotent = false, data = false;
    ClusterInfo = 115: () => Vec<ServerInfo>, idempotent = true, data = false;
    /// A data server announces itself and its space; repeated as its heartbeat.
    RegisterServer = 116: RegisterServerReq => (), idempotent = true, data = false;
    /// readdir with every entry's attributes (FUSE readdirplus, NFS READDIRPLUS): one round trip instead of a
    /// lookup per entry. At most `READDIRPLUS_ENTRIES_MAX` entries per page.
    ReaddirPlus = 117: ReaddirReq => ReaddirPlusResp, idempotent = true, data = false;
    /// Commit that also returns the attributes it found (NFS "weak cache consistency"): a client whose cached
    /// view equals the pre-commit attributes knows nobody else committed since, and may keep its cached pages.
    CommitWcc = 118: CommitReq => CommitWccResp, idempotent = false, data = false;
    /// Create a FIFO, socket or device node (regular files use `Create`).
    Mknod = 119: MknodReq => Attr, idempotent = false, data = false;

    /// Opens a regular file for the data servers: checks the caller's access for `rights` (read → R, write → W)
    /// and answers the attributes with a capability sealed for this connection's key (docs/format.md §10).
    Open = 120: OpenReq => OpenResp, idempotent = true, data = false;
    /// `Create` that also opens the file read+write: the capability comes with the new file's attributes, so a
    /// create-then-write costs no second round trip.
    CreateOpen = 121: CreateReq => OpenResp, idempotent = false, data = false;
    /// An extended attribute's value (docs/format.md §13): `NoData` if the inode has no such attribute.
    GetXattr = 122: XattrReq => Vec<u8>, idempotent = true, data = false;
    /// Sets an extended attribute; `flags` is `XATTR_CREATE` (`Exists` if present), `XATTR_REPLACE` (`NoData` if
    /// absent) or 0 (either). `system.posix_acl_*` values are checked ACLs and keep the mode bits coherent.
    SetXattr = 123: SetXattrReq => (), idempotent = false, data = false;
    /// The names of an inode's extended attributes the caller may see, in byte order.
    ListXattr = 124: InoReq => Vec<String>, idempotent = true, data = false;
    /// Removes an extended attribute: `NoData` if absent.
    RemoveXattr = 125: XattrReq => (), idempotent = false, data = false;
    /// `RegisterServer` whose space names the file system it is on, so the MDS counts a shared disk once
    /// (`crate::space`). Data servers send it as their heartbeat; the reply is the server's standing at the MDS, on
    /// which its lease to serve clients rests (docs/format.md §19).
    RegisterServerDev = 126: RegisterServerDevReq => HeartbeatResp, idempotent = true, data = false;
    /// Sets or clears an advisory lock (F_SETLK, flock, NFSv4 LOCK/LOCKU) for (the caller's session, `owner`):
    /// `None` granted, or the first conflicting lock (docs/format.md §14). Never waits: blocking is the client's.
    SetLock = 127: SetLockReq => Option<LockHolder>, idempotent = false, data = false;
    /// The first lock of another owner that conflicts with the one described (F_GETLK, NFSv4 LOCKT), or `None`.
    GetLock = 128: GetLockReq => Option<LockHolder>, idempotent = true, data = false;
    /// Drops the caller's session's locks on one inode or all, of one owner or all (close, flush); returns how many.
    ReleaseLocks = 129: ReleaseLocksReq => u32, idempotent = false, data = false;
    /// Records that the server at `slot` of a file's layout missed rows `[start, end)` (a degraded write), before
    /// the writer acknowledges it (docs/format.md §18). Needs write access to the file, or the cluster key.
    MarkStale = 130: MarkStaleReq => StaleRange, idempotent = false, data = false;
    /// A page of stale entries (one file's, or all, from a cursor) and the healer's progress.
    ListStale = 131: ListStaleReq => ListStaleResp, idempotent = true, data = false;
    /// Clears rows `[start, end)` of the stale range numbered `seq` (cluster key only): `false` when that range
    /// changed since it was listed (marked again), so nothing was cleared.
    ClearStale = 132: ClearStaleReq => bool, idempotent = true, data = false;
    /// Wakes the healer now (`weft heal --now`); root or the cluster key.
    HealNow = 133: () => (), idempotent = true, data = false;
    /// Membership and rebuild progress for `weft status` (docs/format.md §19): files waiting for a spare, layout
    /// changes made, and the healer's bytes left, rate and ETA (`None` when unknown).
    MemberStatus = 135: () => MemberStatus, idempotent = true, data = false;
    /// Moves every lock of `previous_session` to the caller's session, if both were authenticated as the same
    /// principal, and ends the previous session for locks (a restarted NFS gateway takes over its predecessor's
    /// locks; docs/format.md §22).
    AdoptLocks = 136: AdoptLocksReq => AdoptLocksResp, idempotent = false, data = false;
    /// A pNFS data-server filehandle's capability (docs/format.md §23): checks the caller's access for `rights` as
    /// `Open` does, and seals a capability for key id `"pnfs"` (which no connection can prove, so it is good only at
    /// a data server's NFS listener), valid `pnfs_handle_ttl_ms`. Plain layouts only (`NotSupported` for ec and
    /// mirror files: their bytes are not a file layout's dense stripes).
    PnfsHandle = 137: PnfsHandleReq => PnfsHandleResp, idempotent = true, data = false;
    /// Every data server that told the MDS its NFS addresses (op 140), with them: the pNFS devices (§23).
    PnfsDevices = 138: () => Vec<PnfsDeviceInfo>, idempotent = true, data = false;
    /// A data server tells the MDS the NFS addresses clients reach its pNFS data server at (§23); sent with every
    /// heartbeat while it serves NFS. Cluster key only, as `RegisterServerDev`.
    RegisterPnfs = 140: RegisterPnfsReq => (), idempotent = true, data = false;
    /// `weft meta backup`: the service writes a consistent copy of its namespace into a new embedded store at
    /// `dir` on its own host (absent or empty, an absolute path) and answers what it copied (docs/format.md §29).
    /// Cluster key only: it writes files as the service's user.
    MetaBackup = 141: MetaBackupReq => MetaBackupResp, idempotent = false, data = false;
    /// ftruncate: sets the size of a file the caller holds open for writing, with the write capability of that
    /// open as the right (`cap`, verified by the MDS: its MAC, inode, WRITE, key, expiry), not the mode at
    /// truncate time, as Linux's `do_ftruncate` (docs/format.md §10). Otherwise as `SetAttr` with a size: a
    /// non-privileged caller drops set-ID bits and file capabilities. A path truncate is `SetAttr`.
    SetSizeOpen = 142: SetSizeOpenReq => Attr, idempotent = false, data = false;
    /// A capability renewed for a file the caller holds open (`cap`, a capability of an earlier `Open` or
    /// `CreateOpen` of `ino` for `rights` by this key, expired or not): as `Open`, except that the file's owner
    /// keeps the rights its open had whatever the mode now, as knfsd's owner override (a file created `0444` and
    /// written for minutes). Anyone else is checked by the mode now: a right taken away ends at renewal.
    RenewOpen = 143: RenewOpenReq => OpenResp, idempotent = true, data = false;
    /// `SetAttr` sent by an NFS server on its client's behalf: NFS clients send `ftruncate` as a SETATTR of the
    /// size, so a size change is allowed to the file's owner whatever the mode, as knfsd's owner override
    /// (`NFSD_MAY_OWNER_OVERRIDE`); anyone else needs write permission, and everything else is `SetAttr`'s.
    NfsSetAttr = 144: SetAttrReq => Attr, idempotent = false, data = false;
    /// `Open` sent by an NFS server on its client's behalf (its stateless READ, WRITE and size changes): the file's
    /// owner passes whatever the mode, as knfsd's owner override (a client may hold open a file its owner made
    /// read-only); anyone else is checked as by `Open`.
    NfsOpen = 145: OpenReq => OpenResp, idempotent = true, data = false;
    /// A client's metadata lease channel (docs/format.md §31): acknowledges recalls up to `acked`, and is answered
    /// when recalls wait or after `hold_ms`.
    LeaseWait = 146: LeaseWaitReq => LeaseWaitResp, idempotent = true, data = false;
    /// `CreateOpen` whose reply also carries the directory's attributes after the create (docs/format.md §31): a
    /// mount holding the directory's lease answers the kernel's next `GETATTR` of it without a round trip.
    CreateOpenDir = 147: CreateReq => CreateOpenDirResp, idempotent = false, data = false;

    // Retired with issue 12 (the bodies gained a capability, and a field is never added to a body): 200 Read,
    // 201 Write, 202 Truncate, 205 Fsync, 206 ReadChunks, 207 WriteChunks. Their successors are 211-216.
    RemoveObject = 203: InoReq => (), idempotent = false, data = false;
    SpaceStat = 204: () => SpaceStat, idempotent = true, data = false;
    /// Registers and deregisters client memory regions on this connection (one batch).
    Regions = 208: RegionsReq => (), idempotent = true, data = false;
    /// Which fabrics the server offers besides the one asked on, so a client can pick one.
    FabricInfo = 209: () => FabricInfoResp, idempotent = true, data = false;
    /// The server's fabric resources in use (connections with mapped client memory, regions): observability.
    FabricStat = 210: () => FabricStat, idempotent = true, data = false;
    /// Read `len` bytes of an object; the reply's data payload is exactly `len` bytes (zeros past the object's end).
    /// Needs a capability with read rights.
    Read = 211: ReadReq => (), idempotent = true, data = false;
    /// Write the request's data payload at `offset` of an object. Needs write rights.
    Write = 212: WriteReq => u32, idempotent = false, data = true;
    /// Needs write rights.
    Truncate = 213: TruncateReq => (), idempotent = false, data = false;
    /// Make an object's data and checksums durable (fsync); a missing object is already durable. Needs read or
    /// write rights.
    Fsync = 214: FsyncReq => (), idempotent = true, data = false;
    /// RPC Read-Write read: the server `put`s `len` bytes of the object into the client's write chunks, then replies.
    ReadChunks = 215: ReadChunksReq => (), idempotent = true, data = false;
    /// RPC Read-Write write: the server `get`s the bytes from the client's read chunks and writes them.
    WriteChunks = 216: WriteChunksReq => u32, idempotent = false, data = false;
    /// `SpaceStat` with the identity of the file system under the server's root (`crate::space`).
    SpaceStatDev = 217: () => SpaceStatDev, idempotent = true, data = false;
    /// The chunk versions (docs/format.md §17) of `rows` rows of an ec object, each checked against its chunk's
    /// bytes; with `data`, the rows' bytes too (`rows × unit`, zeros past the end) as the reply's payload, read
    /// under the same lock. Needs read rights.
    ReadRows = 218: ReadRowsReq => Vec<ChunkVersion>, idempotent = true, data = false;
    /// Writes whole chunks of consecutive rows (the payload, `≤ rows × unit` bytes from the first row's start) and
    /// their version records, compare-and-set: every row's current version must equal its `expect`, else nothing
    /// is written and the answer is `VersionMoved`. Needs write rights.
    WriteRows = 219: WriteRowsReq => (), idempotent = false, data = true;
    /// The version record of one row's chunk and bytes `[offset, offset + len)` of it (the reply's payload), read
    /// under the row's lock without reading the rest of the chunk (docs/format.md §17, ranges of a chunk). Needs
    /// read rights.
    ReadChunkRange = 220: ReadChunkRangeReq => ChunkVersion, idempotent = true, data = false;
    /// Writes the payload at `offset` in one row's chunk and its version record, compare-and-set as `WriteRows`
    /// (docs/format.md §17, ranges of a chunk). Needs write rights.
    WriteChunkRange = 221: WriteChunkRangeReq => (), idempotent = false, data = true;
    /// Up to `limit` inode numbers above `after` that this server holds an object of, lowest first (docs/format.md
    /// §19): how the MDS drains a replaced server. Only the cluster key (the MDS) may list.
    ListObjects = 224: ListObjectsReq => ListObjectsResp, idempotent = true, data = false;
    /// Verifies an object range against its checksum sidecar without sending its bytes (scrub, docs/format.md
    /// §20): the object's length and the object offsets of the blocks that fail (corrupt, or written and lost past
    /// the object's end). Needs read rights.
    VerifyObject = 228: VerifyReq => VerifyResp, idempotent = true, data = false;
    /// `Write` of one copy of a mirrored file, checked against the object's fence (docs/format.md §32). Needs write
    /// rights.
    FencedWrite = 229: FencedWriteReq => u32, idempotent = false, data = true;
    /// `Truncate` of one copy of a mirrored file, checked against the object's fence (§32). Needs write rights.
    FencedTruncate = 230: FencedTruncateReq => (), idempotent = false, data = false;
    /// `WriteChunks` of one copy of a mirrored file, checked against the object's fence (§32). Needs write rights.
    FencedWriteChunks = 231: FencedWriteChunksReq => u32, idempotent = false, data = false;
    /// Asks, raises or holds an object's write fence, or releases a hold (§32). Needs write rights.
    FenceWrites = 232: FenceReq => FenceResp, idempotent = false, data = false;
    /// `Fsync`, answered with the server's write verifier (docs/format.md §33): a client whose writes since its
    /// last sync went to an incarnation with another verifier knows they may be lost. Needs read or write rights.
    FsyncVerified = 233: FsyncReq => u64, idempotent = true, data = false;
    /// The server's write verifier (§33), asked once per connection before it carries a write. Needs no capability.
    WriteVerifier = 234: () => u64, idempotent = true, data = false;
}

/// What a fenced write carries (docs/format.md §32): the object epoch its writer learned, or the id of the hold
/// it writes under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteFence {
    /// At least 1: refused (`EpochMoved`) below the object's epoch.
    pub epoch: u64,
    /// Non-zero: a write under that hold, admitted only while it is in place (`HoldLost` otherwise).
    pub hold: u64,
}

impl WriteFence {
    /// What an unfenced op (`Write`, `Truncate`, `WriteChunks`) stands for: no epoch checked, refused only while
    /// a hold is in place.
    pub const NONE: WriteFence = WriteFence { epoch: 0, hold: 0 };

    /// A writer's fence at `epoch`.
    pub fn at(epoch: u64) -> WriteFence {
        WriteFence { epoch, hold: 0 }
    }
}

/// Most milliseconds one hold lasts (docs/format.md §32): a copier renews nothing, so a crashed one holds writers
/// back at most this long.
pub const HOLD_TTL_MS_MAX: u32 = 30_000;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FencedWriteReq {
    pub ino: u64,
    pub offset: u64,
    pub cap: Capability,
    pub fence: WriteFence,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FencedTruncateReq {
    pub ino: u64,
    pub size: u64,
    pub cap: Capability,
    pub fence: WriteFence,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FencedWriteChunksReq {
    pub ino: u64,
    pub offset: u64,
    pub chunks: Vec<crate::chunk::Chunk>,
    pub cap: Capability,
    pub fence: WriteFence,
}

/// What `FenceWrites` does (docs/format.md §32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FenceAct {
    /// The object's epoch.
    Query,
    /// Raises the object's epoch by one, after the writes in progress on it.
    Bump,
    /// `Bump`, and holds back every other write or cut of the object that touches bytes `[start, end)`, for `ttl_ms`
    /// (1..=[`HOLD_TTL_MS_MAX`]).
    Hold { start: u64, end: u64, ttl_ms: u32 },
    /// Ends the hold `hold`, if it is still in place.
    Release { hold: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceReq {
    pub ino: u64,
    pub cap: Capability,
    pub act: FenceAct,
}

/// The object's epoch after the act, and the hold it took (0: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceResp {
    pub epoch: u64,
    pub hold: u64,
}

/// Most inode numbers one `ListObjects` reply carries.
pub const LIST_OBJECTS_MAX: u32 = 4096;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListObjectsReq {
    /// Exclusive: the listing starts above it (0 for the first page; inode 0 never exists).
    pub after: u64,
    /// At most this many (the server caps it at [`LIST_OBJECTS_MAX`]).
    pub limit: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListObjectsResp {
    /// Ascending inode numbers, each above the request's `after`.
    pub inos: Vec<u64>,
    /// No object above the last one listed.
    pub eof: bool,
}

/// The most data chunks an ec row has (`k` of §16), so the most versions a parity record names.
pub const EC_K_MAX: usize = 32;

/// The most rows one `ReadRows` or `WriteRows` names.
pub const ROWS_PER_REQUEST_MAX: u32 = 4096;

/// `ReadRows`: rows `[first_row, first_row + rows)` of the object, each `unit` bytes at object offset `row × unit`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadRowsReq {
    pub ino: u64,
    pub unit: u32,
    pub first_row: u64,
    pub rows: u32,
    /// Also send the rows' bytes.
    pub data: bool,
    pub cap: Capability,
}

/// One chunk's version record as found (docs/format.md §17).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkVersion {
    /// 0: never written with a version (the chunk is expected to be zeros).
    pub version: u64,
    /// The chunk's bytes match the record (its CRC, and every §5 block checksum): false means the write of this
    /// version did not complete (or the bytes rotted), so the chunk is missing.
    pub intact: bool,
    /// For a parity chunk, the versions of the `k` data chunks it was computed from; empty for a data chunk.
    pub parity_of: Vec<u64>,
}

/// One row's compare-and-set in a `WriteRows`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowWrite {
    /// The version the record must hold now (0 for none).
    pub expect: u64,
    /// The version written; greater than `expect`.
    pub version: u64,
    /// As [`ChunkVersion::parity_of`]; at most [`EC_K_MAX`] entries.
    pub parity_of: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteRowsReq {
    pub ino: u64,
    pub unit: u32,
    pub first_row: u64,
    /// One per row, `rows.len()` rows from `first_row`; the payload holds their chunks back to back, the last
    /// one possibly short (a file's short last row, §16), none of the others.
    pub rows: Vec<RowWrite>,
    pub cap: Capability,
}

/// `ReadChunkRange`: bytes `[offset, offset + len)` of the chunk of row `row` (object offset `row × unit +
/// offset`), `offset + len ≤ unit`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadChunkRangeReq {
    pub ino: u64,
    pub unit: u32,
    pub row: u64,
    pub offset: u32,
    pub len: u32,
    pub cap: Capability,
}

/// `WriteChunkRange`: the payload at `offset` of the chunk of row `row`, `offset + payload ≤ unit`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteChunkRangeReq {
    pub ino: u64,
    pub unit: u32,
    pub row: u64,
    pub offset: u32,
    pub write: RowWrite,
    pub cap: Capability,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionCreateReq {
    /// Free text naming the client in server logs.
    pub client_name: String,
    pub slots: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionCreateResp {
    pub session: u64,
    /// Slots granted (≤ requested): the most requests the client may have in flight.
    pub slots: u32,
}

/// Length of the nonces, proofs and keys of the authentication ops (HMAC-SHA256 outputs, 256-bit keys).
pub const AUTH_BYTES: usize = 32;

/// Longest `AuthBeginReq::key_id` a server accepts (defined beside the capability, which names key ids too).
pub use crate::capability::KEY_ID_BYTES_MAX;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthBeginReq {
    /// Which key the client proves ("cluster" for the cluster key).
    pub key_id: String,
    pub client_nonce: [u8; AUTH_BYTES],
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthBeginResp {
    pub server_nonce: [u8; AUTH_BYTES],
    /// HMAC-SHA256(key, "weft-auth-v1 server" ‖ key_id ‖ client_nonce ‖ server_nonce): the server holds the key.
    pub server_proof: [u8; AUTH_BYTES],
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthFinishReq {
    /// HMAC-SHA256(key, "weft-auth-v1 client" ‖ key_id ‖ client_nonce ‖ server_nonce).
    pub client_proof: [u8; AUTH_BYTES],
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionBindReq {
    pub session: u64,
    /// HMAC-SHA256(session secret, "weft-bind-v1" ‖ session LE ‖ this connection's client_nonce ‖ server_nonce).
    pub proof: [u8; AUTH_BYTES],
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LookupReq {
    pub parent: u64,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InoReq {
    pub ino: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAttrReq {
    pub ino: u64,
    pub set: SetAttrs,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateReq {
    pub parent: u64,
    pub name: String,
    pub mode: u32,
    /// Fail with `Exists` if the name exists; otherwise an existing regular file is returned as it is.
    pub exclusive: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MknodReq {
    pub parent: u64,
    pub name: String,
    /// One of the special kinds (`FileKind::is_special`).
    pub kind: FileKind,
    pub mode: u32,
    pub rdev: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MkdirReq {
    pub parent: u64,
    pub name: String,
    pub mode: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NameReq {
    pub parent: u64,
    pub name: String,
}

pub const RENAME_NOREPLACE: u32 = 1;
/// `RenameReq::flags`: swap the two names atomically; both must exist (renameat2's RENAME_EXCHANGE).
pub const RENAME_EXCHANGE: u32 = 2;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenameReq {
    pub src_parent: u64,
    pub src_name: String,
    pub dst_parent: u64,
    pub dst_name: String,
    /// Bit set of `RENAME_*`.
    pub flags: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SymlinkReq {
    pub parent: u64,
    pub name: String,
    pub target: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkReq {
    pub ino: u64,
    pub new_parent: u64,
    pub new_name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReaddirReq {
    pub ino: u64,
    /// Resume after this name (empty: from the start). Names are a stable cursor under concurrent changes.
    pub after: String,
    /// At most this many entries (the server caps it at `READDIR_ENTRIES_MAX`).
    pub limit: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReaddirResp {
    pub entries: Vec<DirEntry>,
    pub eof: bool,
}

/// Op 147's reply: the create's open, and the directory's attributes read right after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateOpenDirResp {
    pub open: OpenResp,
    pub dir: Attr,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitWccResp {
    /// mtime and size just before this commit.
    pub pre_mtime_ns: i64,
    pub pre_size: u64,
    /// The attributes after it.
    pub attr: Attr,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReaddirPlusResp {
    /// Each entry's name with its inode's attributes, in name order.
    pub entries: Vec<(String, Attr)>,
    pub eof: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetLayoutReq {
    pub ino: u64,
    /// A policy: `servers` empty, `stripe_count` 0 meaning every server.
    pub layout: Layout,
}

/// `SetSizeOpen` (op 142).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetSizeOpenReq {
    pub ino: u64,
    pub size: u64,
    /// The write capability the caller's open got (`Open`, `CreateOpen`): its proof of the right to write.
    pub cap: Capability,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitReq {
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterServerReq {
    pub id: u32,
    /// Address clients use to reach the server.
    pub addr: String,
    pub space: SpaceStat,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterServerDevReq {
    pub id: u32,
    /// Address clients use to reach the server.
    pub addr: String,
    pub space: SpaceStatDev,
}

/// The reply to a data server's heartbeat (126, docs/format.md §19): what the MDS now reports it as, and the
/// silence after which the MDS would declare it failed, so the server's lease to serve clients ends before that.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatResp {
    /// `Up` or `Spare`: the server may serve clients; `Draining`: it came back after it was declared failed.
    pub state: ServerState,
    /// The MDS's `rebuild_after_ms`.
    pub rebuild_after_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadReq {
    pub ino: u64,
    pub offset: u64,
    pub len: u32,
    pub cap: Capability,
    /// Asks the data server to store the whole cache-bank blocks of what it read (after replying).
    pub fill: Option<FillHint>,
}

/// A read's request that the data server fill the cache bank with what it read (docs/format.md §12). The server
/// names the blocks itself: the data version sealed in the read's capability and its own id. `data_version` (the
/// file's at the reader's open) is used only by a server with authentication off, where capabilities are empty.
/// A server with no bank ignores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FillHint {
    pub data_version: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteReq {
    pub ino: u64,
    pub offset: u64,
    pub cap: Capability,
}

/// Most bytes one `VerifyObject` covers: bounds the time a request holds its range lock and a server's thread.
pub const VERIFY_BYTES_MAX: u64 = 64 << 20;

/// Most bad block offsets one `VerifyResp` lists; `bad_more` says there were more.
pub const VERIFY_BAD_MAX: usize = 1024;

/// `VerifyObject` (docs/format.md §20).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReq {
    pub ino: u64,
    pub offset: u64,
    /// At most [`VERIFY_BYTES_MAX`].
    pub len: u64,
    pub cap: Capability,
}

/// `VerifyObject`'s answer (docs/format.md §20).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyResp {
    /// The object's length in bytes (0 for a missing object).
    pub object_len: u64,
    /// Object offsets (multiples of 4096) of the blocks in the range that fail their checksum or were written and
    /// are lost past the object's end, ascending, at most [`VERIFY_BAD_MAX`].
    pub bad: Vec<u64>,
    /// More bad blocks than `bad` lists.
    pub bad_more: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TruncateReq {
    pub ino: u64,
    pub size: u64,
    pub cap: Capability,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsyncReq {
    pub ino: u64,
    pub cap: Capability,
}

/// Most NFS addresses one data server may announce (op 140).
pub const PNFS_ADDRS_MAX: usize = 16;
/// The prefix of a pNFS address served over RPC-over-RDMA (netid `rdma`/`rdma6`, docs/format.md §23): an address
/// without it is TCP (netid `tcp`/`tcp6`).
pub const PNFS_RDMA_PREFIX: &str = "rdma:";

/// A pNFS address as op 140 carries it, `ip:port` (TCP) or `rdma:ip:port` (RPC-over-RDMA): whether it is RDMA,
/// and the socket address. `None` when it is neither.
pub fn parse_pnfs_addr(a: &str) -> Option<(bool, std::net::SocketAddr)> {
    match a.strip_prefix(PNFS_RDMA_PREFIX) {
        Some(rest) => rest.parse().ok().map(|s| (true, s)),
        None => a.parse().ok().map(|s| (false, s)),
    }
}
/// The key id of every pNFS data-server filehandle's capability (docs/format.md §23): a name no key may have, so no
/// connection proves it; a keyring or key file naming it is refused.
pub const PNFS_KEY_ID: &str = "pnfs";

/// `PnfsHandle` (op 137).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PnfsHandleReq {
    pub ino: u64,
    /// `Rights::READ`, or `Rights::READ_WRITE` for a layout that may write.
    pub rights: Rights,
}

/// `PnfsHandle`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PnfsHandleResp {
    /// Sealed for key id [`PNFS_KEY_ID`] (version 0 from an MDS with authentication off).
    pub cap: Capability,
}

/// One pNFS device (op 138): a data server and the NFS addresses (`ip:port`, or `rdma:ip:port` for RPC-over-RDMA)
/// it announced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PnfsDeviceInfo {
    pub server: u32,
    pub addrs: Vec<String>,
}

/// `MetaBackup` (op 141).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaBackupReq {
    /// Where the copy goes, on the metadata service's host: an absolute path, absent or an empty directory.
    pub dir: String,
}

/// What a backup copied: record counts per table and a CRC-32C over every record (docs/format.md §29).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaBackupResp {
    pub inodes: u64,
    pub dirents: u64,
    pub xattrs: u64,
    pub stale: u64,
    pub orphans: u64,
    pub servers: u64,
    pub crc: u32,
}

/// `RegisterPnfs` (op 140).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterPnfsReq {
    /// The data server's id (as in `RegisterServerDev`).
    pub id: u32,
    /// At most [`PNFS_ADDRS_MAX`] socket addresses, `ip:port` (IPv6 as `[ip]:port`), each prefixed by
    /// [`PNFS_RDMA_PREFIX`] when served over RPC-over-RDMA ([`parse_pnfs_addr`]).
    pub addrs: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewOpenReq {
    pub ino: u64,
    /// The rights to renew: those of the open (`cap` must grant them).
    pub rights: Rights,
    /// The capability being renewed: its MAC, inode, rights and key prove the open; its expiry does not matter.
    pub cap: Capability,
}

impl Response {
    /// The attributes a reply carries of the inode it is about (a lookup's child, a create's new inode, an open's
    /// file), if it carries them.
    pub fn attr(&self) -> Option<&Attr> {
        match self {
            Response::Lookup(a)
            | Response::GetAttr(a)
            | Response::SetAttr(a)
            | Response::NfsSetAttr(a)
            | Response::SetSizeOpen(a)
            | Response::Create(a)
            | Response::Mkdir(a)
            | Response::Symlink(a)
            | Response::Mknod(a)
            | Response::Link(a)
            | Response::SetLayout(a)
            | Response::Commit(a) => Some(a),
            Response::Open(o) | Response::CreateOpen(o) | Response::RenewOpen(o) | Response::NfsOpen(o) => {
                Some(&o.attr)
            }
            Response::CreateOpenDir(r) => Some(&r.open.attr),
            Response::CommitWcc(w) => Some(&w.attr),
            _ => None,
        }
    }
}

/// Op 146's request (docs/format.md §31).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseWaitReq {
    /// The epoch the client holds its leases under (0 before its first reply): `acked` counts in it, and a call
    /// naming the holder's current epoch confirms that the client dropped what it held under earlier ones.
    pub epoch: u64,
    /// Every recall numbered up to this one was applied.
    pub acked: u64,
    /// How long the service may hold the call when no recall waits.
    pub hold_ms: u32,
}

/// Op 146's reply (docs/format.md §31).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseWaitResp {
    /// The holder's lease epoch; a new one means every lease held before is gone. 0: no leases are granted.
    pub epoch: u64,
    /// How long leases may be trusted after the answered call was sent.
    pub lease_ms: u32,
    /// The number of the last recall in `recalls` (the next call's `acked`).
    pub upto: u64,
    pub recalls: Vec<Recall>,
}

/// One recalled lease: an inode's attributes (`name: None`) or a directory's entry `name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Recall {
    pub ino: u64,
    pub name: Option<String>,
}

/// At most this many recalls in one `LeaseWait` reply.
pub const RECALLS_PER_REPLY_MAX: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenReq {
    pub ino: u64,
    /// `Rights::READ`, `Rights::WRITE` or both.
    pub rights: Rights,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenResp {
    /// Fresh attributes (close-to-open), layout included.
    pub attr: Attr,
    /// Sealed for the connection that asked (empty, version 0, from an MDS with authentication off).
    pub cap: Capability,
    /// The capability's lifetime as issued: the client renews it once less than a third remains, timed by its own
    /// clock from the reply's arrival (so client and MDS clocks need not agree).
    pub ttl_ms: u64,
}

/// `SetXattrReq::flags`: fail with `Exists` if the attribute exists (Linux's XATTR_CREATE).
pub const XATTR_CREATE: u32 = 1;
/// `SetXattrReq::flags`: fail with `NoData` if the attribute does not exist (Linux's XATTR_REPLACE).
pub const XATTR_REPLACE: u32 = 2;

/// A lock's class: POSIX record locks (`fcntl`, NFSv4) and `flock` whole-file locks never conflict with each
/// other, as on Linux.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LockClass {
    Posix,
    Flock,
}

/// Shared (F_RDLCK, LOCK_SH, READ_LT) or exclusive (F_WRLCK, LOCK_EX, WRITE_LT).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LockKind {
    Shared,
    Exclusive,
}

/// `SetLock`: `kind = None` unlocks `[start, end]`. Ranges are inclusive; `end = u64::MAX` is "to EOF". A `Flock`
/// lock is whole-file whatever the range says. `pid` only names the holder in F_GETLK reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetLockReq {
    pub ino: u64,
    pub class: LockClass,
    pub kind: Option<LockKind>,
    pub start: u64,
    pub end: u64,
    pub owner: u64,
    pub pid: u32,
}

/// `GetLock`: would `owner` get a `kind` lock on `[start, end]`?
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetLockReq {
    pub ino: u64,
    pub class: LockClass,
    pub kind: LockKind,
    pub start: u64,
    pub end: u64,
    pub owner: u64,
}

/// A lock that stands in the way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockHolder {
    pub class: LockClass,
    pub kind: LockKind,
    pub start: u64,
    pub end: u64,
    pub pid: u32,
}

/// Rows `[start, end)` of one server's chunks of a file that the server missed (docs/format.md §18). For `ec k+m`
/// a row is a stripe row (object bytes `[row·u, (row+1)·u)` of every server); for `mirror n` a row is `u` file
/// bytes. `end == u64::MAX` reaches the end of the file whatever its size (a whole slot). `seq` numbers the range
/// (unique in the MDS): a range marked again gets a new one, which is how a heal knows it raced a new write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StaleRange {
    pub start: u64,
    pub end: u64,
    pub seq: u64,
}

/// `MarkStale`: the server at `slot` (index into the file's `Layout::servers`) missed rows `[start, end)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MarkStaleReq {
    pub ino: u64,
    pub slot: u32,
    pub start: u64,
    pub end: u64,
}

/// `ListStale`: entries after `after` ((ino, slot), exclusive) in key order, at most `limit` (0: the server's
/// page size, at most [`STALE_PAGE_MAX`]); with `ino`, only that file's entries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListStaleReq {
    pub ino: Option<u64>,
    pub after: Option<(u64, u32)>,
    pub limit: u32,
}

/// Most entries one `ListStale` page carries.
pub const STALE_PAGE_MAX: u32 = 1024;

/// The stale ranges of one (file, slot), sorted, not overlapping.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StaleEntry {
    pub ino: u64,
    pub slot: u32,
    pub ranges: Vec<StaleRange>,
}

/// What the healer reports of itself (zeros when no healer runs beside the MDS).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealProgress {
    /// Whether a healer runs beside this MDS.
    pub running: bool,
    /// Bytes of chunks its last pass found to heal and has not healed yet.
    pub bytes_left: u64,
    /// Bytes of chunks healed since it started.
    pub bytes_healed: u64,
    /// Healing rate over its last pass, bytes per second (0 when idle).
    pub rate_bytes_per_s: u64,
    /// Stale ranges cleared since it started.
    pub ranges_healed: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListStaleResp {
    pub entries: Vec<StaleEntry>,
    /// More entries follow the last one.
    pub more: bool,
    /// Total stale entries in the table.
    pub total_entries: u64,
    pub progress: HealProgress,
}

/// `ClearStale`: rows `[start, end)` of the range numbered `seq` of (ino, slot) were healed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClearStaleReq {
    pub ino: u64,
    pub slot: u32,
    pub start: u64,
    pub end: u64,
    pub seq: u64,
}

/// `AdoptLocks`: the session whose locks the caller takes over (docs/format.md §22).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdoptLocksReq {
    pub previous_session: u64,
}

/// Most locks an `AdoptLocksResp` lists (its `total` counts them all).
pub const ADOPTED_LIST_MAX: usize = 65_536;

/// One lock `AdoptLocks` moved, as it was held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdoptedLock {
    pub ino: u64,
    pub owner: u64,
    pub class: LockClass,
    pub kind: LockKind,
    pub start: u64,
    pub end: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdoptLocksResp {
    /// At most [`ADOPTED_LIST_MAX`] of the moved locks.
    pub locks: Vec<AdoptedLock>,
    /// How many locks moved.
    pub total: u64,
}

/// `ReleaseLocks`: `None` matches every inode / every owner of the caller's session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseLocksReq {
    pub ino: Option<u64>,
    pub owner: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct XattrReq {
    pub ino: u64,
    /// The full name with its namespace prefix (`user.`, `trusted.`, `security.`, `system.`).
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetXattrReq {
    pub ino: u64,
    pub name: String,
    pub value: Vec<u8>,
    /// 0, [`XATTR_CREATE`] or [`XATTR_REPLACE`].
    pub flags: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadChunksReq {
    pub ino: u64,
    pub offset: u64,
    /// Where the bytes go, in order; their lengths add up to the length read.
    pub chunks: Vec<crate::chunk::Chunk>,
    pub cap: Capability,
    /// As [`ReadReq::fill`].
    pub fill: Option<FillHint>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteChunksReq {
    pub ino: u64,
    pub offset: u64,
    /// Where the bytes come from, in order; their lengths add up to the length written.
    pub chunks: Vec<crate::chunk::Chunk>,
    pub cap: Capability,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionsReq {
    pub add: Vec<crate::chunk::Region>,
    /// Ids deregistered before `add` is applied (batched deregistration).
    pub remove: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricInfoResp {
    /// Identifies the server's machine (Linux boot id): equal to the client's means "same host".
    pub host_id: String,
    /// Address of the server's `shm` listener (`unix:/path`), if it has one.
    pub shm_addr: Option<String>,
    /// Address of the server's `rdma` side channel (`rdma:host:port`), if it has an RDMA device.
    pub rdma_addr: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricStat {
    /// Open one-sided connections holding a client's arena (mapped over shm, registered over rdma).
    pub arenas: u64,
    /// Client memory regions registered over all connections (arenas excluded).
    pub regions: u64,
    /// Chunk lists refused because a chunk lay outside the registered regions.
    pub chunks_refused: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pnfs_addresses_carry_their_netid_in_a_prefix() {
        let a = |s: &str| s.parse::<std::net::SocketAddr>().unwrap();
        assert_eq!(parse_pnfs_addr("10.0.2.15:2049"), Some((false, a("10.0.2.15:2049"))));
        assert_eq!(parse_pnfs_addr("rdma:10.0.2.15:20049"), Some((true, a("10.0.2.15:20049"))));
        assert_eq!(parse_pnfs_addr("rdma:[::1]:20049"), Some((true, a("[::1]:20049"))));
        for bad in ["", "rdma:", "rdma:host:1", "tcp:10.0.0.1:1", "RDMA:10.0.0.1:1", "10.0.0.1", "rdma:rdma:10.0.0.1:1"]
        {
            assert_eq!(parse_pnfs_addr(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn requests_round_trip_by_op() {
        let reqs = vec![
            Request::Null(()),
            Request::Lookup(LookupReq { parent: 1, name: "a".into() }),
            Request::Write(WriteReq { ino: 9, offset: 1 << 40, cap: Capability::none() }),
            Request::Read(ReadReq { ino: 9, offset: 4096, len: 8192, cap: Capability::none(), fill: None }),
            Request::Read(ReadReq {
                ino: 9,
                offset: 0,
                len: 1,
                cap: Capability::none(),
                fill: Some(FillHint { data_version: u64::MAX }),
            }),
            Request::Rename(RenameReq {
                src_parent: 1,
                src_name: "x".into(),
                dst_parent: 2,
                dst_name: "y".into(),
                flags: RENAME_NOREPLACE,
            }),
        ];
        for r in reqs {
            let body = r.encode_body();
            assert_eq!(Request::decode(r.op() as u16, &body).unwrap(), r);
        }
    }

    /// The byte layout docs/format.md §9 gives: nonces and proofs are 32 raw bytes, no length prefix.
    #[test]
    fn auth_bodies_have_the_documented_layout() {
        let begin = Request::AuthBegin(AuthBeginReq { key_id: "cluster".into(), client_nonce: [7; AUTH_BYTES] });
        let body = begin.encode_body();
        assert_eq!(body.len(), 1 + 7 + 32);
        assert_eq!((body[0], &body[1..8], &body[8..]), (7, &b"cluster"[..], &[7u8; 32][..]));
        assert_eq!(Request::decode(Op::AuthBegin as u16, &body).unwrap(), begin);
        let finish = Request::AuthFinish(AuthFinishReq { client_proof: [9; AUTH_BYTES] });
        assert_eq!(finish.encode_body(), vec![9u8; 32]);
        let resp = Response::AuthBegin(AuthBeginResp { server_nonce: [1; AUTH_BYTES], server_proof: [2; AUTH_BYTES] });
        let body = resp.encode_body();
        assert_eq!((&body[..32], &body[32..]), (&[1u8; 32][..], &[2u8; 32][..]));
        let bind = Request::SessionBind(SessionBindReq { session: 300, proof: [3; AUTH_BYTES] });
        let body = bind.encode_body();
        assert_eq!(&body[..2], &[0xac, 0x02], "the session is a varint");
        assert_eq!(Request::decode(Op::SessionBind as u16, &body).unwrap(), bind);
        assert!(Request::decode(Op::AuthFinish as u16, &[9; 31]).is_err(), "a short proof is refused");
    }

    /// docs/format.md §2: the fill hint is the last field, an option (0 = none, 1 then the hint's varint).
    #[test]
    fn the_fill_hint_is_the_last_field() {
        let none = ReadReq { ino: 1, offset: 2, len: 3, cap: Capability::none(), fill: None };
        let body = Request::Read(none.clone()).encode_body();
        assert_eq!(body.last(), Some(&0));
        let some = ReadReq { fill: Some(FillHint { data_version: 300 }), ..none };
        let with = Request::Read(some).encode_body();
        assert_eq!(&with[..body.len() - 1], &body[..body.len() - 1]);
        assert_eq!(&with[body.len() - 1..], &[1, 0xac, 0x02]);
        assert!(Request::decode(Op::Read as u16, &body[..body.len() - 1]).is_err(), "the hint is not optional");
    }

    #[test]
    fn a_create_mode_carries_the_umask_in_its_documented_bits() {
        // docs/format.md §13: bit 31 flags it, bits 16..=24 hold it, the mode keeps its 12 low bits.
        let m = crate::mode_with_umask(0o102755, 0o022);
        assert_eq!(m, 0x8000_0000 | (0o022 << 16) | 0o2755);
        assert_eq!(crate::split_mode_umask(m), (0o2755, Some(0o022)));
        assert_eq!(crate::split_mode_umask(0o644), (0o644, None), "without the flag the mode is final");
    }

    #[test]
    fn decoding_rejects_garbage() {
        assert_eq!(Request::decode(999, &[]), Err(FrameError::UnknownOp(999)));
        assert!(matches!(Request::decode(Op::Lookup as u16, &[1]), Err(FrameError::BadBody { .. })));
        let mut body = Request::Null(()).encode_body();
        body.push(0);
        assert!(matches!(Request::decode(Op::Null as u16, &body), Err(FrameError::BadBody { .. })));
    }

    #[test]
    fn op_codes_are_pinned() {
        // Changing a number here breaks every deployed peer: op codes are never renumbered.
        assert_eq!(Op::Null as u16, 1);
        assert_eq!((Op::AuthBegin as u16, Op::AuthFinish as u16, Op::SessionBind as u16), (4, 5, 6));
        assert_eq!(Op::Lookup as u16, 100);
        assert_eq!(Op::RegisterServer as u16, 116);
        assert_eq!(Op::ReaddirPlus as u16, 117);
        assert_eq!(Op::CommitWcc as u16, 118);
        assert_eq!(Op::Mknod as u16, 119);
        assert_eq!((Op::Open as u16, Op::CreateOpen as u16), (120, 121));
        assert_eq!((Op::GetXattr as u16, Op::SetXattr as u16), (122, 123));
        assert_eq!((Op::ListXattr as u16, Op::RemoveXattr as u16), (124, 125));
        assert!(Op::GetXattr.is_idempotent() && !Op::SetXattr.is_idempotent() && !Op::RemoveXattr.is_idempotent());
        assert_eq!((Op::RemoveObject as u16, Op::SpaceStat as u16), (203, 204));
        assert_eq!((Op::Read as u16, Op::Write as u16, Op::Truncate as u16), (211, 212, 213));
        assert_eq!((Op::Fsync as u16, Op::ReadChunks as u16, Op::WriteChunks as u16), (214, 215, 216));
        // Retired codes stay holes: a peer from before capabilities gets a clear "unknown op".
        for retired in [200, 201, 202, 205, 206, 207] {
            assert_eq!(Op::from_u16(retired), None);
        }
        assert_eq!(Op::Regions as u16, 208);
        assert_eq!(Op::FabricInfo as u16, 209);
        assert_eq!(Op::FabricStat as u16, 210);
        assert_eq!((Op::RegisterServerDev as u16, Op::SpaceStatDev as u16), (126, 217));
        assert_eq!(Op::VerifyObject as u16, 228);
        assert_eq!(Op::FencedWrite as u16, 229);
        assert_eq!(Op::FencedTruncate as u16, 230);
        assert_eq!(Op::FencedWriteChunks as u16, 231);
        assert_eq!(Op::FenceWrites as u16, 232);
        assert_eq!((Op::FsyncVerified as u16, Op::WriteVerifier as u16), (233, 234));
        assert!(Op::FsyncVerified.is_idempotent() && Op::WriteVerifier.is_idempotent());
        assert!(Op::FencedWrite.request_has_data() && !Op::FenceWrites.is_idempotent());
        assert!(Op::VerifyObject.is_idempotent());
        assert_eq!((Op::SetLock as u16, Op::GetLock as u16, Op::ReleaseLocks as u16), (127, 128, 129));
        assert_eq!((Op::ReadRows as u16, Op::WriteRows as u16), (218, 219));
        assert_eq!((Op::ReadChunkRange as u16, Op::WriteChunkRange as u16), (220, 221));
        assert!(Op::WriteChunkRange.request_has_data() && !Op::WriteChunkRange.is_idempotent());
        assert!(Op::ReadChunkRange.is_idempotent() && !Op::ReadChunkRange.request_has_data());
        assert!(Op::WriteRows.request_has_data() && !Op::WriteRows.is_idempotent() && Op::ReadRows.is_idempotent());
        assert_eq!((Op::MemberStatus as u16, Op::ListObjects as u16), (135, 224));
        assert_eq!(Op::AdoptLocks as u16, 136);
        assert!(!Op::AdoptLocks.is_idempotent());
        assert_eq!((Op::PnfsHandle as u16, Op::PnfsDevices as u16, Op::RegisterPnfs as u16), (137, 138, 140));
        assert!(Op::PnfsHandle.is_idempotent() && Op::PnfsDevices.is_idempotent() && Op::RegisterPnfs.is_idempotent());
        assert_eq!(Op::MetaBackup as u16, 141);
        assert!(!Op::MetaBackup.is_idempotent());
        assert_eq!(Op::SetSizeOpen as u16, 142);
        assert!(!Op::SetSizeOpen.is_idempotent());
        assert_eq!(Op::LeaseWait as u16, 146);
        assert!(Op::LeaseWait.is_idempotent());
        assert!(Op::MemberStatus.is_idempotent() && Op::ListObjects.is_idempotent());
        assert!(!Op::SetLock.is_idempotent() && Op::GetLock.is_idempotent() && !Op::ReleaseLocks.is_idempotent());
        assert!(Op::Write.request_has_data() && !Op::Read.request_has_data());
        assert!(Op::Read.is_idempotent() && !Op::Create.is_idempotent());
    }
}
