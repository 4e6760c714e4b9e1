//! NFSv4.1 server state (RFC 8881 §2.10, §8, §9): clients, sessions with their slot tables and reply caches,
//! open and lock stateids with share reservations, leases and the grace period after a start.
//!
//! Pure: no I/O and no clock of its own. Every call that depends on time takes `now_ms` (a monotonic
//! millisecond clock the caller reads), so tests walk lease expiry and grace without sleeping. Whatever the MDS
//! must be told (locks of an expired or destroyed client to release) is returned to the caller as lock-owner ids.
//!
//! Bounded: at most `clients_max` clients, `sessions_max` sessions, `slots_max` slots per session (each caching
//! one reply of at most `cached_reply_bytes_max`), `stateids_max` stateids; a full table is NFS4ERR_RESOURCE
//! (the client backs off), never growth. pNFS layouts (docs/format.md §24): at most `layouts_max` layout stateids
//! (full: NFS4ERR_LAYOUTTRYLATER) and `devices_max` devices, a device being the ordered server list of a layout;
//! a full device table forgets the devices no layout names, and a device id is never reused within an epoch.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use ring::hmac;

use super::consts::*;
use super::layout::{DeviceId, IOMODE_RW};
use crate::restart::OwnerKey;

/// The state's bounds and times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateConfig {
    /// A client not heard from (SEQUENCE) for this long loses its state.
    pub lease_ms: u64,
    /// After the gateway starts, only reclaims (CLAIM_PREVIOUS opens, reclaim locks) for this long.
    pub grace_ms: u64,
    pub clients_max: usize,
    pub sessions_max: usize,
    pub slots_max: u32,
    pub ops_max: u32,
    pub cached_reply_bytes_max: u32,
    pub request_bytes_max: u32,
    pub reply_bytes_max: u32,
    pub stateids_max: usize,
    /// Sessions one client holds at once (past it CREATE_SESSION is NFS4ERR_RESOURCE): one client cannot fill the
    /// session table for everyone.
    pub sessions_per_client_max: usize,
    /// Open and lock stateids one client holds at once (past it OPEN and a new lock-owner's LOCK are
    /// NFS4ERR_RESOURCE, logged with the client's owner): one client cannot fill the stateid table.
    pub stateids_per_client_max: usize,
    /// Clients made by EXCHANGE_IDs from one IP address and alive at once (past it a new client owner from that
    /// address is NFS4ERR_RESOURCE, logged with the address): one host cannot fill the client table with made-up
    /// owner strings. A Linux host uses one client per server and network namespace.
    pub clients_per_address_max: usize,
    /// pNFS layout stateids held at once (one per client and file).
    pub layouts_max: usize,
    /// pNFS devices (distinct ordered server lists) remembered.
    pub devices_max: usize,
    /// Callbacks queued or in flight per session's back channel; past it a recall is not sent and the layout is
    /// revoked (dropped, not queued).
    pub callbacks_max: usize,
    /// A recalled layout not returned (or answered NFS4ERR_NOMATCHING_LAYOUT) this long after its CB_LAYOUTRECALL
    /// was sent is revoked; until then LAYOUTGET of the file by that client is NFS4ERR_RECALLCONFLICT.
    pub recall_ms: u64,
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            lease_ms: 90_000,
            grace_ms: 90_000,
            clients_max: 1024,
            sessions_max: 1024,
            slots_max: 64,
            ops_max: 32,
            cached_reply_bytes_max: 16 * 1024,
            // The record bound (1 MiB + 4096) less room for the RPC header and credential.
            request_bytes_max: (1 << 20) + 3072,
            reply_bytes_max: (1 << 20) + 3072,
            stateids_max: 65_536,
            sessions_per_client_max: 16,
            stateids_per_client_max: 16_384,
            clients_per_address_max: 64,
            layouts_max: 65_536,
            devices_max: 4096,
            callbacks_max: 64,
            recall_ms: 10_000,
        }
    }
}

/// A stateid (RFC 8881 §8.2): `seqid` then 12 bytes `other` = boot epoch (4, BE), kind (1), zero (3), index
/// (4, BE). docs/format.md §21.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stateid {
    pub seqid: u32,
    pub other: [u8; 12],
}

pub const KIND_OPEN: u8 = 1;
pub const KIND_LOCK: u8 = 2;
pub const KIND_LAYOUT: u8 = 3;
/// The kind byte of a device id (docs/format.md §24).
pub const KIND_DEVICE: u8 = 4;

/// A whole-file layout a client holds (docs/format.md §24).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutRec {
    pub clientid: u64,
    pub ino: u64,
    pub seqid: u32,
    /// The iomodes held, as bits: LAYOUTIOMODE4_READ (1) and LAYOUTIOMODE4_RW (2).
    pub iomodes: u32,
    pub device: DeviceId,
    /// The file's servers in stripe order and its layout generation when the layout was handed out.
    pub servers: Vec<u32>,
    pub generation: u64,
    /// Recalled (CB_LAYOUTRECALL): revoked if still held at this time (ms of the state's clock).
    pub recall_deadline_ms: Option<u64>,
}

/// Device ids ↔ ordered server lists: ids count up from 1 and are never reused in an epoch, so a client's cached
/// device can never come to mean other servers.
#[derive(Debug, Default)]
struct Devices {
    by_servers: HashMap<Vec<u32>, u64>,
    by_index: BTreeMap<u64, Vec<u32>>,
    next: u64,
}

impl Stateid {
    pub const ANONYMOUS: Stateid = Stateid { seqid: 0, other: [0; 12] };
    pub const BYPASS: Stateid = Stateid { seqid: u32::MAX, other: [0xff; 12] };
    pub const CURRENT: Stateid = Stateid { seqid: 1, other: [0; 12] };
    pub const INVALID: Stateid = Stateid { seqid: u32::MAX, other: [0; 12] };

    /// The anonymous or the read-bypass stateid: I/O without an open (served, share reservations aside).
    pub fn is_special(&self) -> bool {
        *self == Stateid::ANONYMOUS || *self == Stateid::BYPASS
    }

    fn make(epoch: u32, kind: u8, index: u32, seqid: u32) -> Stateid {
        let mut other = [0u8; 12];
        other[..4].copy_from_slice(&epoch.to_be_bytes());
        other[4] = kind;
        other[8..].copy_from_slice(&index.to_be_bytes());
        Stateid { seqid, other }
    }
}

/// The fore channel's negotiated sizes (`channel_attrs4`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChannelAttrs {
    pub header_pad_bytes: u32,
    pub request_bytes_max: u32,
    pub reply_bytes_max: u32,
    pub cached_reply_bytes_max: u32,
    pub ops_max: u32,
    pub slots_max: u32,
}

#[derive(Debug)]
struct Slot {
    seqid: u32,
    /// The reply of `seqid`; None while it runs, or when it was too large to cache.
    reply: Option<Vec<u8>>,
    in_use: bool,
}

#[derive(Debug)]
struct Session {
    clientid: u64,
    slots: Vec<Slot>,
    fore: ChannelAttrs,
}

/// Who a client is at the RPC layer (RFC 8881 §2.4): the credential's flavor and, for AUTH_SYS, its uid and gid as
/// sent (before any root squash). A client record belongs to the principal whose EXCHANGE_ID made it: another
/// principal can neither take its owner string while its lease lives nor create, destroy or bind its sessions, nor
/// destroy it. (Every user's ops ride on the client's sessions: SEQUENCE itself is not bound.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Principal {
    pub flavor: u32,
    pub uid: u32,
    pub gid: u32,
}

impl Principal {
    /// The principal of an RPC credential.
    pub fn of(auth: &crate::rpc::Auth) -> Principal {
        match auth {
            crate::rpc::Auth::None => Principal { flavor: crate::rpc::AUTH_NONE, uid: 0, gid: 0 },
            crate::rpc::Auth::Sys { uid, gid, .. } => Principal { flavor: crate::rpc::AUTH_SYS, uid: *uid, gid: *gid },
        }
    }
}

/// Client and session ids no one can guess from those they saw: the first bytes of HMAC-SHA256(secret, label ‖
/// counter), the secret drawn at each start ([`State::with_id_secret`]); without one (unit tests) the counter.
#[derive(Default)]
struct Ids {
    key: Option<hmac::Key>,
    counter: u64,
}

impl std::fmt::Debug for Ids {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ids").field("keyed", &self.key.is_some()).finish_non_exhaustive()
    }
}

impl Ids {
    fn next(&mut self, label: &[u8]) -> [u8; 8] {
        self.counter += 1;
        // Unkeyed: the counter's low half first, so a clientid (the first 4 bytes) counts 1, 2, 3 …
        let Some(key) = &self.key else { return self.counter.rotate_left(32).to_be_bytes() };
        let mut ctx = hmac::Context::with_key(key);
        ctx.update(label);
        ctx.update(&self.counter.to_be_bytes());
        let tag = ctx.sign();
        tag.as_ref()[..8].try_into().expect("8 of 32 bytes")
    }
}

#[derive(Debug)]
struct ClientRec {
    owner: Vec<u8>,
    principal: Principal,
    /// The IP address its EXCHANGE_ID came from (counted against `clients_per_address_max`).
    addr: IpAddr,
    verifier: [u8; 8],
    confirmed: bool,
    /// The last CREATE_SESSION sequence id processed, and its reply.
    cs_seq: u32,
    cs_reply: Option<(u32, CreatedSession)>,
    renewed_ms: u64,
    reclaim_complete: bool,
    sessions: Vec<[u8; 16]>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateKind {
    Open {
        owner: Vec<u8>,
        access: u32,
        deny: u32,
    },
    /// `held`: the lock-owner may hold locks on the file through this stateid: set before a LOCK goes to the MDS
    /// (so a FREE_STATEID racing it is LOCKS_HELD), cleared by a LOCKU of the whole file.
    Lock {
        owner: Vec<u8>,
        open: [u8; 12],
        mds_owner: u64,
        held: bool,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateRec {
    pub clientid: u64,
    pub ino: u64,
    pub seqid: u32,
    pub kind: StateKind,
}

/// What CREATE_SESSION answers (cached for its replay).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreatedSession {
    pub sessionid: [u8; 16],
    pub seq: u32,
    pub fore: ChannelAttrs,
}

/// What EXCHANGE_ID answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exchanged {
    pub clientid: u64,
    pub seq: u32,
    pub confirmed: bool,
}

/// What SEQUENCE decided for a compound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeqOutcome {
    /// Run the compound; its reply is then [`State::finish`]ed into the slot.
    New { clientid: u64, highest_slot: u32 },
    /// A retry of the slot's last request: send this reply again, run nothing.
    Replay(Vec<u8>),
}

pub struct State {
    cfg: StateConfig,
    epoch: u32,
    started_ms: u64,
    next: u32,
    clients: HashMap<u64, ClientRec>,
    sessions: HashMap<[u8; 16], Session>,
    stateids: HashMap<[u8; 12], StateRec>,
    lock_owners: HashMap<(u64, Vec<u8>), u64>,
    owner_key: OwnerKey,
    layouts: HashMap<[u8; 12], LayoutRec>,
    devices: Devices,
    /// What each file with layouts out looked like when last handed out or checked (the periodic check).
    watched: HashMap<u64, Watched>,
    ids: Ids,
}

