//! This client's metadata cache under leases (docs/format.md §31), for a client with no kernel to cache in: the
//! NFS gateway, and native programs that ask for it ([`Client::hold_leases`]). While the MDS holds a lease for
//! this client's session on an inode, its attributes (and, for a directory, the names in it) are answered from
//! here instead of a round trip; the MDS recalls the lease before any other session's change of them completes.
//!
//! [`MetaCache`] is the pure part: what is cached, on top of [`LeaseTrust`]. The channel is the FUSE mount's
//! (`lease_channel.rs`). The MDS recalls nothing from the session that made a change, so every change this
//! client sends drops what it touched here itself ([`Own`], from the request alone); a change whose inodes the
//! request does not name and this cache does not know (a removed name never looked up here) drops everything.

use std::collections::{HashMap, HashSet};
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use weft_proto::msg::{LeaseWaitResp, ReaddirPlusResp};
use weft_proto::{Attr, MetaChange, Request};

use weft_proto::{ErrorCode, WireError};
use weft_rpc::RpcError;

use crate::lease_channel::{self, LeaseHolder};
use crate::lease_trust::{LeaseTrust, Ticket, no_hearings};
use crate::{Client, ClientError, bank_may_search, is_not_found};

/// Inodes and entries cached, each; past it, replies are not cached (the MDS revokes a holder past 65 536 leased
/// inodes anyway, and everything cached goes with that epoch).
pub const CACHED_MAX: usize = 65_536;

/// What one of this client's own requests changes, to drop here ([`own_change`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Own {
    /// Nothing cached (a read, a lock).
    Nothing,
    Some(OwnChange),
    /// Unknown: everything.
    All,
}

/// The parts of a change, as its request names them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnChange {
    /// Inodes whose attributes (mode and owner included) change.
    pub inos: Vec<u64>,
    /// Directories whose names change: their times, size and link count move, not their mode or owner.
    pub dirs: Vec<u64>,
    /// Names that may exist after it.
    pub added: Vec<(u64, String)>,
    /// Names that may be gone or name another inode after it: the inode each named changes too.
    pub removed: Vec<(u64, String)>,
}

/// What request `req` changes of what this cache holds (the classification the MDS recalls by, weft-proto's
/// [`MetaChange`]).
pub fn own_change(req: &Request) -> Own {
    let owned = |names: Vec<(u64, &str)>| names.into_iter().map(|(d, n)| (d, n.to_string())).collect();
    match req.meta_change() {
        MetaChange::Nothing => Own::Nothing,
        MetaChange::Unknown => Own::All,
        MetaChange::Some(c) => {
            Own::Some(OwnChange { dirs: c.dirs(), inos: c.inos, added: owned(c.added), removed: owned(c.removed) })
        }
    }
}

/// One of this client's own requests in flight: what it changes, the entry it makes, and the ticket it was
/// sent under (its reply's attributes are leased to this session too).
pub struct Pending {
    own: Own,
    made: Option<(u64, String)>,
    keeps_reply: bool,
    ticket: Ticket,
}

impl Pending {
    pub fn of(req: &Request, ticket: Ticket) -> Pending {
        let made = match req {
            Request::Create(r) | Request::CreateOpen(r) | Request::CreateOpenDir(r) => Some((r.parent, r.name.clone())),
            Request::Mkdir(r) => Some((r.parent, r.name.clone())),
            Request::Symlink(r) => Some((r.parent, r.name.clone())),
            Request::Mknod(r) => Some((r.parent, r.name.clone())),
            Request::Link(r) => Some((r.new_parent, r.new_name.clone())),
            _ => None,
        };
        let keeps_reply = made.is_some() || matches!(req, Request::SetAttr(_) | Request::NfsSetAttr(_));
        Pending { own: own_change(req), made, keeps_reply, ticket }
    }

    /// The request returned `resp` (`None`: it failed, and may have applied).
    pub fn settle(self, cache: &mut MetaCache, resp: Option<&weft_proto::Response>, now: (Instant, u64)) {
        let own = cache.changed(self.own);
        if let Some(attr) = resp.filter(|_| self.keeps_reply).and_then(|r| r.attr()) {
            cache.put_own(&self.ticket, own, self.made.as_ref(), attr, now);
        }
    }
}

