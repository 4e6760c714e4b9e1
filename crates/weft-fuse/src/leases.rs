//! The mount's metadata leases (docs/format.md §31): while the MDS holds a lease for this mount on an inode, the
//! kernel may cache its attributes and (for a directory) entries for `lease_timeout_ms` instead of the attribute
//! and entry timeouts; a recall from the MDS is applied with `notify_inval_inode` / `notify_inval_entry` before it
//! is acknowledged.
//!
//! [`LeaseView`] is the pure part: what was handed to the kernel under a lease, on top of weft-client's
//! [`LeaseTrust`] (the epoch, the trust horizon, the recalls heard lately: which replies may be trusted, [`Ticket`]).
//! [`run`] is the channel (weft-client's `lease_channel.rs`) on the mount's MDS session. Replies are sent to the
//! kernel under the view's lock, and recalls are recorded under it before they are applied, so a reply judged
//! trusted is in the kernel before the recall that voids it is applied.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use fuser::{INodeNo, Notifier};
use weft_client::lease_channel::{self, LeaseHolder};
use weft_client::lease_trust::LeaseTrust;
pub use weft_client::lease_trust::Ticket;
use weft_client::{Client, DirAfter};
use weft_proto::Attr;
use weft_proto::msg::LeaseWaitResp;

/// Inodes and entries handed to the kernel under leases, each; past it, replies get the plain timeouts.
pub const TRACKED_MAX: usize = 65_536;

/// One kernel invalidation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Inval {
    Attr(u64),
    Entry(u64, String),
    /// A directory's attributes and the listing the kernel caches of it (`FOPEN_CACHE_DIR`): its pages.
    Dir(u64),
}

#[derive(Debug, Default)]
pub struct LeaseView {
    trust: LeaseTrust,
    attrs: HashSet<u64>,
    entries: HashSet<(u64, String)>,
    /// Directories whose listings the kernel may cache (opened with `FOPEN_CACHE_DIR`): a recall of their
    /// attributes drops the listing too. (Every change of a directory's names recalls its attributes, docs/format.md
    /// §31; the kernel also checks the mtime, but a utimes could set it back.) With the attributes its open
    /// got, so the next open of it asks the MDS nothing.
    dirs: HashMap<u64, Attr>,
    /// Directories' attributes as this mount's own last create in each left them (op 147, docs/format.md §31),
    /// with the count of the client's own changes they hold ([`weft_client::DirAfter::sent`]): the kernel's
    /// `GETATTR` of one is answered from here while its lease holds and the count has not moved.
    after_create: HashMap<u64, (Attr, u64)>,
    /// Directories this mount made itself under a lease, with every name that may be in each: a name the set does
    /// not hold is missing while the directory's lease holds (another session's change of its names recalls the
    /// directory's attributes first, which drops the set), so the kernel's lookup of it before a create is
    /// answered here. Names go in before the mount's own request that may add them is sent, and out only once an
    /// unlink or rmdir of them succeeded: a set may hold a name that is gone, never miss one that exists.
    names: HashMap<u64, HashSet<String>>,
    /// Names in all sets of `names`: at most [`TRACKED_MAX`]; a set that would grow past it is dropped.
    names_held: usize,
}

impl LeaseView {
    pub fn ticket(&self) -> Ticket {
        self.trust.ticket()
    }

    fn trusted(&self, t: &Ticket, inos: &[u64], now: (Instant, u64)) -> bool {
        self.trust.trusted(t, inos, now)
    }

    /// A reply's attributes of `ino`: true if the kernel may cache them under the lease (then remembered).
    pub fn attr(&mut self, t: &Ticket, ino: u64, now: (Instant, u64)) -> bool {
        if !self.trusted(t, &[ino], now) || (self.attrs.len() >= TRACKED_MAX && !self.attrs.contains(&ino)) {
            return false;
        }
        self.attrs.insert(ino);
        true
    }