/// What a layout of a file depends on (docs/format.md §24, the periodic check).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watched {
    pub size: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub generation: u64,
}

impl Watched {
    pub fn of(a: &weft_proto::Attr) -> Watched {
        Watched {
            size: a.size,
            mode: a.mode & 0o7777,
            uid: a.uid,
            gid: a.gid,
            generation: a.layout.as_ref().map_or(0, |l| l.generation),
        }
    }
}

type R<T> = Result<T, u32>;

impl State {
    /// `epoch` distinguishes this start's clientids and stateids from the previous one's (a boot verifier);
    /// `now_ms` starts the grace period.
    pub fn new(cfg: StateConfig, epoch: u32, now_ms: u64) -> State {
        State {
            cfg,
            epoch,
            started_ms: now_ms,
            next: 0,
            clients: HashMap::new(),
            sessions: HashMap::new(),
            stateids: HashMap::new(),
            lock_owners: HashMap::new(),
            owner_key: OwnerKey::default(),
            layouts: HashMap::new(),
            devices: Devices::default(),
            watched: HashMap::new(),
            ids: Ids::default(),
        }
    }

    /// Client and session ids drawn under `secret` (fresh random bytes at each start), so a client cannot guess
    /// another's from its own.
    pub fn with_id_secret(mut self, secret: &[u8; 32]) -> State {
        self.ids.key = Some(hmac::Key::new(hmac::HMAC_SHA256, secret));
        self
    }

    /// A new clientid: this start's epoch, then 32 unguessable bits not in use.
    fn new_clientid(&mut self) -> u64 {
        loop {
            let low = u32::from_be_bytes(self.ids.next(b"client")[..4].try_into().expect("4 bytes"));
            let id = (self.epoch as u64) << 32 | low as u64;
            if low != 0 && !self.clients.contains_key(&id) {
                return id;
            }
        }
    }

    /// Whether client `clientid` may take one more open or lock stateid: the table has room, and the client holds
    /// fewer than its quota (counted only once the table holds that many at all, so a small table costs nothing).
    fn room_for_stateid(&self, clientid: u64) -> R<()> {
        if self.stateids.len() >= self.cfg.stateids_max {
            return Err(NFS4ERR_RESOURCE);
        }
        let quota = self.cfg.stateids_per_client_max;
        if self.stateids.len() >= quota && self.stateids.values().filter(|s| s.clientid == clientid).count() >= quota {
            let owner = self.clients.get(&clientid).map(|c| String::from_utf8_lossy(&c.owner).into_owned());
            tracing::warn!(
                clientid = format_args!("{clientid:#x}"),
                owner = owner.as_deref().unwrap_or("?"),
                quota,
                "OPEN or LOCK refused: the client holds its quota of stateids (NFS4ERR_RESOURCE)"
            );
            return Err(NFS4ERR_RESOURCE);
        }
        Ok(())
    }

    /// The client a principal may act on: known, and `principal`'s (else NFS4ERR_WRONG_CRED).
    fn client_of(&self, clientid: u64, principal: Principal) -> R<&ClientRec> {
        self.clientid_known(clientid)?;
        let c = &self.clients[&clientid];
        if c.principal != principal {
            return Err(NFS4ERR_WRONG_CRED);
        }
        Ok(c)
    }

    /// Whether `principal` made the client of session `sessionid` (BIND_CONN_TO_SESSION's check).
    pub fn session_principal_is(&self, sessionid: &[u8; 16], principal: Principal) -> R<()> {
        let s = self.sessions.get(sessionid).ok_or(NFS4ERR_BADSESSION)?;
        self.client_of(s.clientid, principal).map(|_| ())
    }

    /// The key MDS lock-owner ids are made with (docs/format.md §22): the gateway's, so they are the same in
    /// every process of it.
    pub fn with_owner_key(mut self, key: OwnerKey) -> State {
        self.owner_key = key;
        self
    }

    pub fn config(&self) -> &StateConfig {
        &self.cfg
    }

    pub fn in_grace(&self, now_ms: u64) -> bool {
        now_ms < self.started_ms.saturating_add(self.cfg.grace_ms)
    }

    fn next_index(&mut self) -> u32 {
        self.next = self.next.wrapping_add(1);
        self.next
    }

    fn clientid_known(&self, clientid: u64) -> R<()> {
        if (clientid >> 32) as u32 != self.epoch {
            return Err(NFS4ERR_STALE_CLIENTID);
        }
        if !self.clients.contains_key(&clientid) {
            return Err(NFS4ERR_STALE_CLIENTID);
        }
        Ok(())
    }

    /// Drops clients whose lease ran out; returns the MDS lock owners whose locks must be released.
    pub fn expire(&mut self, now_ms: u64) -> Vec<u64> {
        let lease = self.cfg.lease_ms;
        let dead: Vec<u64> =
            self.clients.iter().filter(|(_, c)| now_ms.saturating_sub(c.renewed_ms) > lease).map(|(k, _)| *k).collect();
        let mut owners = Vec::new();
        for id in dead {
            tracing::info!(clientid = format_args!("{id:#x}"), "NFSv4 client lease expired");
            owners.extend(self.drop_client(id));
        }
        owners
    }

    fn drop_client(&mut self, clientid: u64) -> Vec<u64> {
        if let Some(c) = self.clients.remove(&clientid) {
            for s in c.sessions {
                self.sessions.remove(&s);
            }
        }
        self.stateids.retain(|_, s| s.clientid != clientid);
        self.layouts.retain(|_, l| l.clientid != clientid);
        let mut owners = Vec::new();
        self.lock_owners.retain(|(c, _), o| {
            if *c == clientid {
                owners.push(*o);
                false
            } else {
                true
            }
        });
        owners
    }

    /// The client record of `owner` that is (`confirmed`) or is not yet confirmed by a CREATE_SESSION: an owner
    /// has at most one of each.
    fn record_of(&self, owner: &[u8], confirmed: bool) -> Option<u64> {
        self.clients.iter().find(|(_, c)| c.owner == owner && c.confirmed == confirmed).map(|(k, _)| *k)
    }

    /// EXCHANGE_ID (RFC 8881 §18.35.5; the cases a client without state protection meets). Without `update`:
    /// - case 1, no record of the owner: a new unconfirmed client;
    /// - case 2, a confirmed record with the same verifier and principal: that client, renewed;
    /// - case 3, a confirmed record of another principal: NFS4ERR_CLID_INUSE while its lease lives (it can neither
    ///   take that client's state nor drop it); once the lease has run out, as case 1;
    /// - case 4, an unconfirmed record only: replaced by a new client (a new clientid);
    /// - case 5, a confirmed record, same principal, another verifier (the client restarted): a new unconfirmed
    ///   client; the old one and its state stay until the new one is confirmed ([`State::create_session`]).
    ///
    /// With `update` (EXCHGID4_FLAG_UPD_CONFIRMED_REC_A: the client means its confirmed record): case 6, same
    /// verifier and principal: that client; 7, no confirmed record: NOENT; 8, another verifier: NOT_SAME; 9,
    /// another principal: PERM. Returns the MDS lock owners of the state dropped (case 3 after expiry).
    pub fn exchange_id(
        &mut self,
        (owner, verifier, update): (&[u8], [u8; 8], bool),
        principal: Principal,
        addr: IpAddr,
        now_ms: u64,
    ) -> R<(Exchanged, Vec<u64>)> {
        let confirmed = self.record_of(owner, true);
        let mut released = Vec::new();
        if update {
            let id = confirmed.ok_or(NFS4ERR_NOENT)?;
            let c = self.clients.get_mut(&id).expect("found");
            if c.verifier != verifier {
                return Err(NFS4ERR_NOT_SAME);
            }
            if c.principal != principal {
                return Err(NFS4ERR_PERM);
            }
            c.renewed_ms = now_ms;
            return Ok((Exchanged { clientid: id, seq: c.cs_seq.wrapping_add(1), confirmed: true }, released));
        }
        if let Some(id) = confirmed {
            let lease_ms = self.cfg.lease_ms;
            let c = self.clients.get_mut(&id).expect("found");
            if c.principal != principal {
                if now_ms.saturating_sub(c.renewed_ms) < lease_ms {
                    return Err(NFS4ERR_CLID_INUSE);
                }
                released = self.drop_client(id);
            } else if c.verifier == verifier {
                c.renewed_ms = now_ms;
                return Ok((Exchanged { clientid: id, seq: c.cs_seq.wrapping_add(1), confirmed: true }, released));
            }
        }
        if let Some(id) = self.record_of(owner, false) {
            // An unconfirmed record holds no state (a session would have confirmed it).
            released.extend(self.drop_client(id));
        }
        let clientid = self.new_client(owner, verifier, principal, addr, now_ms)?;
        Ok((Exchanged { clientid, seq: 1, confirmed: false }, released))
    }

    /// A new unconfirmed client record, within the table's and the address's bounds.
    fn new_client(
        &mut self,
        owner: &[u8],
        verifier: [u8; 8],
        principal: Principal,
        addr: IpAddr,
        now_ms: u64,
    ) -> R<u64> {
        if self.clients.len() >= self.cfg.clients_max {
            return Err(NFS4ERR_RESOURCE);
        }
        let quota = self.cfg.clients_per_address_max;
        if self.clients.values().filter(|c| c.addr == addr).count() >= quota {
            tracing::warn!(
                %addr,
                owner = %String::from_utf8_lossy(owner),
                quota,
                "EXCHANGE_ID refused: the address holds its quota of NFSv4 clients (NFS4ERR_RESOURCE)"
            );
            return Err(NFS4ERR_RESOURCE);
        }
        let clientid = self.new_clientid();
        weft_rpc::invariant!(self.clients.len() < self.cfg.clients_max, "the client table is bounded");
        self.clients.insert(
            clientid,
            ClientRec {
                owner: owner.to_vec(),
                principal,
                addr,
                verifier,
                confirmed: false,
                cs_seq: 0,
                cs_reply: None,
                renewed_ms: now_ms,
                reclaim_complete: false,
                sessions: Vec::new(),
            },
        );
        Ok(clientid)
    }