/// A lookup answered here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cached {
    /// The directory's attributes as last fetched (for the search permission), and the child's.
    Entry(Attr, Attr),
    /// No such name; the directory's attributes as last fetched.
    Absent(Attr),
}

/// Whether `name` is one a lookup may be cached under: "." and ".." are answered by the MDS from the inode, and a
/// move of the directory recalls no entry of them.
fn cacheable(name: &str) -> bool {
    name != "." && name != ".."
}

/// Attributes and entries cached under leases.
#[derive(Debug, Default)]
pub struct MetaCache {
    trust: LeaseTrust,
    attrs: HashMap<u64, Attr>,
    /// Leased directories' attributes as last fetched: their kind, mode and owner, which decide a lookup's search
    /// permission, hold until a recall or this client's own change of them (its changes of the names in a
    /// directory move only its times, size and link count, and drop only its entry in `attrs`).
    dirs: HashMap<u64, Attr>,
    /// (directory, name) → the inode it names.
    entries: HashMap<(u64, String), u64>,
    /// Names known missing from a directory in `dirs`: every change of another session to a directory's names
    /// recalls its attributes, which drops them.
    absent: HashMap<u64, HashSet<String>>,
    absent_count: usize,
    /// Answers served from here, since the client started (for metrics and tests).
    hits: u64,
}

impl MetaCache {
    pub fn ticket(&self) -> Ticket {
        self.trust.ticket()
    }

    /// Whether leases hold now on MDS session `now.1` (if not, lookups go the way they go without leases: the
    /// cache bank, then the MDS).
    pub fn live(&self, now: (Instant, u64)) -> bool {
        self.trust.live(now)
    }

    /// `ino`'s attributes, if cached and the leases hold now on MDS session `now.1`.
    pub fn attr(&mut self, ino: u64, now: (Instant, u64)) -> Option<Attr> {
        let a = self.trust.live(now).then(|| self.attrs.get(&ino).cloned())??;
        self.hits += 1;
        Some(a)
    }

    /// `parent`'s entry `name`, if known here and the leases hold.
    pub fn lookup(&mut self, parent: u64, name: &str, now: (Instant, u64)) -> Option<Cached> {
        if !self.trust.live(now) || !cacheable(name) {
            return None;
        }
        let dir = self.dirs.get(&parent)?.clone();
        let found = if self.absent.get(&parent).is_some_and(|a| a.contains(name)) {
            Cached::Absent(dir)
        } else {
            let child = self.entries.get(&(parent, name.to_string()))?;
            Cached::Entry(dir, self.attrs.get(child)?.clone())
        };
        self.hits += 1;
        Some(found)
    }

    /// A reply's attributes, asked for under `t`: cached if trusted.
    pub fn put_attr(&mut self, t: &Ticket, attr: &Attr, now: (Instant, u64)) -> bool {
        let full = self.attrs.len() >= CACHED_MAX && !self.attrs.contains_key(&attr.ino);
        if full || !self.trust.trusted(t, &[attr.ino], now) {
            return false;
        }
        self.attrs.insert(attr.ino, attr.clone());
        if attr.kind == weft_proto::FileKind::Dir && (self.dirs.len() < CACHED_MAX || self.dirs.contains_key(&attr.ino))
        {
            self.dirs.insert(attr.ino, attr.clone());
        }
        true
    }

    /// A reply's entry `parent`/`name` with the attributes of the inode it names, asked for under `t`: cached if
    /// trusted (a lease on the directory covers its names).
    pub fn put_entry(&mut self, t: &Ticket, parent: u64, name: &str, attr: &Attr, now: (Instant, u64)) -> bool {
        let key = (parent, name.to_string());
        let full = self.entries.len() >= CACHED_MAX && !self.entries.contains_key(&key);
        if full || !cacheable(name) || !self.trust.trusted(t, &[parent, attr.ino], now) || !self.put_attr(t, attr, now)
        {
            return false;
        }
        // Trusted, so newer than the missing name (whose recall is on its way): not both.
        if self.absent.get_mut(&parent).is_some_and(|a| a.remove(name)) {
            self.absent_count -= 1;
        }
        self.entries.insert(key, attr.ino);
        true
    }