    /// A reply's entry `parent`/`name` naming `ino` (with its attributes): true if the kernel may cache both under
    /// the lease (then remembered).
    pub fn entry(&mut self, t: &Ticket, parent: u64, name: &str, ino: u64, now: (Instant, u64)) -> bool {
        let key = (parent, name.to_string());
        let full = self.entries.len() >= TRACKED_MAX && !self.entries.contains(&key);
        if full || !self.trusted(t, &[parent, ino], now) || !self.attr(t, ino, now) {
            return false;
        }
        self.entries.insert(key);
        true
    }

    /// A directory opened under `t` whose attributes the reply `attr` carried: true if the kernel may cache its
    /// listing under the lease (then remembered, so a recall drops the listing too).
    pub fn dir(&mut self, t: &Ticket, attr: &Attr, now: (Instant, u64)) -> bool {
        let full = self.dirs.len() >= TRACKED_MAX && !self.dirs.contains_key(&attr.ino);
        if full || !self.attr(t, attr.ino, now) {
            return false;
        }
        self.dirs.insert(attr.ino, attr.clone());
        true
    }

    /// The attributes a leased directory's last open got, if its lease holds now: it exists and is a directory
    /// (its removal would have recalled it), so an open needs nothing else from the MDS. (Its times may have moved
    /// with this mount's own changes: they only fill the listing's "." entry, which the kernel skips.)
    pub fn held_dir(&self, ino: u64, now: (Instant, u64)) -> Option<Attr> {
        if !self.trust.live(now) || !self.attrs.contains(&ino) {
            return None;
        }
        self.dirs.get(&ino).cloned()
    }

    /// A create's reply under `t` carried its directory's attributes `d`: true if they are kept for the kernel's
    /// next `GETATTR` of the directory (the reply is trusted, and no other own change overlapped the create).
    pub fn created_in(&mut self, t: &Ticket, d: &DirAfter, now: (Instant, u64)) -> bool {
        let ino = d.attr.ino;
        let full = self.after_create.len() >= TRACKED_MAX && !self.after_create.contains_key(&ino);
        if !d.alone || full || !self.attr(t, ino, now) {
            self.after_create.remove(&ino);
            return false;
        }
        self.after_create.insert(ino, (d.attr.clone(), d.sent));
        true
    }

    /// Directory `ino`'s attributes as this mount's last create in it left them, if its lease holds now and the
    /// client has sent no change of its own since (`sent_now`: its count now). A stale one is dropped.
    pub fn after_create(&mut self, ino: u64, sent_now: u64, now: (Instant, u64)) -> Option<Attr> {
        let (attr, sent) = self.after_create.get(&ino)?;
        if *sent != sent_now || !self.trust.live(now) || !self.attrs.contains(&ino) {
            self.after_create.remove(&ino);
            return None;
        }
        Some(attr.clone())
    }

    /// The mount made directory `ino` with a reply the kernel caches under the lease ([`LeaseView::entry`] said
    /// so): it was empty then, and every later change of its names is this mount's own or recalled.
    pub fn made_dir(&mut self, ino: u64) {
        if self.attrs.contains(&ino) && (self.names.len() < TRACKED_MAX || self.names.contains_key(&ino)) {
            self.drop_names(ino);
            self.names.insert(ino, HashSet::new());
        }
    }

    /// A whole listing of directory `ino` taken under `t` (its pages fetched after `t` was taken, while the kernel
    /// held the directory's lock): if no recall of the directory overtook it and its lease holds, `names` are all
    /// its names, kept as [`LeaseView::made_dir`] keeps a new directory's. True if kept.
    pub fn listed(&mut self, t: &Ticket, ino: u64, names: Vec<String>, now: (Instant, u64)) -> bool {
        self.drop_names(ino);
        let fits = self.names_held + names.len() <= TRACKED_MAX && self.names.len() < TRACKED_MAX;
        if !fits || !self.attrs.contains(&ino) || !self.trusted(t, &[ino], now) {
            return false;
        }
        let set: HashSet<String> = names.into_iter().filter(|n| n != "." && n != "..").collect();
        self.names_held += set.len();
        self.names.insert(ino, set);
        true
    }