    /// CREATE_SESSION (§18.36.4): `seq` one past the last is new, equal to it a replay (the cached answer),
    /// anything else SEQ_MISORDERED. Channels smaller than one compound needs are NFS4ERR_TOOSMALL
    /// ([`too_small`]); the fore channel gets the smaller of what the client asks and our bounds. Only the
    /// client's own principal creates its sessions (NFS4ERR_CLID_INUSE otherwise, as §18.36.4 says). The first
    /// session confirms the client; a confirmed record of the same owner (the client before its restart,
    /// §18.35.5 case 5) is then dropped, and its MDS lock owners are returned for release.
    pub fn create_session(
        &mut self,
        clientid: u64,
        seq: u32,
        (asked, back): (ChannelAttrs, ChannelAttrs),
        principal: Principal,
        now_ms: u64,
    ) -> R<(CreatedSession, Vec<u64>)> {
        self.client_of(clientid, principal)
            .map_err(|e| if e == NFS4ERR_WRONG_CRED { NFS4ERR_CLID_INUSE } else { e })?;
        let full = self.sessions.len() >= self.cfg.sessions_max;
        let c = self.clients.get_mut(&clientid).expect("known");
        if seq == c.cs_seq
            && let Some((s, reply)) = c.cs_reply
            && s == seq
        {
            return Ok((reply, Vec::new()));
        }
        if seq != c.cs_seq.wrapping_add(1) {
            return Err(NFS4ERR_SEQ_MISORDERED);
        }
        if too_small(&asked, &back) {
            return Err(NFS4ERR_TOOSMALL);
        }
        if full {
            return Err(NFS4ERR_RESOURCE);
        }
        if c.sessions.len() >= self.cfg.sessions_per_client_max {
            tracing::warn!(
                clientid = format_args!("{clientid:#x}"),
                owner = %String::from_utf8_lossy(&c.owner),
                sessions = c.sessions.len(),
                "CREATE_SESSION refused: the client holds its quota of sessions (NFS4ERR_RESOURCE)"
            );
            return Err(NFS4ERR_RESOURCE);
        }
        let fore = ChannelAttrs {
            header_pad_bytes: 0,
            request_bytes_max: asked.request_bytes_max.min(self.cfg.request_bytes_max),
            reply_bytes_max: asked.reply_bytes_max.min(self.cfg.reply_bytes_max),
            cached_reply_bytes_max: asked.cached_reply_bytes_max.min(self.cfg.cached_reply_bytes_max),
            ops_max: asked.ops_max.min(self.cfg.ops_max),
            slots_max: asked.slots_max.min(self.cfg.slots_max),
        };
        let mut sessionid = [0u8; 16];
        sessionid[..8].copy_from_slice(&clientid.to_be_bytes());
        sessionid[8..].copy_from_slice(&self.ids.next(b"session"));
        let created = CreatedSession { sessionid, seq, fore };
        let confirming = !c.confirmed;
        c.cs_seq = seq;
        c.cs_reply = Some((seq, created));
        c.confirmed = true;
        c.renewed_ms = now_ms;
        c.sessions.push(sessionid);
        let owner = c.owner.clone();
        let slots = (0..fore.slots_max).map(|_| Slot { seqid: 0, reply: None, in_use: false }).collect();
        self.sessions.insert(sessionid, Session { clientid, slots, fore });
        let released = if confirming { self.drop_restarted(clientid, &owner) } else { Vec::new() };
        Ok((created, released))
    }

    /// Once client `clientid` of `owner` is confirmed: the confirmed record it replaces (the same client before
    /// its restart, §18.35.5 case 5) is dropped; returns that record's MDS lock owners.
    fn drop_restarted(&mut self, clientid: u64, owner: &[u8]) -> Vec<u64> {
        let old =
            self.clients.iter().find(|(k, c)| **k != clientid && c.owner == owner && c.confirmed).map(|(k, _)| *k);
        let released = match old {
            Some(old) => {
                tracing::info!(
                    clientid = format_args!("{old:#x}"),
                    owner = %String::from_utf8_lossy(owner),
                    "NFSv4 client restarted (a new verifier confirmed): its earlier state is dropped"
                );
                self.drop_client(old)
            }
            None => Vec::new(),
        };
        assert_eq!(
            self.clients.values().filter(|c| c.owner == owner && c.confirmed).count(),
            1,
            "one confirmed record"
        );
        released
    }

    pub fn session_attrs(&self, sessionid: &[u8; 16]) -> Option<(u64, ChannelAttrs)> {
        self.sessions.get(sessionid).map(|s| (s.clientid, s.fore))
    }

    /// SEQUENCE (§18.46.4): renews the lease and decides new request / replay / misordered.
    pub fn sequence(&mut self, sessionid: &[u8; 16], slot: u32, seqid: u32, now_ms: u64) -> R<SeqOutcome> {
        let s = self.sessions.get_mut(sessionid).ok_or(NFS4ERR_BADSESSION)?;
        let clientid = s.clientid;
        let highest_slot = s.fore.slots_max - 1;
        let sl = s.slots.get_mut(slot as usize).ok_or(NFS4ERR_BADSLOT)?;
        let out = if seqid == sl.seqid && sl.seqid != 0 {
            if sl.in_use {
                return Err(NFS4ERR_DELAY);
            }
            match &sl.reply {
                Some(r) => SeqOutcome::Replay(r.clone()),
                None => return Err(NFS4ERR_RETRY_UNCACHED_REP),
            }
        } else if seqid == sl.seqid.wrapping_add(1) {
            if sl.in_use {
                return Err(NFS4ERR_DELAY);
            }
            weft_rpc::invariant!(!sl.in_use && seqid == sl.seqid.wrapping_add(1), "slot {slot} runs {seqid} once");
            sl.seqid = seqid;
            sl.reply = None;
            sl.in_use = true;
            SeqOutcome::New { clientid, highest_slot }
        } else {
            return Err(NFS4ERR_SEQ_MISORDERED);
        };
        if let Some(c) = self.clients.get_mut(&clientid) {
            c.renewed_ms = now_ms;
        }
        Ok(out)
    }

    /// Stores a compound's reply in its slot (dropped if over the session's cached size: a retry of it then gets
    /// NFS4ERR_RETRY_UNCACHED_REP).
    pub fn finish(&mut self, sessionid: &[u8; 16], slot: u32, reply: &[u8]) {
        if let Some(s) = self.sessions.get_mut(sessionid) {
            let max = s.fore.cached_reply_bytes_max as usize;
            if let Some(sl) = s.slots.get_mut(slot as usize) {
                sl.in_use = false;
                sl.reply = (reply.len() <= max).then(|| reply.to_vec());
            }
        }
    }

    /// Ends a compound whose reply is not kept (too large to be worth copying: a pNFS data server's READ sent from
    /// the page cache): a retry of it gets NFS4ERR_RETRY_UNCACHED_REP, as for any reply over the cached size.
    pub fn finish_uncached(&mut self, sessionid: &[u8; 16], slot: u32) {
        if let Some(sl) = self.sessions.get_mut(sessionid).and_then(|s| s.slots.get_mut(slot as usize)) {
            sl.in_use = false;
            sl.reply = None;
        }
    }

    /// DESTROY_SESSION, by the session's client's principal only (NFS4ERR_WRONG_CRED otherwise).
    pub fn destroy_session(&mut self, sessionid: &[u8; 16], principal: Principal) -> R<()> {
        self.session_principal_is(sessionid, principal)?;
        let s = self.sessions.remove(sessionid).ok_or(NFS4ERR_BADSESSION)?;
        if let Some(c) = self.clients.get_mut(&s.clientid) {
            c.sessions.retain(|x| x != sessionid);
        }
        Ok(())
    }

    /// DESTROY_CLIENTID (§18.50.3): by its principal only (WRONG_CRED), and only a client without sessions, opens,
    /// locks or layouts (CLIENTID_BUSY otherwise); an unknown one is STALE_CLIENTID. Returns its lock owners.
    pub fn destroy_clientid(&mut self, clientid: u64, principal: Principal) -> R<Vec<u64>> {
        let busy = !self.client_of(clientid, principal)?.sessions.is_empty()
            || self.stateids.values().any(|s| s.clientid == clientid)
            || self.layouts.values().any(|l| l.clientid == clientid);
        if busy {
            return Err(NFS4ERR_CLIENTID_BUSY);
        }
        Ok(self.drop_client(clientid))
    }

    /// RECLAIM_COMPLETE (§18.51): the client reclaims nothing more (COMPLETE_ALREADY the second time); only
    /// after it may the client take new opens and locks ([`State::check_grace`]).
    pub fn reclaim_complete(&mut self, clientid: u64) -> R<()> {
        let c = self.clients.get_mut(&clientid).ok_or(NFS4ERR_STALE_CLIENTID)?;
        if c.reclaim_complete {
            return Err(NFS4ERR_COMPLETE_ALREADY);
        }
        c.reclaim_complete = true;
        Ok(())
    }

    /// Whether a reclaim (`reclaim`) or a new open/lock is allowed now: reclaims only in grace and before the
    /// client's RECLAIM_COMPLETE (NO_GRACE); new state only after grace and after the client's RECLAIM_COMPLETE
    /// (GRACE: "if non-reclaim locking operations are done before the RECLAIM_COMPLETE, an NFS4ERR_GRACE error
    /// will be returned", §18.51.3; knfsd does the same).
    pub fn check_grace(&self, clientid: u64, reclaim: bool, now_ms: u64) -> R<()> {
        let grace = self.in_grace(now_ms);
        let done = self.clients.get(&clientid).is_none_or(|c| c.reclaim_complete);
        if reclaim {
            if !grace || done {
                return Err(NFS4ERR_NO_GRACE);
            }
        } else if grace || !done {
            return Err(NFS4ERR_GRACE);
        }
        Ok(())
    }

    /// Looks a stateid up for `clientid`: BAD_STATEID (not ours, another epoch, another client), OLD_STATEID (an
    /// earlier seqid; seqid 0 means "the current one").
    pub fn check(&self, clientid: u64, id: &Stateid) -> R<&StateRec> {
        let rec = self.stateids.get(&id.other).ok_or(NFS4ERR_BAD_STATEID)?;
        if rec.clientid != clientid {
            return Err(NFS4ERR_BAD_STATEID);
        }
        if id.seqid != 0 && id.seqid < rec.seqid {
            return Err(NFS4ERR_OLD_STATEID);
        }
        if id.seqid > rec.seqid {
            return Err(NFS4ERR_BAD_STATEID);
        }
        Ok(rec)
    }

    fn stateid_of(&self, other: &[u8; 12]) -> Stateid {
        Stateid { seqid: self.stateids[other].seqid, other: *other }
    }

    /// OPEN: the open-owner's stateid on `ino` (created, or upgraded to the union of access and deny), if the
    /// share reservations of other owners on `ino` allow it (SHARE_DENIED otherwise).
    pub fn open(&mut self, clientid: u64, owner: &[u8], ino: u64, access: u32, deny: u32) -> R<Stateid> {
        let mut mine = None;
        for (k, s) in &self.stateids {
            if s.ino != ino {
                continue;
            }
            if let StateKind::Open { owner: o, access: a, deny: d } = &s.kind {
                if s.clientid == clientid && o == owner {
                    mine = Some(*k);
                } else if a & deny != 0 || d & access != 0 {
                    return Err(NFS4ERR_SHARE_DENIED);
                }
            }
        }
        if let Some(k) = mine {
            let s = self.stateids.get_mut(&k).expect("found");
            if let StateKind::Open { access: a, deny: d, .. } = &mut s.kind {
                *a |= access;
                *d |= deny;
            }
            s.seqid = s.seqid.wrapping_add(1).max(1);
            return Ok(self.stateid_of(&k));
        }
        self.room_for_stateid(clientid)?;
        let index = self.next_index();
        let id = Stateid::make(self.epoch, KIND_OPEN, index, 1);
        self.stateids.insert(
            id.other,
            StateRec { clientid, ino, seqid: 1, kind: StateKind::Open { owner: owner.to_vec(), access, deny } },
        );
        Ok(id)
    }

    /// OPEN_DOWNGRADE: access and deny must be subsets of the current ones (INVAL).
    pub fn downgrade(&mut self, clientid: u64, id: &Stateid, access: u32, deny: u32) -> R<Stateid> {
        self.check(clientid, id)?;
        let s = self.stateids.get_mut(&id.other).expect("checked");
        let StateKind::Open { access: a, deny: d, .. } = &mut s.kind else { return Err(NFS4ERR_BAD_STATEID) };
        if access & !*a != 0 || deny & !*d != 0 || access == 0 {
            return Err(NFS4ERR_INVAL);
        }
        *a = access;
        *d = deny;
        s.seqid = s.seqid.wrapping_add(1).max(1);
        Ok(self.stateid_of(&id.other))
    }