    /// A lookup asked for under `t` found no `parent`/`name`: remembered while `parent` is a leased directory
    /// here (a failed lookup grants no lease, but the directory's lease covers its names).
    pub fn put_absent(&mut self, t: &Ticket, parent: u64, name: &str, now: (Instant, u64)) -> bool {
        if self.absent_count >= CACHED_MAX
            || !cacheable(name)
            || !self.dirs.contains_key(&parent)
            || !self.trust.trusted(t, &[parent], now)
        {
            return false;
        }
        if self.absent.entry(parent).or_default().insert(name.to_string()) {
            self.absent_count += 1;
        }
        true
    }

    /// A `ReaddirPlus` page of `dir`, asked for under `t`: its entries and their attributes.
    pub fn put_listing(&mut self, t: &Ticket, dir: u64, page: &ReaddirPlusResp, now: (Instant, u64)) {
        for (name, attr) in page.entries.iter().filter(|(n, _)| cacheable(n)) {
            if !self.put_entry(t, dir, name, attr, now) {
                return;
            }
        }
    }

    /// The reply of one of this client's own changes, asked for under `t`, whose own hearings were `own`
    /// ([`MetaCache::changed`]): the attributes it carries (of the inode it made or changed), and the entry
    /// `made` names, cached if nothing else voided them since `t` (the MDS leased them to this session).
    pub fn put_own(
        &mut self,
        t: &Ticket,
        own: RangeInclusive<u64>,
        made: Option<&(u64, String)>,
        attr: &Attr,
        now: (Instant, u64),
    ) {
        let inos: Vec<u64> = made.map(|(p, _)| *p).into_iter().chain([attr.ino]).collect();
        let room = self.attrs.len() < CACHED_MAX && self.entries.len() < CACHED_MAX && self.dirs.len() < CACHED_MAX;
        if !room || !self.trust.trusted_except(t, &inos, now, own) {
            return;
        }
        self.attrs.insert(attr.ino, attr.clone());
        if attr.kind == weft_proto::FileKind::Dir {
            self.dirs.insert(attr.ino, attr.clone());
        }
        if let Some((parent, name)) = made.filter(|(_, n)| cacheable(n)) {
            if self.absent.get_mut(parent).is_some_and(|a| a.remove(name)) {
                self.absent_count -= 1;
            }
            self.entries.insert((*parent, name.clone()), attr.ino);
        }
    }

    /// One of this client's own requests changed `own` (sent, whether or not it succeeded: a failure may have
    /// applied). Returns the numbers its hearings got.
    pub fn changed(&mut self, own: Own) -> RangeInclusive<u64> {
        let c = match own {
            Own::Nothing => return no_hearings(),
            Own::All => return self.drop_all(),
            Own::Some(c) => c,
        };
        let mut touched = c.inos;
        for key in &c.removed {
            if self.absent.get(&key.0).is_some_and(|a| a.contains(&key.1)) {
                continue;
            }
            match self.entries.remove(key) {
                Some(ino) => touched.push(ino),
                // The name may name an inode cached by its number (a removal changes its link count): not known.
                None if !self.attrs.is_empty() || !self.dirs.is_empty() => return self.drop_all(),
                None => {}
            }
        }
        for (dir, name) in &c.added {
            self.entries.remove(&(*dir, name.clone()));
            if self.absent.get_mut(dir).is_some_and(|a| a.remove(name)) {
                self.absent_count -= 1;
            }
        }
        for ino in &touched {
            self.drop_ino(*ino);
        }
        for dir in &c.dirs {
            self.attrs.remove(dir);
        }
        touched.extend(c.dirs);
        self.trust.heard_own(Some(&touched))
    }

    /// Drops what is cached of `ino`'s attributes (and, for a directory, the names known missing from it).
    fn drop_ino(&mut self, ino: u64) {
        self.attrs.remove(&ino);
        self.dirs.remove(&ino);
        if let Some(a) = self.absent.remove(&ino) {
            self.absent_count -= a.len();
        }
    }