    /// Before the mount's own request that may add `name` to `parent` (a create, mkdir, mknod, symlink, link or
    /// rename there) is sent: from now on the name is not known to be missing.
    pub fn adding(&mut self, parent: u64, name: &str) {
        let Some(set) = self.names.get_mut(&parent) else { return };
        if set.contains(name) {
            return;
        }
        if self.names_held >= TRACKED_MAX {
            self.drop_names(parent);
            return;
        }
        set.insert(name.to_string());
        self.names_held += 1;
    }

    /// The mount's own unlink or rmdir of `parent`/`name` succeeded: the name is gone.
    pub fn removed(&mut self, parent: u64, name: &str) {
        if let Some(set) = self.names.get_mut(&parent)
            && set.remove(name)
        {
            self.names_held -= 1;
        }
    }

    /// Whether `parent`/`name` is missing, known here without asking the MDS: the mount made `parent` and holds
    /// its lease now, and no request of its own that may have added the name was sent.
    pub fn missing(&self, parent: u64, name: &str, now: (Instant, u64)) -> bool {
        let Some(set) = self.names.get(&parent) else { return false };
        name != "." && name != ".." && !set.contains(name) && self.trust.live(now) && self.attrs.contains(&parent)
    }

    fn drop_names(&mut self, ino: u64) {
        if let Some(set) = self.names.remove(&ino) {
            self.names_held -= set.len();
        }
    }

    /// This mount changed `ino` behind its kernel's back (a commit at close or fsync): true if the kernel holds its
    /// attributes under a lease, which the caller then invalidates.
    pub fn forget_attr(&mut self, ino: u64) -> bool {
        self.after_create.remove(&ino);
        self.drop_names(ino);
        self.attrs.remove(&ino)
    }

    /// A `LeaseWait` reply to a call sent at `sent`, arrived on MDS session `session`: what to invalidate before
    /// acknowledging `resp.upto`.
    pub fn received(&mut self, resp: &LeaseWaitResp, sent: Instant, session: u64) -> Vec<Inval> {
        let mut out = Vec::new();
        if self.trust.loses_all(resp, session) {
            out = self.lose();
        }
        self.trust.received(resp, sent, session);
        for r in &resp.recalls {
            match &r.name {
                None => {
                    self.attrs.remove(&r.ino);
                    self.after_create.remove(&r.ino);
                    self.drop_names(r.ino);
                    let dir = self.dirs.remove(&r.ino).is_some();
                    out.push(if dir { Inval::Dir(r.ino) } else { Inval::Attr(r.ino) });
                }
                Some(n) => {
                    self.entries.remove(&(r.ino, n.clone()));
                    self.drop_names(r.ino);
                    out.push(Inval::Entry(r.ino, n.clone()));
                }
            }
        }
        out
    }

    /// Every lease is gone (the channel failed, or the trust ran out): what the kernel must forget.
    pub fn lose(&mut self) -> Vec<Inval> {
        self.trust.lose();
        self.after_create.clear();
        self.names.clear();
        self.names_held = 0;
        // A directory's attributes go with its listing (its `Inval::Dir`).
        let dirs = std::mem::take(&mut self.dirs);
        let attrs = self.attrs.drain().filter(|ino| !dirs.contains_key(ino)).map(Inval::Attr);
        let entries = self.entries.drain().map(|(p, n)| Inval::Entry(p, n));
        let mut out: Vec<Inval> = attrs.chain(entries).collect();
        out.extend(dirs.into_keys().map(Inval::Dir));
        out
    }

    pub fn trust_until(&self) -> Option<Instant> {
        self.trust.trust_until()
    }

    pub fn epoch(&self) -> u64 {
        self.trust.epoch()
    }

    /// Inodes and entries handed to the kernel under leases now (a cached listing's directory among the inodes),
    /// and recalls heard in all (for metrics).
    pub fn counts(&self) -> (usize, u64) {
        (self.attrs.len() + self.entries.len(), self.trust.heard())
    }
}