    /// CLOSE: drops the open stateid and the lock stateids opened from it; returns (inode, MDS lock owners whose
    /// locks on it are to be released).
    pub fn close(&mut self, clientid: u64, id: &Stateid) -> R<(u64, Vec<u64>)> {
        let rec = self.check(clientid, id)?;
        if !matches!(rec.kind, StateKind::Open { .. }) {
            return Err(NFS4ERR_BAD_STATEID);
        }
        let ino = rec.ino;
        self.stateids.remove(&id.other);
        let mut owners = Vec::new();
        self.stateids.retain(|_, s| match &s.kind {
            StateKind::Lock { open, mds_owner, .. } if *open == id.other => {
                owners.push(*mds_owner);
                false
            }
            _ => true,
        });
        Ok((ino, owners))
    }

    /// The MDS lock owner of (client, lock-owner bytes), remembered so the client's expiry releases it.
    fn mds_owner(&mut self, clientid: u64, owner: &[u8]) -> u64 {
        let key = (clientid, owner.to_vec());
        if let Some(o) = self.lock_owners.get(&key) {
            return *o;
        }
        let o = self.lock_owner_id(clientid, owner);
        self.lock_owners.insert(key, o);
        o
    }

    /// The MDS owner id of a lock-owner: a keyed hash of the client's `co_ownerid` and the owner bytes, not of
    /// the clientid, so it is the same after a gateway restart (docs/format.md §22). LOCKT tests as it.
    pub fn lock_owner_id(&self, clientid: u64, owner: &[u8]) -> u64 {
        let co_ownerid = self.clients.get(&clientid).map_or(&[][..], |c| &c.owner[..]);
        self.owner_key.owner(co_ownerid, owner)
    }

    /// LOCK with a new lock-owner: a lock stateid for (lock-owner, the open's file); returns it and the MDS
    /// owner. Its seqid is bumped by [`State::lock_granted`] once the MDS granted the lock.
    pub fn lock_stateid_new(&mut self, clientid: u64, open: &Stateid, owner: &[u8]) -> R<(Stateid, u64, u64)> {
        let rec = self.check(clientid, open)?;
        if !matches!(rec.kind, StateKind::Open { .. }) {
            return Err(NFS4ERR_BAD_STATEID);
        }
        let ino = rec.ino;
        let mds_owner = self.mds_owner(clientid, owner);
        // The same lock-owner on the same file already has one: reuse it.
        if let Some((k, _)) = self.stateids.iter().find(|(_, s)| {
            s.ino == ino && matches!(&s.kind, StateKind::Lock { owner: o, .. } if o == owner) && s.clientid == clientid
        }) {
            let k = *k;
            self.lock_pending(&k);
            return Ok((self.stateid_of(&k), ino, mds_owner));
        }
        self.room_for_stateid(clientid)?;
        let index = self.next_index();
        let id = Stateid::make(self.epoch, KIND_LOCK, index, 0);
        self.stateids.insert(
            id.other,
            StateRec {
                clientid,
                ino,
                seqid: 0,
                kind: StateKind::Lock { owner: owner.to_vec(), open: open.other, mds_owner, held: true },
            },
        );
        Ok((id, ino, mds_owner))
    }

    /// An existing lock stateid: (inode, MDS owner).
    pub fn lock_stateid(&self, clientid: u64, id: &Stateid) -> R<(u64, u64)> {
        let rec = self.check(clientid, id)?;
        match &rec.kind {
            StateKind::Lock { mds_owner, .. } => Ok((rec.ino, *mds_owner)),
            _ => Err(NFS4ERR_BAD_STATEID),
        }
    }

    /// The MDS granted (or released) a lock of this stateid: its seqid moves on.
    pub fn lock_granted(&mut self, id: &Stateid) -> Stateid {
        match self.stateids.get_mut(&id.other) {
            Some(s) => {
                s.seqid = s.seqid.wrapping_add(1).max(1);
                Stateid { seqid: s.seqid, other: id.other }
            }
            None => *id,
        }
    }

    /// A LOCK of this stateid goes to the MDS: from now on it may hold locks (a FREE_STATEID is LOCKS_HELD).
    pub fn lock_pending(&mut self, other: &[u8; 12]) {
        if let Some(StateRec { kind: StateKind::Lock { held, .. }, .. }) = self.stateids.get_mut(other) {
            *held = true;
        }
    }

    /// A LOCKU of the whole file went through: this stateid holds no locks (until its next LOCK).
    pub fn lock_unlocked_all(&mut self, other: &[u8; 12]) {
        if let Some(StateRec { kind: StateKind::Lock { held, .. }, .. }) = self.stateids.get_mut(other) {
            *held = false;
        }
    }

    /// A lock stateid whose first LOCK was refused (seqid still 0) is dropped again.
    pub fn lock_refused(&mut self, id: &Stateid) {
        if self.stateids.get(&id.other).is_some_and(|s| s.seqid == 0) {
            self.stateids.remove(&id.other);
        }
    }

    /// FREE_STATEID (RFC 8881 §18.38): a lock stateid that holds no locks is forgotten; one that may hold locks
    /// (or has a LOCK in flight) is LOCKS_HELD, as an open stateid always is (CLOSE it). Nothing is released at
    /// the MDS here: the Linux client frees a lock stateid asynchronously after its last unlock, and may meanwhile
    /// have locked again with the same lock-owner (the same MDS owner): releasing that owner's locks then would
    /// drop a lock the client holds (SQLite's, which then corrupts its database).
    pub fn free(&mut self, clientid: u64, id: &Stateid) -> R<()> {
        let rec = self.check(clientid, id)?;
        match rec.kind {
            StateKind::Lock { held: false, .. } => {
                self.stateids.remove(&id.other);
                Ok(())
            }
            StateKind::Lock { held: true, .. } | StateKind::Open { .. } => Err(NFS4ERR_LOCKS_HELD),
        }
    }

    /// An I/O stateid for `ino`: special ones pass; an open or lock stateid must be this client's for this file,
    /// and a write needs an open with write access (OPENMODE).
    pub fn check_io(&self, clientid: u64, id: &Stateid, ino: u64, write: bool) -> R<()> {
        if id.is_special() {
            return Ok(());
        }
        let rec = self.check(clientid, id)?;
        if rec.ino != ino {
            return Err(NFS4ERR_BAD_STATEID);
        }
        let open = match &rec.kind {
            StateKind::Open { access, .. } => Some(*access),
            StateKind::Lock { open, .. } => self.stateids.get(open).and_then(|o| match &o.kind {
                StateKind::Open { access, .. } => Some(*access),
                _ => None,
            }),
        };
        match open {
            Some(a) if write && a & OPEN4_SHARE_ACCESS_WRITE == 0 => Err(NFS4ERR_OPENMODE),
            Some(_) => Ok(()),
            // A lock stateid whose open was closed.
            None => Err(NFS4ERR_BAD_STATEID),
        }
    }

    /// The device id of an ordered server list (made if new; a full table first forgets the devices no layout
    /// names, and is LAYOUTTRYLATER if every one is named).
    fn device_for(&mut self, servers: &[u32]) -> R<DeviceId> {
        let index = match self.devices.by_servers.get(servers) {
            Some(&i) => i,
            None => {
                if self.devices.by_index.len() >= self.cfg.devices_max {
                    let named: std::collections::HashSet<DeviceId> = self.layouts.values().map(|l| l.device).collect();
                    let epoch = self.epoch;
                    let d = &mut self.devices;
                    d.by_index.retain(|&i, _| named.contains(&device_id(epoch, i)));
                    d.by_servers.retain(|_, i| d.by_index.contains_key(i));
                    if d.by_index.len() >= self.cfg.devices_max {
                        return Err(NFS4ERR_LAYOUTTRYLATER);
                    }
                }
                self.devices.next += 1;
                let i = self.devices.next;
                self.devices.by_servers.insert(servers.to_vec(), i);
                self.devices.by_index.insert(i, servers.to_vec());
                i
            }
        };
        Ok(device_id(self.epoch, index))
    }

    /// The ordered servers a device id names; `None` for an id of another epoch, a forgotten or a made-up one.
    pub fn device(&self, id: &DeviceId) -> Option<&[u32]> {
        let index = device_index(self.epoch, id)?;
        self.devices.by_index.get(&index).map(Vec::as_slice)
    }

    /// GETDEVICELIST: up to `max` device ids after `cookie` (0: from the start); returns them, the cookie to go on
    /// from, and whether the list ended.
    pub fn device_list(&self, cookie: u64, max: usize) -> (Vec<DeviceId>, u64, bool) {
        let mut ids = Vec::new();
        let mut last = cookie;
        let mut it = self.devices.by_index.range(cookie.saturating_add(1)..).peekable();
        while ids.len() < max {
            let Some((&i, _)) = it.next() else { break };
            ids.push(device_id(self.epoch, i));
            last = i;
        }
        (ids, last, it.peek().is_none())
    }

    /// LAYOUTGET (RFC 8881 §18.43.3, §12.5.3): `id` is the client's layout stateid for `ino`, or (for its first
    /// layout of the file) an open or lock stateid of this client for `ino`, with write access for an RW layout
    /// (OPENMODE). Records `iomode` on the (client, file) layout, whose seqid moves on; returns the layout stateid
    /// and the device of `servers`.
    // The op's own arguments, the file's layout (servers, generation) and the clock: one call, as the op is one step.
    #[allow(clippy::too_many_arguments)]
    pub fn layout_get(
        &mut self,
        clientid: u64,
        ino: u64,
        id: &Stateid,
        iomode: u32,
        servers: &[u32],
        generation: u64,
        now_ms: u64,
    ) -> R<(Stateid, DeviceId)> {
        let mine = self.layouts.iter().find(|(_, l)| l.clientid == clientid && l.ino == ino).map(|(k, _)| *k);
        if id.other[4] == KIND_LAYOUT {
            let l = self.layouts.get(&id.other).ok_or(NFS4ERR_BAD_STATEID)?;
            if l.clientid != clientid || l.ino != ino || id.seqid > l.seqid {
                return Err(NFS4ERR_BAD_STATEID);
            }
        } else {
            if id.is_special() {
                return Err(NFS4ERR_BAD_STATEID);
            }
            self.check_io(clientid, id, ino, iomode == IOMODE_RW)?;
        }
        // A layout being recalled: not handed out again until returned, or revoked at the deadline.
        let mine = match mine {
            Some(k) => match self.layouts[&k].recall_deadline_ms {
                Some(d) if now_ms < d => return Err(NFS4ERR_RECALLCONFLICT),
                Some(_) => {
                    let l = self.layouts.remove(&k).expect("found");
                    tracing::warn!(
                        clientid = format_args!("{clientid:#x}"),
                        ino = l.ino,
                        "pNFS layout recalled and not returned in time: revoked"
                    );
                    None
                }
                None => Some(k),
            },
            None => None,
        };
        if mine.is_none() && self.layouts.len() >= self.cfg.layouts_max {
            return Err(NFS4ERR_LAYOUTTRYLATER);
        }
        let device = self.device_for(servers)?;
        let key = match mine {
            Some(k) => k,
            None => {
                let k = Stateid::make(self.epoch, KIND_LAYOUT, self.next_index(), 0).other;
                self.layouts.insert(
                    k,
                    LayoutRec {
                        clientid,
                        ino,
                        seqid: 0,
                        iomodes: 0,
                        device,
                        servers: vec![],
                        generation,
                        recall_deadline_ms: None,
                    },
                );
                k
            }
        };
        let l = self.layouts.get_mut(&key).expect("just found or made");
        l.iomodes |= iomode;
        l.seqid = l.seqid.wrapping_add(1).max(1);
        l.device = device;
        l.servers = servers.to_vec();
        l.generation = generation;
        Ok((Stateid { seqid: l.seqid, other: key }, device))
    }