    fn clear(&mut self) {
        self.attrs.clear();
        self.dirs.clear();
        self.entries.clear();
        self.absent.clear();
        self.absent_count = 0;
    }

    fn drop_all(&mut self) -> RangeInclusive<u64> {
        self.clear();
        self.trust.heard_own(None)
    }

    /// A `LeaseWait` reply to a call sent at `sent`, arrived on MDS session `session`.
    pub fn received(&mut self, resp: &LeaseWaitResp, sent: Instant, session: u64) {
        if self.trust.loses_all(resp, session) {
            self.clear();
        }
        self.trust.received(resp, sent, session);
        for r in &resp.recalls {
            match &r.name {
                None => self.drop_ino(r.ino),
                Some(n) => drop(self.entries.remove(&(r.ino, n.clone()))),
            }
        }
    }

    /// Every lease is gone (the channel failed, or the trust ran out).
    pub fn lose(&mut self) {
        self.trust.lose();
        self.clear();
    }

    /// (Inodes, entries and missing names cached, answers served from the cache, recalls heard.)
    pub fn counts(&self) -> (usize, u64, u64) {
        (self.attrs.len() + self.entries.len() + self.absent_count, self.hits, self.trust.heard())
    }

    /// The epoch its leases are held under (0: none).
    pub fn epoch(&self) -> u64 {
        self.trust.epoch()
    }

    /// Checks the cache's own bookkeeping (tests and the simulation call it after every step).
    pub fn check(&self) {
        assert_eq!(self.absent_count, self.absent.values().map(HashSet::len).sum::<usize>(), "missing names counted");
        assert!(self.absent.keys().all(|d| self.dirs.contains_key(d)), "missing names only of leased directories");
        assert!(self.dirs.values().all(|a| a.kind == weft_proto::FileKind::Dir), "only directories in dirs");
        let both =
            self.absent.iter().any(|(d, names)| names.iter().any(|n| self.entries.contains_key(&(*d, n.clone()))));
        assert!(!both, "a name both missing and an entry");
        assert!(self.attrs.len() <= CACHED_MAX && self.entries.len() <= CACHED_MAX && self.dirs.len() <= CACHED_MAX);
    }
}

impl Client {
    /// Holds metadata leases for this client from now on (once; later calls do nothing): attribute and lookup
    /// calls are answered from the lease cache while the MDS holds the leases (docs/format.md §31). For a client
    /// with no kernel of its own to cache in; the FUSE mount holds its leases for its kernel instead. Needs a Tokio
    /// runtime: the lease channel is a task, which ends with the client.
    pub fn hold_leases(&self) {
        let mut started = false;
        let cache = self.inner.meta_cache.get_or_init(|| {
            started = true;
            Arc::new(Mutex::new(MetaCache::default()))
        });
        if started {
            let (inner, user) = (Arc::downgrade(&self.inner), self.user.clone());
            let client = move || inner.upgrade().map(|inner| Client { inner, user: user.clone() });
            let no_leases = "every lookup and getattr asks it";
            tokio::spawn(lease_channel::run(client, Holder(cache.clone()), no_leases));
        }
    }

    /// This client's lease cache's counts ([`MetaCache::counts`]), if it holds leases.
    pub fn lease_cache_counts(&self) -> Option<(usize, u64, u64)> {
        self.lease_cache().map(|c| lock(c).counts())
    }

    /// The lease cache, if this client holds leases.
    pub(crate) fn lease_cache(&self) -> Option<&Mutex<MetaCache>> {
        self.inner.meta_cache.get().map(|c| &**c)
    }

    /// The lease cache, if this client holds leases now.
    pub(crate) fn live_lease_cache(&self) -> Option<&Mutex<MetaCache>> {
        self.lease_cache().filter(|c| lock(c).live(self.now_and_session()))
    }

    /// The time and MDS session a reply is judged at.
    fn now_and_session(&self) -> (Instant, u64) {
        (Instant::now(), self.mds_session())
    }