/// Serves the view's state as gauges: `weft_fuse_lease_epoch_live` (1 while the mount holds leases),
/// `weft_fuse_leased_items` and `weft_fuse_lease_recalls` (heard since the mount started).
pub fn register_metrics(m: &weft_rpc::Metrics, view: &Arc<Mutex<LeaseView>>) {
    let live = m.gauge("weft_fuse_lease_epoch_live", "1 while the mount holds metadata leases");
    let items = m.gauge("weft_fuse_leased_items", "inodes and entries the kernel caches under leases");
    let recalls = m.gauge("weft_fuse_lease_recalls", "lease recalls heard since the mount started");
    let view = view.clone();
    m.on_scrape(move || {
        let v = view.lock().unwrap_or_else(|e| e.into_inner());
        let (n, heard) = v.counts();
        live.set(i64::from(v.epoch() != 0 && v.trust_until().is_some_and(|u| Instant::now() < u)));
        // (Whether the MDS session is still the epoch's is checked per reply.)
        items.set(n as i64);
        recalls.set(heard as i64);
    });
}

/// Applies `invals` to the kernel's caches (a blocking write each, off the runtime's threads). An entry or inode
/// the kernel does not hold is not an error.
async fn apply(notifier: &Arc<Notifier>, invals: Vec<Inval>) {
    if invals.is_empty() {
        return;
    }
    let n = notifier.clone();
    let done = tokio::task::spawn_blocking(move || {
        for i in invals {
            let r = match &i {
                Inval::Attr(ino) => n.inval_inode(INodeNo(*ino), -1, 0),
                // Offset 0, length 0: the attributes and every cached page, the listing's included.
                Inval::Dir(ino) => n.inval_inode(INodeNo(*ino), 0, 0),
                Inval::Entry(parent, name) => n.inval_entry(INodeNo(*parent), OsStr::new(name)),
            };
            if let Err(e) = r
                && e.raw_os_error() != Some(libc::ENOENT)
            {
                tracing::debug!(?i, "lease recall: kernel invalidation failed: {e}");
            }
        }
    });
    if let Err(e) = done.await {
        tracing::warn!("lease recall: invalidation task failed: {e}");
    }
}

/// The view and the kernel as the lease channel's holder: recalls are recorded in the view, then applied to the
/// kernel, before the next call acknowledges them.
struct Holder {
    view: Arc<Mutex<LeaseView>>,
    notifier: Arc<Notifier>,
}