    /// The layout a LAYOUTCOMMIT or LAYOUTRETURN names: this client's, for `ino`, not a seqid from the future.
    pub fn layout_of(&self, clientid: u64, ino: u64, id: &Stateid) -> R<&LayoutRec> {
        let l = self.layouts.get(&id.other).ok_or(NFS4ERR_BAD_STATEID)?;
        if l.clientid != clientid || l.ino != ino || id.seqid > l.seqid {
            return Err(NFS4ERR_BAD_STATEID);
        }
        Ok(l)
    }

    /// LAYOUTRETURN of type FILE (§18.44.3): drops `iomode` (ANY: both) from the layout. Every iomode gone: the
    /// layout stateid is forgotten (`None`, `lrs_present` false); else its seqid moves on.
    pub fn layout_return(&mut self, clientid: u64, ino: u64, id: &Stateid, iomode: u32) -> R<Option<Stateid>> {
        self.layout_of(clientid, ino, id)?;
        let l = self.layouts.get_mut(&id.other).expect("checked");
        l.iomodes &= !iomode;
        if l.iomodes == 0 {
            self.layouts.remove(&id.other);
            return Ok(None);
        }
        l.seqid = l.seqid.wrapping_add(1).max(1);
        Ok(Some(Stateid { seqid: l.seqid, other: id.other }))
    }

    /// The layout of `ino` changed (truncate, removal, owner or mode, layout generation): every layout of it not
    /// already being recalled is marked recalled (revoked at `now_ms` + `recall_ms` unless returned first), its
    /// seqid moved on. Returns (clientid, the stateid to put in CB_LAYOUTRECALL) for each.
    pub fn recall_layouts(&mut self, ino: u64, now_ms: u64) -> Vec<(u64, Stateid)> {
        let deadline = now_ms.saturating_add(self.cfg.recall_ms);
        let mut out = Vec::new();
        for (k, l) in self.layouts.iter_mut().filter(|(_, l)| l.ino == ino && l.recall_deadline_ms.is_none()) {
            l.recall_deadline_ms = Some(deadline);
            l.seqid = l.seqid.wrapping_add(1).max(1);
            out.push((l.clientid, Stateid { seqid: l.seqid, other: *k }));
        }
        out
    }

    /// A recalled layout the client has not (NFS4ERR_NOMATCHING_LAYOUT) or cannot be asked to return (no back
    /// channel, no answer): forgotten. Returns whether it was still held.
    pub fn layout_forget(&mut self, id: &Stateid) -> bool {
        self.layouts.remove(&id.other).is_some()
    }

    /// Whether the layout `id` names is still held (and being recalled).
    pub fn layout_recalled(&self, id: &Stateid) -> bool {
        self.layouts.get(&id.other).is_some_and(|l| l.recall_deadline_ms.is_some())
    }

    /// Recalled layouts still held past their deadline: revoked (forgotten); returns (clientid, ino) of each.
    pub fn recall_expire(&mut self, now_ms: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        self.layouts.retain(|_, l| match l.recall_deadline_ms {
            Some(d) if now_ms >= d => {
                out.push((l.clientid, l.ino));
                false
            }
            _ => true,
        });
        out
    }

    /// The inodes with layouts out, each with its layout generation when last handed out (the periodic check).
    pub fn layout_inodes(&self) -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = self.layouts.values().map(|l| (l.ino, l.generation)).collect();
        v.sort_unstable();
        v.dedup_by_key(|x| x.0);
        v
    }

    /// A layout of `ino` was handed out while the file was `now`: what the periodic check compares with.
    pub fn watch(&mut self, ino: u64, now: Watched) {
        if self.watched.len() < self.cfg.layouts_max || self.watched.contains_key(&ino) {
            self.watched.insert(ino, now);
        }
    }

    /// The inodes the periodic check looks at (those with layouts out; the others are forgotten here), at most
    /// `max`, from `after` on (a cursor, so a large table is covered over several passes).
    pub fn watched_inodes(&mut self, after: u64, max: usize) -> Vec<u64> {
        let out: std::collections::HashSet<u64> = self.layouts.values().map(|l| l.ino).collect();
        self.watched.retain(|ino, _| out.contains(ino));
        let mut v: Vec<u64> = self.watched.keys().copied().filter(|&i| i > after).collect();
        v.sort_unstable();
        v.truncate(max);
        v
    }

    /// The periodic check found `ino` as `now` (`None`: removed): what changed since the layouts were handed out
    /// that they depend on (a smaller size, mode, owner, group, the layout generation, removal). Remembers `now`
    /// (the size only ever rises: a client's own writes grow the file, only a shrink is news).
    pub fn watched_changed(&mut self, ino: u64, now: Option<Watched>) -> Option<super::recall::Why> {
        use super::recall::Why;
        let was = *self.watched.get(&ino)?;
        let Some(now) = now else {
            self.watched.remove(&ino);
            return Some(Why::Remove);
        };
        let why = if now.size < was.size {
            Some(Why::Truncate)
        } else if (now.mode, now.uid, now.gid) != (was.mode, was.uid, was.gid) {
            Some(Why::Access)
        } else if now.generation != was.generation {
            Some(Why::Layout)
        } else {
            None
        };
        self.watched.insert(ino, Watched { size: now.size.max(if why.is_some() { 0 } else { was.size }), ..now });
        why
    }

    /// The client's sessions (the back channel table keeps entries only for live ones).
    pub fn session_alive(&self, sessionid: &[u8; 16]) -> bool {
        self.sessions.contains_key(sessionid)
    }

    /// LAYOUTRETURN of type FSID or ALL (one export, one fsid): every layout of the client; returns how many.
    pub fn layout_return_all(&mut self, clientid: u64) -> usize {
        let before = self.layouts.len();
        self.layouts.retain(|_, l| l.clientid != clientid);
        before - self.layouts.len()
    }

    /// The layouts out for `ino` (every client's).
    pub fn layouts_of(&self, ino: u64) -> Vec<LayoutRec> {
        self.layouts.values().filter(|l| l.ino == ino).cloned().collect()
    }

    /// How many layouts are out, and on how many devices.
    pub fn layout_counts(&self) -> (usize, usize) {
        (self.layouts.len(), self.devices.by_index.len())
    }

    pub fn counts(&self) -> (usize, usize, usize) {
        (self.clients.len(), self.sessions.len(), self.stateids.len())
    }
}

/// A device id (16 bytes): epoch (4, BE) | kind 4 (1) | zero (3) | counter (8, BE). docs/format.md §24.
/// The smallest request and reply a fore channel may offer: a SEQUENCE, a PUTFH of the largest handle and a
/// GETATTR, with an AUTH_SYS credential of 16 groups (RFC 5531) and the RPC headers.
pub const FORE_BYTES_MIN: u32 = 512;
/// The smallest callback request a back channel may offer: a CB_SEQUENCE and a CB_LAYOUTRECALL of the largest
/// handle with their RPC header and credential; and its smallest reply (CB_SEQUENCE's and one status).
pub const BACK_REQUEST_BYTES_MIN: u32 = 512;
pub const BACK_REPLY_BYTES_MIN: u32 = 128;

/// Whether channels a CREATE_SESSION offers are too small for any compound (NFS4ERR_TOOSMALL, §18.36.3): no
/// slot, room for fewer than two ops (SEQUENCE and one), or requests and replies smaller than the minimums above.
/// A cached reply size of 0 is allowed: such a session cannot ask for replies to be cached (sa_cachethis
/// answers NFS4ERR_REP_TOO_BIG_TO_CACHE).
pub fn too_small(fore: &ChannelAttrs, back: &ChannelAttrs) -> bool {
    fore.slots_max == 0
        || fore.ops_max < 2
        || fore.request_bytes_max < FORE_BYTES_MIN
        || fore.reply_bytes_max < FORE_BYTES_MIN
        || back.slots_max == 0
        || back.ops_max < 2
        || back.request_bytes_max < BACK_REQUEST_BYTES_MIN
        || back.reply_bytes_max < BACK_REPLY_BYTES_MIN
}

pub fn device_id(epoch: u32, index: u64) -> DeviceId {
    let mut id = [0u8; 16];
    id[..4].copy_from_slice(&epoch.to_be_bytes());
    id[4] = KIND_DEVICE;
    id[8..].copy_from_slice(&index.to_be_bytes());
    id
}