    /// [`Client::lookup`] through the lease cache `c`: a hit whose directory this client's user may search
    /// (decided as the bank's hits are), else the MDS, whose answer (found or not) is cached if trusted.
    pub(crate) async fn lookup_leased(
        &self,
        c: &Mutex<MetaCache>,
        parent: u64,
        name: &str,
    ) -> Result<Attr, ClientError> {
        let (found, t) = {
            let mut g = lock(c);
            (g.lookup(parent, name, self.now_and_session()), g.ticket())
        };
        let exact = self.inner.asserted_user_is_effective;
        match found {
            Some(Cached::Entry(dir, child)) if bank_may_search(&dir, &self.user, exact) => return Ok(child),
            Some(Cached::Absent(dir)) if bank_may_search(&dir, &self.user, exact) => {
                let e = WireError::new(ErrorCode::NotFound, format!("no entry {name:?} in directory {parent}"));
                return Err(ClientError::Meta(RpcError::Remote(e)));
            }
            _ => {}
        }
        match self.lookup_at_mds(parent, name).await {
            Ok(a) => {
                lock(c).put_entry(&t, parent, name, &a, self.now_and_session());
                Ok(a)
            }
            Err(e) => {
                if is_not_found(&e) {
                    lock(c).put_absent(&t, parent, name, self.now_and_session());
                }
                Err(e)
            }
        }
    }

    /// [`Client::getattr`] through the lease cache `c`.
    pub(crate) async fn getattr_leased(&self, c: &Mutex<MetaCache>, ino: u64) -> Result<Attr, ClientError> {
        let (hit, t) = {
            let mut g = lock(c);
            (g.attr(ino, self.now_and_session()), g.ticket())
        };
        if let Some(a) = hit {
            return Ok(a);
        }
        let a = self.getattr_at_mds(ino).await?;
        lock(c).put_attr(&t, &a, self.now_and_session());
        Ok(a)
    }

    /// A `ReaddirPlus` page into the lease cache, if this client holds leases.
    pub(crate) fn cache_listing(&self, t: Option<Ticket>, dir: u64, page: &ReaddirPlusResp) {
        if let (Some(c), Some(t)) = (self.lease_cache(), t) {
            lock(c).put_listing(&t, dir, page, self.now_and_session());
        }
    }

    /// The ticket a request is asked under, if this client holds leases.
    pub(crate) fn lease_ticket(&self) -> Option<Ticket> {
        self.lease_cache().map(|c| lock(c).ticket())
    }
}

pub(crate) fn lock(c: &Mutex<MetaCache>) -> std::sync::MutexGuard<'_, MetaCache> {
    c.lock().unwrap_or_else(|e| e.into_inner())
}

/// The cache as the lease channel's holder: it applies recalls to its memory as they arrive.
struct Holder(Arc<Mutex<MetaCache>>);

impl LeaseHolder for Holder {
    fn held(&self) -> (u64, Option<Instant>) {
        let c = lock(&self.0);
        (c.trust.epoch(), c.trust.trust_until())
    }

    async fn received(&self, resp: &LeaseWaitResp, sent: Instant, session: u64) {
        lock(&self.0).received(resp, sent, session);
    }