impl Holder {
    fn lock(&self) -> std::sync::MutexGuard<'_, LeaseView> {
        self.view.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl LeaseHolder for Holder {
    fn held(&self) -> (u64, Option<Instant>) {
        let v = self.lock();
        (v.epoch(), v.trust_until())
    }

    async fn received(&self, resp: &LeaseWaitResp, sent: Instant, session: u64) {
        let invals = self.lock().received(resp, sent, session);
        apply(&self.notifier, invals).await;
    }

    async fn lose(&self) {
        let invals = self.lock().lose();
        apply(&self.notifier, invals).await;
    }
}

/// The lease channel of a mount: runs until the task is aborted (at unmount).
pub async fn run(client: Client, view: Arc<Mutex<LeaseView>>, notifier: Arc<Notifier>) {
    let no_leases = "attribute and entry timeouts apply";
    lease_channel::run(move || Some(client.clone()), Holder { view, notifier }, no_leases).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use weft_client::lease_trust::RECENT_MAX;
    use weft_proto::msg::Recall;

    fn resp(epoch: u64, upto: u64, recalls: Vec<Recall>) -> LeaseWaitResp {
        LeaseWaitResp { epoch, lease_ms: 1000, upto, recalls }
    }

    #[test]
    fn replies_are_trusted_only_under_the_epoch_within_the_lease_and_before_a_recall() {
        let t0 = Instant::now();
        let mut v = LeaseView::default();
        let before = v.ticket();
        assert!(!v.attr(&before, 5, (t0, 1)), "no epoch yet");
        assert!(v.received(&resp(7, 0, vec![]), t0, 1).is_empty());
        assert!(!v.attr(&before, 5, (t0, 1)), "asked before the epoch");
        let t = v.ticket();
        assert!(v.attr(&t, 5, (t0, 1)));
        assert!(!v.attr(&t, 5, (t0 + Duration::from_millis(1000), 1)), "past the trust horizon");
        assert!(!v.attr(&t, 5, (t0, 2)), "a reply on another MDS session: the service lost the leases");
        assert!(v.entry(&t, 1, "a", 6, (t0, 1)));
        // A recall of inode 6 overtakes a reply about it: that reply is not trusted, others still are.
        let inv = v.received(&resp(7, 1, vec![Recall { ino: 6, name: None }]), t0, 1);
        assert_eq!(inv, vec![Inval::Attr(6)]);
        assert!(!v.attr(&t, 6, (t0, 1)) && !v.entry(&t, 1, "b", 6, (t0, 1)));
        assert!(v.attr(&t, 9, (t0, 1)), "another inode");
        assert!(v.attr(&v.ticket(), 6, (t0, 1)), "asked after the recall");
        // A new epoch drops everything handed out.
        let mut inv = v.received(&resp(8, 0, vec![]), t0, 1);
        inv.sort_by_key(|i| format!("{i:?}"));
        assert_eq!(inv, vec![Inval::Attr(5), Inval::Attr(6), Inval::Attr(9), Inval::Entry(1, "a".into())]);
        assert!(!v.attr(&t, 5, (t0, 1)), "a ticket of the old epoch");
        // Losing the channel drops everything, and nothing is trusted until a new epoch.
        let t = v.ticket();
        assert!(v.entry(&t, 1, "c", 3, (t0, 1)));
        let mut inv = v.lose();
        inv.sort_by_key(|i| format!("{i:?}"));
        assert_eq!(inv, vec![Inval::Attr(3), Inval::Entry(1, "c".into())]);
        assert!(!v.attr(&v.ticket(), 3, (t0, 1)));
        assert!(v.received(&resp(0, 0, vec![]), t0, 1).is_empty() && v.trust_until().is_none(), "no leases here");
    }

    #[test]
    fn an_entry_recall_names_the_directory_and_a_reply_older_than_every_remembered_recall_is_not_trusted() {
        let t0 = Instant::now();
        let mut v = LeaseView::default();
        v.received(&resp(1, 0, vec![]), t0, 1);
        let t = v.ticket();
        let inv = v.received(&resp(1, 1, vec![Recall { ino: 1, name: Some("x".into()) }]), t0, 1);
        assert_eq!(inv, vec![Inval::Entry(1, "x".into())]);
        assert!(!v.entry(&t, 1, "y", 4, (t0, 1)), "the directory was recalled since");
        let t = v.ticket();
        let many: Vec<Recall> = (0..=RECENT_MAX as u64).map(|i| Recall { ino: 1000 + i, name: None }).collect();
        v.received(&resp(1, 2, many), t0, 1);
        assert!(!v.attr(&t, 5, (t0, 1)), "recalls it asked before may have been forgotten");
        assert!(v.attr(&v.ticket(), 5, (t0, 1)));
    }

    #[test]
    fn a_directorys_attributes_after_a_create_are_kept_only_while_nothing_else_could_have_moved_them() {
        let t0 = Instant::now();
        let now = (t0, 1);
        let after = |ino, alone, sent| DirAfter { attr: Attr::new(ino, weft_proto::FileKind::Dir, 0o755), alone, sent };
        let mut v = LeaseView::default();
        let before = v.ticket();
        v.received(&resp(1, 0, vec![]), t0, 1);
        assert!(!v.created_in(&before, &after(2, true, 5), now), "asked before the epoch");
        let t = v.ticket();
        assert!(!v.created_in(&t, &after(2, false, 5), now), "another own change overlapped the create");
        assert!(v.after_create(2, 5, now).is_none());
        assert!(v.created_in(&t, &after(2, true, 5), now));
        assert_eq!(v.after_create(2, 5, now).map(|a| a.ino), Some(2), "answered while nothing moved");
        assert!(v.after_create(2, 5, (t0, 2)).is_none(), "another MDS session");
        assert!(v.after_create(2, 6, now).is_none(), "an own change sent since");
        assert!(v.after_create(2, 5, now).is_none(), "and dropped for good");
        assert!(v.created_in(&t, &after(3, true, 7), now) && v.created_in(&t, &after(4, true, 7), now));
        let inv = v.received(&resp(1, 1, vec![Recall { ino: 3, name: None }]), t0, 1);
        assert_eq!(inv, vec![Inval::Attr(3)]);
        assert!(v.after_create(3, 7, now).is_none(), "recalled");
        assert!(!v.created_in(&t, &after(3, true, 7), now), "a reply asked before the recall");
        assert!(v.after_create(4, 7, (t0 + Duration::from_millis(1000), 1)).is_none(), "past the trust horizon");
        assert!(v.created_in(&v.ticket(), &after(4, true, 7), now));
        assert!(v.forget_attr(4) && v.after_create(4, 7, now).is_none(), "changed behind the kernel's back");
        assert!(v.created_in(&v.ticket(), &after(4, true, 7), now));
        v.lose();
        assert!(v.after_create(4, 7, now).is_none(), "the leases are gone");
    }

    /// Every way a directory's name set is made, grows, shrinks and goes: a name is answered missing only while
    /// the set holds and does not name it.
    #[test]
    fn a_made_directorys_names_answer_missing_ones_only_while_its_lease_holds_and_nothing_may_have_added_them() {
        let t0 = Instant::now();
        let now = (t0, 1);
        let mut v = LeaseView::default();
        v.received(&resp(1, 0, vec![]), t0, 1);
        v.made_dir(2);
        assert!(!v.missing(2, "a", now), "made without a lease on it");
        let t = v.ticket();
        assert!(v.entry(&t, 1, "d", 2, now));
        v.made_dir(2);
        assert!(v.missing(2, "a", now), "made here under its lease: empty");
        assert!(!v.missing(2, ".", now) && !v.missing(2, "..", now), "never");
        assert!(!v.missing(3, "a", now), "a directory not made here");
        v.adding(2, "a");
        assert!(!v.missing(2, "a", now) && v.missing(2, "b", now), "a request that may add it was sent");
        v.removed(2, "a");
        assert!(v.missing(2, "a", now), "unlinked");
        v.adding(2, "a");
        assert!(!v.missing(2, "a", (t0, 2)) && !v.missing(2, "b", (t0, 2)), "another MDS session");
        assert!(!v.missing(2, "b", (t0 + Duration::from_millis(1000), 1)), "past the trust horizon");
        // Another session's change of the directory's names recalls its attributes: the set goes for good.
        assert_eq!(v.received(&resp(1, 1, vec![Recall { ino: 2, name: None }]), t0, 1), vec![Inval::Attr(2)]);
        assert!(!v.missing(2, "b", now));
        assert!(v.entry(&v.ticket(), 1, "d", 2, now), "leased again by a lookup");
        assert!(!v.missing(2, "b", now), "what changed in between is not known");
        // A recall of one of its names, a commit behind the kernel's back, lost leases: each drops it.
        for drop in 0..3 {
            let t = v.ticket();
            assert!(v.entry(&t, 1, "e", 4, now));
            v.made_dir(4);
            v.adding(4, "x");
            assert!(v.missing(4, "y", now));
            match drop {
                0 => assert_eq!(
                    v.received(&resp(1, 2, vec![Recall { ino: 4, name: Some("x".into()) }]), t0, 1),
                    vec![Inval::Entry(4, "x".into())]
                ),
                1 => assert!(v.forget_attr(4)),
                _ => {
                    v.lose();
                }
            }
            assert!(!v.missing(4, "y", now), "case {drop}");
            assert_eq!(v.names_held, v.names.values().map(HashSet::len).sum::<usize>(), "case {drop}");
        }
    }

    /// A whole listing taken under the lease makes the directory's names known, as a mkdir does; a listing a
    /// recall overtook, or of a directory not leased, does not, and drops what was known.
    #[test]
    fn a_whole_listing_under_the_lease_makes_a_directorys_names_known() {
        let t0 = Instant::now();
        let now = (t0, 1);
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let mut v = LeaseView::default();
        v.received(&resp(1, 0, vec![]), t0, 1);
        let t = v.ticket();
        assert!(!v.listed(&t, 2, names(&["a"]), now), "the directory is not leased");
        assert!(v.attr(&t, 2, now));
        assert!(v.listed(&t, 2, names(&[".", "..", "a", "b"]), now));
        assert!(v.missing(2, "c", now) && !v.missing(2, "a", now) && !v.missing(2, "b", now));
        v.received(&resp(1, 1, vec![Recall { ino: 2, name: None }]), t0, 1);
        assert!(!v.missing(2, "c", now), "recalled");
        assert!(v.attr(&v.ticket(), 2, now), "leased again");
        assert!(!v.listed(&t, 2, names(&["a"]), now), "a listing asked before the recall");
        assert!(v.listed(&v.ticket(), 2, names(&["a"]), now) && v.missing(2, "b", now));
        let many: Vec<String> = (0..=TRACKED_MAX).map(|i| format!("n{i}")).collect();
        assert!(!v.listed(&v.ticket(), 2, many, now), "past the bound");
        assert!(!v.missing(2, "b", now), "and what was known is dropped");
        assert_eq!(v.names_held, 0);
    }

    #[test]
    fn name_sets_are_bounded_by_dropping_the_one_that_would_grow_past_the_bound() {
        let t0 = Instant::now();
        let now = (t0, 1);
        let mut v = LeaseView::default();
        v.received(&resp(1, 0, vec![]), t0, 1);
        let t = v.ticket();
        assert!(v.entry(&t, 1, "d", 2, now) && v.entry(&t, 1, "e", 3, now));
        v.made_dir(2);
        v.made_dir(3);
        for i in 0..TRACKED_MAX - 1 {
            v.adding(2, &format!("n{i}"));
        }
        v.adding(3, "last");
        assert_eq!(v.names_held, TRACKED_MAX);
        v.adding(3, "one-too-many");
        assert!(!v.missing(3, "other", now), "dropped rather than wrong");
        assert!(v.missing(2, "other", now) && !v.missing(2, "n0", now), "the other set stands");
        assert_eq!(v.names_held, TRACKED_MAX - 1);
    }

    #[test]
    fn a_cached_listing_is_dropped_with_its_directorys_attributes_and_with_the_leases() {
        let dir = |ino| Attr::new(ino, weft_proto::FileKind::Dir, 0o755);
        let t0 = Instant::now();
        let mut v = LeaseView::default();
        let before = v.ticket();
        v.received(&resp(1, 0, vec![]), t0, 1);
        assert!(!v.dir(&before, &dir(2), (t0, 1)), "opened before the epoch: not cached");
        assert!(v.held_dir(2, (t0, 1)).is_none());
        let t = v.ticket();
        assert!(v.dir(&t, &dir(2), (t0, 1)) && v.dir(&t, &dir(3), (t0, 1)));
        assert_eq!(v.held_dir(2, (t0, 1)), Some(dir(2)), "the next open asks the MDS nothing");
        assert!(v.held_dir(2, (t0, 2)).is_none(), "another MDS session");
        assert!(v.held_dir(2, (t0 + Duration::from_millis(1000), 1)).is_none(), "past the trust horizon");
        let inv = v.received(&resp(1, 1, vec![Recall { ino: 2, name: None }]), t0, 1);
        assert_eq!(inv, vec![Inval::Dir(2)], "the listing goes with the attributes");
        assert!(v.held_dir(2, (t0, 1)).is_none(), "recalled");
        assert!(!v.dir(&t, &dir(2), (t0, 1)), "opened before the recall");
        let inv = v.received(&resp(1, 2, vec![Recall { ino: 2, name: None }]), t0, 1);
        assert_eq!(inv, vec![Inval::Attr(2)], "no listing held any more");
        assert_eq!(v.lose(), vec![Inval::Dir(3)], "a directory's attributes go with its listing");
    }
}