/// The counter of a device id of `epoch`; `None` for another epoch or kind.
fn device_index(epoch: u32, id: &DeviceId) -> Option<u64> {
    (id[..4] == epoch.to_be_bytes() && id[4] == KIND_DEVICE && id[5..8] == [0; 3])
        .then(|| u64::from_be_bytes(id[8..].try_into().expect("8 bytes")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nfs4::layout::{IOMODE_ANY, IOMODE_READ};

    fn attrs() -> ChannelAttrs {
        ChannelAttrs {
            header_pad_bytes: 0,
            request_bytes_max: 1 << 20,
            reply_bytes_max: 1 << 20,
            cached_reply_bytes_max: 4096,
            ops_max: 8,
            slots_max: 4,
        }
    }

    /// The principal every test client uses (a Linux client's machine credential: AUTH_SYS root).
    const P: Principal = Principal { flavor: 1, uid: 0, gid: 0 };
    const HOST: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));

    fn cfg() -> StateConfig {
        StateConfig { lease_ms: 1000, grace_ms: 500, ..StateConfig::default() }
    }

    fn session(st: &mut State, owner: &[u8], now: u64) -> (u64, [u8; 16]) {
        let (ex, _) = st.exchange_id((owner, [1; 8], false), P, HOST, now).unwrap();
        let (cs, _) = st.create_session(ex.clientid, ex.seq, (attrs(), attrs()), P, now).unwrap();
        (ex.clientid, cs.sessionid)
    }

    #[test]
    fn exchange_and_create_session_replay_and_misorder() {
        let mut st = State::new(cfg(), 7, 0);
        let (ex, _) = st.exchange_id((b"a", [1; 8], false), P, HOST, 0).unwrap();
        assert!(!ex.confirmed);
        assert_eq!(ex.clientid >> 32, 7);
        let (cs, _) = st.create_session(ex.clientid, 1, (attrs(), attrs()), P, 0).unwrap();
        assert_eq!(cs.fore.ops_max, 8);
        assert_eq!(cs.fore.cached_reply_bytes_max, 4096);
        // A retried CREATE_SESSION gets the same session; a skipped sequence id is misordered.
        assert_eq!(st.create_session(ex.clientid, 1, (attrs(), attrs()), P, 0).unwrap().0, cs);
        assert_eq!(st.create_session(ex.clientid, 3, (attrs(), attrs()), P, 0), Err(NFS4ERR_SEQ_MISORDERED));
        let stale = st.create_session(ex.clientid ^ (1 << 40), 2, (attrs(), attrs()), P, 0);
        assert_eq!(stale, Err(NFS4ERR_STALE_CLIENTID));
        // The same owner and verifier again: the same client, now confirmed.
        let (again, _) = st.exchange_id((b"a", [1; 8], false), P, HOST, 0).unwrap();
        assert_eq!((again.clientid, again.confirmed, again.seq), (ex.clientid, true, 2));
    }

    /// RFC 8881 §18.35.5, every case a client without state protection meets, and CREATE_SESSION confirming a
    /// restarted client (case 5) only then dropping its earlier state.
    #[test]
    fn exchange_id_walks_every_case() {
        let mut st = State::new(cfg(), 7, 0);
        let other = Principal { flavor: 1, uid: 1000, gid: 1000 };
        let ex = |st: &mut State, owner: &[u8], v: u8, update: bool, p: Principal, now: u64| {
            st.exchange_id((owner, [v; 8], update), p, HOST, now).map(|(e, _)| e)
        };
        // Case 7: an update of a record that does not exist, or is not confirmed, is NOENT.
        assert_eq!(ex(&mut st, b"a", 1, true, P, 0), Err(NFS4ERR_NOENT));
        // Case 1: a new owner gets a new unconfirmed client.
        let first = ex(&mut st, b"a", 1, false, P, 0).unwrap();
        assert_eq!((first.confirmed, first.seq), (false, 1));
        assert_eq!(ex(&mut st, b"a", 1, true, P, 0), Err(NFS4ERR_NOENT));
        // Case 4: an unconfirmed record is replaced (a new clientid; the old one is stale).
        let replaced = ex(&mut st, b"a", 1, false, P, 0).unwrap();
        assert_ne!(replaced.clientid, first.clientid);
        assert_eq!(st.create_session(first.clientid, 1, (attrs(), attrs()), P, 0), Err(NFS4ERR_STALE_CLIENTID));
        let (cs, _) = st.create_session(replaced.clientid, 1, (attrs(), attrs()), P, 0).unwrap();
        let owner = st.mds_owner(replaced.clientid, b"lock-owner");
        // Case 2: same verifier and principal: the confirmed client.
        let same = ex(&mut st, b"a", 1, false, P, 0).unwrap();
        assert_eq!((same.clientid, same.confirmed), (replaced.clientid, true));
        // Case 6: an update with the same verifier and principal: the confirmed client.
        assert_eq!(ex(&mut st, b"a", 1, true, P, 0).unwrap().clientid, replaced.clientid);
        // Case 8: an update with another verifier; case 9: by another principal.
        assert_eq!(ex(&mut st, b"a", 2, true, P, 0), Err(NFS4ERR_NOT_SAME));
        assert_eq!(ex(&mut st, b"a", 1, true, other, 0), Err(NFS4ERR_PERM));
        // Case 3: another principal while the lease lives.
        assert_eq!(ex(&mut st, b"a", 1, false, other, 0), Err(NFS4ERR_CLID_INUSE));
        // Case 5: a new verifier (the client restarted): a new unconfirmed client; the old one's session lives on
        // until the new one is confirmed, and then its state goes and its lock owner is released.
        let restarted = ex(&mut st, b"a", 2, false, P, 0).unwrap();
        assert_ne!(restarted.clientid, replaced.clientid);
        assert!(!restarted.confirmed);
        assert!(matches!(st.sequence(&cs.sessionid, 0, 1, 0), Ok(SeqOutcome::New { .. })));
        st.finish(&cs.sessionid, 0, b"r");
        let (_, dropped) = st.create_session(restarted.clientid, 1, (attrs(), attrs()), P, 0).unwrap();
        assert_eq!(dropped, vec![owner]);
        assert_eq!(st.sequence(&cs.sessionid, 0, 2, 0), Err(NFS4ERR_BADSESSION));
        assert_eq!(ex(&mut st, b"a", 2, true, P, 0).unwrap().clientid, restarted.clientid);
        // Case 3 once the lease has run out: the owner is anyone's (a new client for the other principal).
        let taken = ex(&mut st, b"a", 3, false, other, 5000).unwrap();
        assert!(!taken.confirmed);
        assert_eq!(st.counts().0, 1, "one client record left");
    }

    /// §18.36.3: channels too small for a compound are NFS4ERR_TOOSMALL, whatever else they offer.
    #[test]
    fn create_session_refuses_channels_too_small() {
        let mut st = State::new(cfg(), 7, 0);
        let ex = st.exchange_id((b"a", [1; 8], false), P, HOST, 0).unwrap().0;
        let small = [
            ChannelAttrs { slots_max: 0, ..attrs() },
            ChannelAttrs { ops_max: 1, ..attrs() },
            ChannelAttrs { request_bytes_max: FORE_BYTES_MIN - 1, ..attrs() },
            ChannelAttrs { reply_bytes_max: FORE_BYTES_MIN - 1, ..attrs() },
        ];
        for fore in small {
            assert_eq!(st.create_session(ex.clientid, 1, (fore, attrs()), P, 0), Err(NFS4ERR_TOOSMALL), "{fore:?}");
        }
        let small_back = [
            ChannelAttrs { slots_max: 0, ..attrs() },
            ChannelAttrs { ops_max: 1, ..attrs() },
            ChannelAttrs { request_bytes_max: BACK_REQUEST_BYTES_MIN - 1, ..attrs() },
            ChannelAttrs { reply_bytes_max: BACK_REPLY_BYTES_MIN - 1, ..attrs() },
        ];
        for back in small_back {
            assert_eq!(st.create_session(ex.clientid, 1, (attrs(), back), P, 0), Err(NFS4ERR_TOOSMALL), "{back:?}");
        }
        // No cached reply at all is allowed; the smallest channels that pass are taken.
        let least = ChannelAttrs {
            request_bytes_max: FORE_BYTES_MIN,
            reply_bytes_max: FORE_BYTES_MIN,
            cached_reply_bytes_max: 0,
            ops_max: 2,
            slots_max: 1,
            header_pad_bytes: 0,
        };
        let back =
            ChannelAttrs { request_bytes_max: BACK_REQUEST_BYTES_MIN, reply_bytes_max: BACK_REPLY_BYTES_MIN, ..least };
        let (cs, _) = st.create_session(ex.clientid, 1, (least, back), P, 0).unwrap();
        assert_eq!(cs.fore, least);
    }

    /// §18.50.3: a client holding sessions, opens, locks or layouts is CLIENTID_BUSY; an unknown one is stale.
    #[test]
    fn destroy_clientid_only_of_a_client_without_state() {
        let mut st = State::new(cfg(), 7, 0);
        let (cid, sid) = session(&mut st, b"a", 0);
        assert_eq!(st.destroy_clientid(cid, P), Err(NFS4ERR_CLIENTID_BUSY));
        let open = st.open(cid, b"o", 9, OPEN4_SHARE_ACCESS_READ, 0).unwrap();
        st.destroy_session(&sid, P).unwrap();
        assert_eq!(st.destroy_clientid(cid, P), Err(NFS4ERR_CLIENTID_BUSY), "an open is state");
        st.close(cid, &open).unwrap();
        assert_eq!(st.destroy_clientid(cid ^ 1, P), Err(NFS4ERR_STALE_CLIENTID));
        assert_eq!(st.destroy_clientid(cid, P), Ok(Vec::new()));
        assert_eq!(st.destroy_clientid(cid, P), Err(NFS4ERR_STALE_CLIENTID));
        assert_eq!(st.counts().0, 0);
    }

    /// RFC 8881 §2.4, §18.35.5: a client record belongs to the principal that made it.
    #[test]
    fn a_client_belongs_to_its_principal() {
        let mut st = State::new(cfg(), 7, 0).with_id_secret(&[3; 32]);
        let (cid, sid) = session(&mut st, b"victim", 0);
        let mallory = Principal { flavor: 1, uid: 1000, gid: 1000 };
        // Another principal cannot take the owner string (not even with a new verifier) while the lease lives…
        assert_eq!(st.exchange_id((b"victim", [9; 8], false), mallory, HOST, 10).map(|_| ()), Err(NFS4ERR_CLID_INUSE));
        assert_eq!(st.exchange_id((b"victim", [1; 8], false), mallory, HOST, 10).map(|_| ()), Err(NFS4ERR_CLID_INUSE));
        // …nor act on the client's sessions or the client itself.
        assert_eq!(st.create_session(cid, 2, (attrs(), attrs()), mallory, 10), Err(NFS4ERR_CLID_INUSE));
        assert_eq!(st.destroy_session(&sid, mallory), Err(NFS4ERR_WRONG_CRED));
        assert_eq!(st.session_principal_is(&sid, mallory), Err(NFS4ERR_WRONG_CRED));
        assert_eq!(st.destroy_clientid(cid, mallory), Err(NFS4ERR_WRONG_CRED));
        assert!(matches!(st.sequence(&sid, 0, 1, 20), Ok(SeqOutcome::New { .. })), "the victim's session lives");
        assert_eq!(st.session_principal_is(&sid, P), Ok(()));
        // Once its lease has run out, the owner string is free for anyone.
        let (taken, _) = st.exchange_id((b"victim", [9; 8], false), mallory, HOST, 2000).unwrap();
        assert_ne!(taken.clientid, cid);
        assert_eq!(st.sequence(&sid, 0, 2, 2000), Err(NFS4ERR_BADSESSION));
    }

    /// Client and session ids are drawn under the start's secret: neither follows from the last one seen.
    #[test]
    fn ids_are_unguessable_and_unique() {
        let mut st = State::new(
            StateConfig { clients_max: 4096, sessions_max: 4096, clients_per_address_max: 4096, ..cfg() },
            7,
            0,
        )
        .with_id_secret(&[5; 32]);
        let mut clients = std::collections::HashSet::new();
        let mut steps = std::collections::HashSet::new();
        let mut last = 0u64;
        for i in 0..512u32 {
            let (cid, sid) = session(&mut st, format!("c{i}").as_bytes(), 0);
            assert_eq!(cid >> 32, 7, "the epoch stays in the high bits");
            assert_eq!(&sid[..8], &cid.to_be_bytes(), "a session names its client");
            assert!(clients.insert(cid), "clientid {cid:#x} given twice");
            steps.insert((cid as u32).wrapping_sub(last as u32));
            last = cid;
        }
        assert!(steps.len() > 500, "ids do not step by a constant: {} distinct steps", steps.len());
    }

    /// One address cannot fill the client table with made-up owners (issue 31): past its quota a new owner from it
    /// is NFS4ERR_RESOURCE, while its existing clients renew and rebooted ones (a new verifier) are replaced, and
    /// another address still gets a client; a client whose lease ran out frees its place.
    #[test]
    fn an_address_holds_at_most_its_quota_of_clients() {
        let mut st = State::new(StateConfig { clients_per_address_max: 3, ..cfg() }, 1, 0);
        let other = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));
        let ex = |st: &mut State, owner: &[u8], verf: u8, addr: IpAddr, now: u64| {
            st.exchange_id((owner, [verf; 8], false), P, addr, now).map(|(e, _)| e.clientid)
        };
        for i in 0..3u8 {
            ex(&mut st, &[b'c', i], 1, HOST, 0).unwrap();
        }
        assert_eq!(ex(&mut st, b"c9", 1, HOST, 0), Err(NFS4ERR_RESOURCE), "a fourth owner from one address");
        assert!(ex(&mut st, &[b'c', 0], 1, HOST, 0).is_ok(), "a known client renews");
        assert!(ex(&mut st, &[b'c', 1], 2, HOST, 0).is_ok(), "a rebooted client is replaced");
        assert!(ex(&mut st, b"c9", 1, other, 0).is_ok(), "another address");
        st.expire(5_000);
        assert!(ex(&mut st, b"c9", 1, HOST, 5_000).is_ok(), "expired clients free the address's places");
    }

    /// One client cannot fill the shared tables (issue 31): past its quotas its CREATE_SESSION, OPEN and new
    /// lock-owner's LOCK are NFS4ERR_RESOURCE, while another client still gets all three.
    #[test]
    fn a_client_holds_at_most_its_quotas() {
        let cfg = StateConfig { sessions_per_client_max: 2, stateids_per_client_max: 3, grace_ms: 0, ..cfg() };
        let mut st = State::new(cfg, 1, 0);
        let (hog, _) = session(&mut st, b"hog", 0);
        let more =
            |st: &mut State, cid: u64, seq: u32| st.create_session(cid, seq, (attrs(), attrs()), P, 0).map(|_| ());
        assert_eq!(more(&mut st, hog, 2), Ok(()));
        assert_eq!(more(&mut st, hog, 3), Err(NFS4ERR_RESOURCE), "a third session");
        let mut opens = Vec::new();
        for ino in 10..13 {
            opens.push(st.open(hog, b"o", ino, OPEN4_SHARE_ACCESS_READ, 0).unwrap());
        }
        assert_eq!(st.open(hog, b"o", 13, OPEN4_SHARE_ACCESS_READ, 0), Err(NFS4ERR_RESOURCE), "a fourth stateid");
        assert_eq!(st.lock_stateid_new(hog, &opens[0], b"l").map(|_| ()), Err(NFS4ERR_RESOURCE));
        // An upgrade of an open it holds is no new stateid.
        assert!(st.open(hog, b"o", 10, OPEN4_SHARE_ACCESS_BOTH, 0).is_ok());
        let (other, _) = session(&mut st, b"other", 0);
        assert_eq!(more(&mut st, other, 2), Ok(()));
        let theirs = st.open(other, b"o", 13, OPEN4_SHARE_ACCESS_READ, 0).unwrap();
        assert!(st.lock_stateid_new(other, &theirs, b"l").is_ok());
    }

    #[test]
    fn slots_give_exactly_once() {
        let mut st = State::new(cfg(), 1, 0);
        let (cid, sid) = session(&mut st, b"c", 0);
        assert_eq!(st.sequence(&sid, 0, 1, 0), Ok(SeqOutcome::New { clientid: cid, highest_slot: 3 }));
        // A retry while the first still runs waits.
        assert_eq!(st.sequence(&sid, 0, 1, 0), Err(NFS4ERR_DELAY));
        st.finish(&sid, 0, b"reply-1");
        assert_eq!(st.sequence(&sid, 0, 1, 0), Ok(SeqOutcome::Replay(b"reply-1".to_vec())));
        assert_eq!(st.sequence(&sid, 0, 3, 0), Err(NFS4ERR_SEQ_MISORDERED));
        assert_eq!(st.sequence(&sid, 0, 0, 0), Err(NFS4ERR_SEQ_MISORDERED));
        assert_eq!(st.sequence(&sid, 4, 1, 0), Err(NFS4ERR_BADSLOT));
        assert!(matches!(st.sequence(&sid, 0, 2, 0), Ok(SeqOutcome::New { .. })));
        // Too large to cache: a retry is told so rather than run twice.
        st.finish(&sid, 0, &[0; 5000]);
        assert_eq!(st.sequence(&sid, 0, 2, 0), Err(NFS4ERR_RETRY_UNCACHED_REP));
        // Slots are independent.
        assert!(matches!(st.sequence(&sid, 3, 1, 0), Ok(SeqOutcome::New { .. })));
    }

    #[test]
    fn leases_expire_without_renewal_and_release_locks() {
        let mut st = State::new(cfg(), 1, 0);
        let (cid, sid) = session(&mut st, b"c", 0);
        let open = st.open(cid, b"o", 5, OPEN4_SHARE_ACCESS_BOTH, 0).unwrap();
        let (lock, ino, owner) = st.lock_stateid_new(cid, &open, b"l").unwrap();
        assert_eq!(ino, 5);
        let lock = st.lock_granted(&lock);
        assert_eq!(lock.seqid, 1);
        assert_eq!(st.lock_stateid(cid, &lock), Ok((5, owner)));
        // Renewed at 900 by SEQUENCE: alive at 1800.
        assert!(matches!(st.sequence(&sid, 0, 1, 900), Ok(SeqOutcome::New { .. })));
        st.finish(&sid, 0, b"r");
        assert!(st.expire(1800).is_empty());
        assert_eq!(st.counts(), (1, 1, 2));
        // Not renewed past the lease: everything goes and the lock owner is handed back for the MDS.
        assert_eq!(st.expire(1901), vec![owner]);
        assert_eq!(st.counts(), (0, 0, 0));
        assert_eq!(st.sequence(&sid, 0, 2, 1901), Err(NFS4ERR_BADSESSION));
    }

    #[test]
    fn grace_allows_only_reclaims_then_only_new_state() {
        let mut st = State::new(cfg(), 1, 1000);
        let (cid, _) = session(&mut st, b"c", 1000);
        assert!(st.in_grace(1499));
        assert_eq!(st.check_grace(cid, false, 1200), Err(NFS4ERR_GRACE));
        assert_eq!(st.check_grace(cid, true, 1200), Ok(()));
        assert_eq!(st.check_grace(cid, true, 1500), Err(NFS4ERR_NO_GRACE));
        // §18.51.3: no new state before the client's RECLAIM_COMPLETE, even after the grace period.
        assert_eq!(st.check_grace(cid, false, 1500), Err(NFS4ERR_GRACE));
        st.reclaim_complete(cid).unwrap();
        assert_eq!(st.check_grace(cid, false, 1500), Ok(()));
        assert_eq!(st.reclaim_complete(cid), Err(NFS4ERR_COMPLETE_ALREADY));
        assert_eq!(st.check_grace(cid, true, 1200), Err(NFS4ERR_NO_GRACE));
    }

    #[test]
    fn share_reservations_and_stateid_checks() {
        let mut st = State::new(cfg(), 1, 0);
        let (a, _) = session(&mut st, b"a", 0);
        let (b, _) = session(&mut st, b"b", 0);
        let s1 = st.open(a, b"o", 9, OPEN4_SHARE_ACCESS_READ, OPEN4_SHARE_DENY_WRITE).unwrap();
        assert_eq!(st.open(b, b"o", 9, OPEN4_SHARE_ACCESS_WRITE, 0), Err(NFS4ERR_SHARE_DENIED));
        let s2 = st.open(b, b"o", 9, OPEN4_SHARE_ACCESS_READ, 0).unwrap();
        assert_eq!(st.open(a, b"p", 9, OPEN4_SHARE_ACCESS_READ, OPEN4_SHARE_DENY_READ), Err(NFS4ERR_SHARE_DENIED));
        // The same owner upgrades its stateid; the old seqid is then OLD_STATEID.
        let s1b = st.open(a, b"o", 9, OPEN4_SHARE_ACCESS_BOTH, OPEN4_SHARE_DENY_WRITE).unwrap();
        assert_eq!((s1b.other, s1b.seqid), (s1.other, 2));
        assert_eq!(st.check(a, &s1).map(|_| ()), Err(NFS4ERR_OLD_STATEID));
        assert_eq!(st.check(b, &s1b).map(|_| ()), Err(NFS4ERR_BAD_STATEID));
        assert_eq!(st.check_io(a, &s1b, 9, true), Ok(()));
        assert_eq!(st.check_io(b, &s2, 9, true), Err(NFS4ERR_OPENMODE));
        assert_eq!(st.check_io(b, &s2, 8, false), Err(NFS4ERR_BAD_STATEID));
        assert_eq!(st.check_io(b, &Stateid::ANONYMOUS, 8, true), Ok(()));
        let d = st.downgrade(a, &s1b, OPEN4_SHARE_ACCESS_READ, 0).unwrap();
        assert_eq!(d.seqid, 3);
        assert_eq!(st.downgrade(a, &d, OPEN4_SHARE_ACCESS_BOTH, 0), Err(NFS4ERR_INVAL));
        let (lock, _, owner) = st.lock_stateid_new(a, &d, b"lk").unwrap();
        let lock = st.lock_granted(&lock);
        assert_eq!(st.free(a, &d), Err(NFS4ERR_LOCKS_HELD));
        // A lock stateid is freed only once a whole-file LOCKU went through, and is LOCKS_HELD again as soon as
        // a LOCK reuses it (the Linux client's FREE_STATEID may race the same lock-owner's next LOCK).
        assert_eq!(st.free(a, &lock), Err(NFS4ERR_LOCKS_HELD));
        st.lock_unlocked_all(&lock.other);
        let (again, _, owner2) = st.lock_stateid_new(a, &d, b"lk").unwrap();
        assert_eq!((again.other, owner2), (lock.other, owner), "the same lock-owner reuses its stateid");
        assert_eq!(st.free(a, &again), Err(NFS4ERR_LOCKS_HELD), "a LOCK is in flight on it");
        st.lock_unlocked_all(&lock.other);
        assert_eq!(st.free(a, &again), Ok(()));
        assert_eq!(st.check(a, &again).map(|_| ()), Err(NFS4ERR_BAD_STATEID), "freed");
        let (lock, _, _) = st.lock_stateid_new(a, &d, b"lk").unwrap();
        let lock = st.lock_granted(&lock);
        assert_eq!(st.close(a, &d), Ok((9, vec![owner])));
        assert_eq!(st.check(a, &lock).map(|_| ()), Err(NFS4ERR_BAD_STATEID));
        // Another epoch's stateid is unknown.
        let mut foreign = s2;
        foreign.other[0] ^= 1;
        assert_eq!(st.check(b, &foreign).map(|_| ()), Err(NFS4ERR_BAD_STATEID));
        assert_eq!(st.destroy_clientid(b, P), Err(NFS4ERR_CLIENTID_BUSY));
    }

    #[test]
    fn layouts_from_an_open_then_by_their_own_stateid_until_returned() {
        let mut st = State::new(StateConfig { layouts_max: 2, ..cfg() }, 5, 0);
        let (a, _) = session(&mut st, b"a", 0);
        let (b, _) = session(&mut st, b"b", 0);
        let ro = st.open(a, b"o", 9, OPEN4_SHARE_ACCESS_READ, 0).unwrap();
        // Special stateids, another client's, another file's: refused; an RW layout needs a writable open.
        assert_eq!(st.layout_get(a, 9, &Stateid::ANONYMOUS, IOMODE_READ, &[1, 2], 0, 0), Err(NFS4ERR_BAD_STATEID));
        assert_eq!(st.layout_get(b, 9, &ro, IOMODE_READ, &[1, 2], 0, 0), Err(NFS4ERR_BAD_STATEID));
        assert_eq!(st.layout_get(a, 8, &ro, IOMODE_READ, &[1, 2], 0, 0), Err(NFS4ERR_BAD_STATEID));
        assert_eq!(st.layout_get(a, 9, &ro, IOMODE_RW, &[1, 2], 0, 0), Err(NFS4ERR_OPENMODE));
        let (l1, dev) = st.layout_get(a, 9, &ro, IOMODE_READ, &[1, 2], 0, 0).unwrap();
        assert_eq!((l1.seqid, l1.other[4], &l1.other[..4]), (1, KIND_LAYOUT, &5u32.to_be_bytes()[..]));
        assert_eq!(st.device(&dev), Some(&[1u32, 2][..]));
        // Again with the layout stateid: the same layout, seqid 2; an old seqid is fine, a future one is not.
        let rw = st.open(a, b"o", 9, OPEN4_SHARE_ACCESS_BOTH, 0).unwrap();
        let (l2, dev2) = st.layout_get(a, 9, &l1, IOMODE_RW, &[1, 2], 0, 0).unwrap();
        assert_eq!((l2.other, l2.seqid, dev2), (l1.other, 2, dev));
        let future = Stateid { seqid: 9, ..l2 };
        assert_eq!(st.layout_get(a, 9, &future, IOMODE_READ, &[1, 2], 0, 0), Err(NFS4ERR_BAD_STATEID));
        // A first layout from an open when the client already holds one: the same stateid.
        let (l3, _) = st.layout_get(a, 9, &rw, IOMODE_READ, &[1, 2], 0, 0).unwrap();
        assert_eq!((l3.other, l3.seqid), (l1.other, 3));
        assert_eq!(st.layouts_of(9)[0].iomodes, IOMODE_READ | IOMODE_RW);
        // LAYOUTCOMMIT and LAYOUTRETURN name the layout: another client's or file's is BAD_STATEID.
        assert!(st.layout_of(a, 9, &l3).is_ok());
        assert_eq!(st.layout_of(b, 9, &l3).map(|_| ()), Err(NFS4ERR_BAD_STATEID));
        assert_eq!(st.layout_of(a, 8, &l3).map(|_| ()), Err(NFS4ERR_BAD_STATEID));
        // Returning RW keeps READ (seqid on); returning ANY forgets the layout.
        let r = st.layout_return(a, 9, &l3, IOMODE_RW).unwrap().unwrap();
        assert_eq!(r.seqid, 4);
        assert_eq!(st.layout_return(a, 9, &r, IOMODE_ANY), Ok(None));
        assert_eq!(st.layout_of(a, 9, &r).map(|_| ()), Err(NFS4ERR_BAD_STATEID));
        assert!(st.layouts_of(9).is_empty());
        // Bounded: two layouts at most; RETURN ALL and a client's expiry free them.
        let o7 = st.open(a, b"o", 7, OPEN4_SHARE_ACCESS_READ, 0).unwrap();
        let o6 = st.open(a, b"o", 6, OPEN4_SHARE_ACCESS_READ, 0).unwrap();
        let ob = st.open(b, b"o", 9, OPEN4_SHARE_ACCESS_READ, 0).unwrap();
        st.layout_get(a, 9, &rw, IOMODE_READ, &[1, 2], 0, 0).unwrap();
        st.layout_get(a, 7, &o7, IOMODE_READ, &[2, 1], 0, 0).unwrap();
        assert_eq!(st.layout_get(a, 6, &o6, IOMODE_READ, &[1], 0, 0), Err(NFS4ERR_LAYOUTTRYLATER));
        assert_eq!(st.layout_counts(), (2, 2));
        assert_eq!(st.layout_return_all(a), 2);
        st.layout_get(b, 9, &ob, IOMODE_READ, &[1, 2], 0, 0).unwrap();
        assert_eq!(st.layout_counts().0, 1);
        st.destroy_session(&st.clients[&b].sessions[0].clone(), P).unwrap();
        assert_eq!(st.destroy_clientid(b, P), Err(NFS4ERR_CLIENTID_BUSY), "it holds an open and a layout");
        st.expire(u64::MAX);
        assert_eq!(st.layout_counts().0, 0, "an expired client's layouts go with it");
    }

    #[test]
    fn recalled_layouts_conflict_until_returned_or_revoked_at_the_deadline() {
        let mut st = State::new(StateConfig { recall_ms: 100, ..cfg() }, 5, 0);
        let (a, _) = session(&mut st, b"a", 0);
        let (b, _) = session(&mut st, b"b", 0);
        let oa = st.open(a, b"o", 9, OPEN4_SHARE_ACCESS_READ, 0).unwrap();
        let ob = st.open(b, b"o", 9, OPEN4_SHARE_ACCESS_READ, 0).unwrap();
        let (la, _) = st.layout_get(a, 9, &oa, IOMODE_READ, &[1], 0, 0).unwrap();
        let (lb, _) = st.layout_get(b, 9, &ob, IOMODE_READ, &[1], 0, 0).unwrap();
        // Pending → sent: every layout of the file is recalled once, its seqid one past the client's.
        let mut r = st.recall_layouts(9, 10);
        r.sort_by_key(|x| x.0);
        assert_eq!(r, vec![(a, Stateid { seqid: 2, ..la }), (b, Stateid { seqid: 2, ..lb })]);
        assert!(st.recall_layouts(9, 20).is_empty(), "already being recalled: not again");
        assert!(st.recall_layouts(8, 20).is_empty(), "another file: nothing out");
        assert!(st.layout_recalled(&r[0].1));
        // Until returned, LAYOUTGET of the file by that client conflicts.
        assert_eq!(st.layout_get(a, 9, &la, IOMODE_READ, &[1], 0, 50), Err(NFS4ERR_RECALLCONFLICT));
        // Answered and returned (with the recall's seqid): gone, and a new layout may be had.
        assert_eq!(st.layout_return(a, 9, &r[0].1, IOMODE_ANY), Ok(None));
        assert!(!st.layout_recalled(&r[0].1));
        let (la2, _) = st.layout_get(a, 9, &oa, IOMODE_READ, &[1], 0, 60).unwrap();
        assert_ne!(la2.other, la.other);
        // Timed out: b never returned; at the deadline its layout is revoked, and only then.
        assert!(st.recall_expire(109).is_empty());
        assert_eq!(st.recall_expire(110), vec![(b, 9)]);
        assert_eq!(st.layout_of(b, 9, &r[1].1).map(|_| ()), Err(NFS4ERR_BAD_STATEID), "revoked");
        // A layout lazily revoked by LAYOUTGET past the deadline; NOMATCHING_LAYOUT forgets one at once.
        let r2 = st.recall_layouts(9, 200);
        assert_eq!(r2.len(), 1);
        let (la3, _) = st.layout_get(a, 9, &oa, IOMODE_READ, &[1], 0, 300).unwrap();
        assert_ne!(la3.other, la2.other, "the recalled one was revoked, a new one handed out");
        let r3 = st.recall_layouts(9, 400);
        assert!(st.layout_forget(&r3[0].1));
        assert!(!st.layout_forget(&r3[0].1));
        assert_eq!(st.layout_inodes(), vec![]);
    }

    #[test]
    fn the_periodic_check_sees_shrinks_access_and_generation_changes_only() {
        use crate::nfs4::recall::Why;
        let mut st = State::new(cfg(), 5, 0);
        let (a, _) = session(&mut st, b"a", 0);
        let o = st.open(a, b"o", 9, OPEN4_SHARE_ACCESS_READ, 0).unwrap();
        let w = Watched { size: 100, mode: 0o644, uid: 1, gid: 1, generation: 0 };
        st.watch(9, w);
        assert_eq!(st.watched_inodes(0, 8), vec![], "no layout out: forgotten");
        st.layout_get(a, 9, &o, IOMODE_READ, &[1], 0, 0).unwrap();
        st.watch(9, w);
        assert_eq!(st.watched_inodes(0, 8), vec![9]);
        assert_eq!(st.watched_inodes(9, 8), vec![], "past the cursor");
        assert_eq!(st.watched_changed(9, Some(Watched { size: 200, ..w })), None, "growth is the client's writes");
        assert_eq!(
            st.watched_changed(9, Some(Watched { size: 150, ..w })),
            Some(Why::Truncate),
            "below the largest seen"
        );
        assert_eq!(st.watched_changed(9, Some(Watched { size: 150, ..w })), None, "seen once");
        assert_eq!(st.watched_changed(9, Some(Watched { size: 150, mode: 0o600, ..w })), Some(Why::Access));
        assert_eq!(
            st.watched_changed(9, Some(Watched { size: 150, mode: 0o600, generation: 2, ..w })),
            Some(Why::Layout)
        );
        assert_eq!(st.watched_changed(9, None), Some(Why::Remove));
        assert_eq!(st.watched_changed(9, None), None, "forgotten");
        assert_eq!(st.watched_changed(8, Some(w)), None, "never watched");
    }

    #[test]
    fn device_ids_name_one_server_list_and_are_never_reused() {
        let mut st = State::new(StateConfig { devices_max: 2, ..cfg() }, 5, 0);
        let (a, _) = session(&mut st, b"a", 0);
        let o = st.open(a, b"o", 9, OPEN4_SHARE_ACCESS_READ, 0).unwrap();
        let d12 = st.device_for(&[1, 2]).unwrap();
        assert_eq!(d12, device_id(5, 1));
        assert_eq!(st.device_for(&[1, 2]).unwrap(), d12, "the same ordered list, the same device");
        let d21 = st.device_for(&[2, 1]).unwrap();
        assert_ne!(d21, d12, "order matters: stripe index i is server i");
        // Full: a new list forgets the devices no layout names (here both), and its id is new.
        let (_, named) = st.layout_get(a, 9, &o, IOMODE_READ, &[2, 1], 0, 0).unwrap();
        assert_eq!(named, d21);
        let d3 = st.device_for(&[3]).unwrap();
        assert_eq!(d3, device_id(5, 3));
        assert_eq!(st.device(&d12), None, "forgotten: GETDEVICEINFO answers NOENT");
        assert_eq!(st.device(&d21), Some(&[2u32, 1][..]), "named by a layout: kept");
        // Both named now: a further list waits.
        st.layout_get(a, 9, &o, IOMODE_READ, &[3], 0, 0).unwrap();
        let o2 = st.open(a, b"o", 10, OPEN4_SHARE_ACCESS_READ, 0).unwrap();
        st.layout_get(a, 10, &o2, IOMODE_READ, &[2, 1], 0, 0).unwrap();
        assert_eq!(st.device_for(&[4]), Err(NFS4ERR_LAYOUTTRYLATER));
        // Another epoch's id, another kind, a made-up counter: unknown.
        assert_eq!(st.device(&device_id(6, 3)), None);
        let mut k = d3;
        k[4] = KIND_LOCK;
        assert_eq!(st.device(&k), None);
        assert_eq!(st.device(&device_id(5, 99)), None);
        // GETDEVICELIST pages through the ids in order.
        assert_eq!(st.device_list(0, 1), (vec![d21], 2, false));
        assert_eq!(st.device_list(2, 8), (vec![d3], 3, true));
        assert_eq!(st.device_list(3, 8), (vec![], 3, true));
    }
}