    async fn lose(&self) {
        lock(&self.0).lose();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use weft_proto::msg::{NameReq, Recall};

    fn attr(ino: u64, kind: weft_proto::FileKind) -> Attr {
        Attr::new(ino, kind, 0o755)
    }

    fn granted() -> (MetaCache, Instant) {
        let t0 = Instant::now();
        let mut c = MetaCache::default();
        c.received(&LeaseWaitResp { epoch: 2, lease_ms: 1000, upto: 0, recalls: vec![] }, t0, 1);
        (c, t0)
    }

    fn recall(c: &mut MetaCache, t0: Instant, upto: u64, ino: u64, name: Option<&str>) {
        let recalls = vec![Recall { ino, name: name.map(String::from) }];
        c.received(&LeaseWaitResp { epoch: 2, lease_ms: 1000, upto, recalls }, t0, 1);
        c.check();
    }

    #[test]
    fn cached_answers_go_with_recalls_own_changes_and_the_leases() {
        use weft_proto::FileKind::{Dir, File};
        let (mut c, t0) = granted();
        let now = (t0, 1);
        let t = c.ticket();
        assert!(c.put_attr(&t, &attr(1, Dir), now) && c.put_entry(&t, 1, "a", &attr(5, File), now));
        assert_eq!(c.lookup(1, "a", now), Some(Cached::Entry(attr(1, Dir), attr(5, File))));
        assert!(!c.put_entry(&t, 1, "..", &attr(9, Dir), now), "'..' is never cached");
        assert!(c.attr(5, (t0, 2)).is_none(), "another MDS session");
        assert!(c.attr(5, (t0 + Duration::from_millis(1000), 1)).is_none(), "past the horizon");
        // A recall of the child's attributes: the entry stays, the lookup asks the MDS.
        recall(&mut c, t0, 1, 5, None);
        assert!(c.lookup(1, "a", now).is_none() && c.attr(1, now).is_some());
        assert!(!c.put_attr(&t, &attr(5, File), now), "asked before the recall");
        assert!(c.put_attr(&c.ticket(), &attr(5, File), now));
        // This client's own unlink of the name drops the entry, the directory's attributes and the child.
        let t = c.ticket();
        c.changed(own_change(&Request::Unlink(NameReq { parent: 1, name: "a".into() })));
        c.check();
        assert!(c.attr(1, now).is_none() && c.attr(5, now).is_none() && c.lookup(1, "a", now).is_none());
        assert!(!c.put_attr(&t, &attr(5, File), now), "a reply asked before the unlink");
        // A removal of a name never looked up here: its inode is not known, so everything goes.
        let t = c.ticket();
        assert!(c.put_attr(&t, &attr(7, File), now));
        c.changed(own_change(&Request::Unlink(NameReq { parent: 1, name: "b".into() })));
        assert!(c.attr(7, now).is_none() && !c.put_attr(&t, &attr(7, File), now));
        // A new epoch drops everything.
        let t = c.ticket();
        assert!(c.put_entry(&t, 1, "c", &attr(8, File), now) && c.put_attr(&t, &attr(1, Dir), now));
        c.received(&LeaseWaitResp { epoch: 3, lease_ms: 1000, upto: 0, recalls: vec![] }, t0, 1);
        assert!(c.attr(8, now).is_none() && c.lookup(1, "c", now).is_none() && c.counts().0 == 0);
        assert!(c.put_attr(&c.ticket(), &attr(8, File), now));
        c.lose();
        assert!(c.attr(8, now).is_none() && !c.put_attr(&c.ticket(), &attr(8, File), now));
    }

    #[test]
    fn missing_names_are_known_while_their_directory_is_leased() {
        use weft_proto::FileKind::{Dir, File};
        use weft_proto::msg::{CreateReq, RenameReq};
        let (mut c, t0) = granted();
        let now = (t0, 1);
        let t = c.ticket();
        assert!(!c.put_absent(&t, 1, "x", now), "the directory is not leased here");
        assert!(c.put_attr(&t, &attr(1, Dir), now) && c.put_absent(&t, 1, "x", now) && c.put_absent(&t, 1, "y", now));
        assert_eq!(c.lookup(1, "x", now), Some(Cached::Absent(attr(1, Dir))));
        // Own create of "x": its name is no longer missing; the directory's times moved, its mode did not.
        let t = c.ticket();
        let create = |n: &str| Request::Create(CreateReq { parent: 1, name: n.into(), mode: 0o644, exclusive: true });
        c.changed(own_change(&create("x")));
        c.check();
        assert!(c.lookup(1, "x", now).is_none() && c.attr(1, now).is_none());
        assert_eq!(c.lookup(1, "y", now), Some(Cached::Absent(attr(1, Dir))), "other missing names stay known");
        assert!(!c.put_absent(&t, 1, "x", now), "a lookup asked before the create");
        // Own rename onto a missing name: the source's inode is known, the target names none: nothing else goes.
        let t = c.ticket();
        assert!(c.put_entry(&t, 1, "a", &attr(5, File), now) && c.put_attr(&t, &attr(6, File), now));
        let rename = RenameReq { src_parent: 1, src_name: "a".into(), dst_parent: 1, dst_name: "y".into(), flags: 0 };
        c.changed(own_change(&Request::Rename(rename)));
        c.check();
        assert!(c.attr(5, now).is_none() && c.attr(6, now).is_some(), "only the moved inode");
        assert!(c.lookup(1, "y", now).is_none() && c.lookup(1, "a", now).is_none());
        // A trusted reply naming a name known missing (its creator's recall is on its way) replaces it.
        assert!(c.put_absent(&c.ticket(), 1, "w", now) && c.put_entry(&c.ticket(), 1, "w", &attr(9, File), now));
        c.check();
        assert_eq!(c.lookup(1, "w", now), Some(Cached::Entry(attr(1, Dir), attr(9, File))));
        // Another session's change of the directory's names recalls its attributes: every missing name goes.
        assert!(c.put_absent(&c.ticket(), 1, "z", now));
        recall(&mut c, t0, 1, 1, None);
        assert!(c.lookup(1, "z", now).is_none() && c.counts().0 == 3, "6 and 9, and the entry of 9");
    }

    #[test]
    fn an_own_change_caches_its_reply_unless_another_change_came_between() {
        use weft_proto::FileKind::{Dir, File};
        use weft_proto::Response;
        use weft_proto::msg::CreateReq;
        let (mut c, t0) = granted();
        let now = (t0, 1);
        assert!(c.put_attr(&c.ticket(), &attr(1, Dir), now) && c.put_absent(&c.ticket(), 1, "a", now));
        let create = Request::Create(CreateReq { parent: 1, name: "a".into(), mode: 0o644, exclusive: true });
        Pending::of(&create, c.ticket()).settle(&mut c, Some(&Response::Create(attr(5, File))), now);
        c.check();
        assert_eq!(c.lookup(1, "a", now), Some(Cached::Entry(attr(1, Dir), attr(5, File))), "the made entry");
        assert!(c.attr(1, now).is_none(), "the directory's times moved");
        // Two own requests in flight: the unlink's reply is handled before the create's. The create's reply is
        // then not cached, as the unlink may have come after it at the MDS.
        let unlink = Request::Unlink(NameReq { parent: 1, name: "b".into() });
        let create = Request::Create(CreateReq { parent: 1, name: "b".into(), mode: 0o644, exclusive: true });
        let (u, cr) = (Pending::of(&unlink, c.ticket()), Pending::of(&create, c.ticket()));
        u.settle(&mut c, Some(&Response::Unlink(())), now);
        cr.settle(&mut c, Some(&Response::Create(attr(6, File))), now);
        c.check();
        assert!(c.lookup(1, "b", now).is_none() && c.attr(6, now).is_none());
        // A failed create caches nothing.
        let create = Request::Create(CreateReq { parent: 1, name: "c".into(), mode: 0o644, exclusive: true });
        Pending::of(&create, c.ticket()).settle(&mut c, None, now);
        assert!(c.lookup(1, "c", now).is_none());
    }

    #[test]
    fn reads_change_nothing_and_unknown_changes_change_everything() {
        use weft_proto::msg::{InoReq, RenameReq};
        // The classification itself is weft-proto's (`changes.rs`); here, what the cache makes of it.
        assert_eq!(own_change(&Request::GetAttr(InoReq { ino: 3 })), Own::Nothing);
        let r = RenameReq { src_parent: 1, src_name: "a".into(), dst_parent: 1, dst_name: "b".into(), flags: 0 };
        let Own::Some(c) = own_change(&Request::Rename(r)) else { panic!("a rename changes names") };
        assert_eq!(c.dirs, vec![1], "one directory, once");
        assert_eq!(c.removed, vec![(1, "a".to_string()), (1, "b".to_string())]);
        assert_eq!(own_change(&Request::HealNow(())), Own::All);
        let (mut c, t0) = granted();
        let t = c.ticket();
        assert!(c.put_attr(&t, &attr(4, weft_proto::FileKind::File), (t0, 1)));
        c.changed(Own::All);
        assert!(c.attr(4, (t0, 1)).is_none() && !c.put_attr(&t, &attr(4, weft_proto::FileKind::File), (t0, 1)));
    }
}
