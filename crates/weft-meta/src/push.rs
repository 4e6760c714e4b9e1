//! The MDS's side of the cache bank (issue 16): after a change commits and before its reply, the attributes of
//! every inode it touched and the entries of every name it made or removed are published to the bank.
//!
//! Pushes re-read the store instead of sending what the op computed, each under a lock striped by key: two
//! changes to one inode may commit in one order and push in the other, but the last push to take the lock reads
//! what the last commit wrote, so the bank ends with the newest state. Fill on miss (after the MDS served a
//! `GetAttr` or `Lookup`) re-reads the same way under the stripe but stores with `add` (only into an empty key,
//! never over a push); it runs off the reply's path and is dropped when `FILLS_MAX` are already running (a fill
//! is an optimisation; a push is not dropped, it waits for its stripe).

use std::sync::Arc;

use tokio::sync::{Mutex, Semaphore};
use weft_cache::Bank;
use weft_proto::msg::OpenResp;
use weft_proto::{Attr, Request, Response};

use crate::store::MetaStore;
use crate::{Namespace, RedbStore, SystemClock};

/// Lock stripes: pushes of different keys rarely wait for each other.
const STRIPES: usize = 256;
/// Fills running at once; more are dropped.
const FILLS_MAX: usize = 64;

/// A push publishes a change (store, or delete what is gone); a fill only stores into an empty key.
#[derive(Debug, Clone, Copy)]
enum Mode {
    Push,
    Fill,
}

/// What an op changed: inodes whose attributes to re-publish, and names whose entries to re-publish.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Touched {
    pub inos: Vec<u64>,
    pub names: Vec<(u64, String)>,
}

impl Touched {
    fn ino(&mut self, ino: u64) {
        if !self.inos.contains(&ino) {
            self.inos.push(ino);
        }
    }

    fn name(&mut self, parent: u64, name: &str) {
        self.ino(parent);
        self.names.push((parent, name.to_string()));
    }
}

pub(crate) struct Pusher {
    bank: Bank,
    ns: Arc<Namespace<RedbStore, SystemClock>>,
    stripes: Vec<Mutex<()>>,
    fills: Arc<Semaphore>,
}

impl Pusher {
    pub fn new(bank: Bank, ns: Arc<Namespace<RedbStore, SystemClock>>) -> Arc<Pusher> {
        Arc::new(Pusher {
            bank,
            ns,
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            fills: Arc::new(Semaphore::new(FILLS_MAX)),
        })
    }

    /// The names and inodes `req` may change, known before it runs: for a removal or rename the inode a name
    /// names now (read without a permission check: it only says what to refresh, and is never sent anywhere).
    pub fn before(&self, req: &Request) -> Touched {
        let mut t = Touched::default();
        match req {
            Request::SetAttr(r) => t.ino(r.ino),
            // An open for writing advances the data version.
            Request::Open(r) if r.rights.covers(weft_proto::Rights::WRITE) => t.ino(r.ino),
            Request::Commit(r) | Request::CommitWcc(r) => t.ino(r.ino),
            Request::SetLayout(r) => t.ino(r.ino),
            // An ACL changes the mode; any attribute change stamps the ctime.
            Request::SetXattr(r) => t.ino(r.ino),
            Request::RemoveXattr(r) => t.ino(r.ino),
            Request::Create(r) | Request::CreateOpen(r) => t.name(r.parent, &r.name),
            Request::Mkdir(r) => t.name(r.parent, &r.name),
            Request::Symlink(r) => t.name(r.parent, &r.name),
            Request::Mknod(r) => t.name(r.parent, &r.name),
            Request::Link(r) => {
                t.ino(r.ino);
                t.name(r.new_parent, &r.new_name);
            }
            Request::Unlink(r) | Request::Rmdir(r) => {
                self.named(&mut t, r.parent, &r.name);
                t.name(r.parent, &r.name);
            }
            Request::Rename(r) => {
                self.named(&mut t, r.src_parent, &r.src_name);
                self.named(&mut t, r.dst_parent, &r.dst_name);
                t.name(r.src_parent, &r.src_name);
                t.name(r.dst_parent, &r.dst_name);
            }
            _ => {}
        }
        t
    }

    /// Adds the inode `parent`/`name` names now, if any.
    fn named(&self, t: &mut Touched, parent: u64, name: &str) {
        if let Ok(Some((ino, _))) = self.ns.store().read(|x| x.get_dirent(parent, name)) {
            t.ino(ino);
        }
    }

    /// Completes `touched` with what the reply names (a new inode) and publishes it all; returns when every
    /// push is done (each bounded by the bank's deadline).
    pub async fn after(&self, mut touched: Touched, resp: &Response) {
        if let Some(a) = made(resp) {
            touched.ino(a.ino);
        }
        for ino in &touched.inos {
            self.refresh_attr(*ino, Mode::Push).await;
        }
        for (parent, name) in &touched.names {
            self.refresh_entry(*parent, name, Mode::Push).await;
        }
    }

    /// Fill on miss: after the MDS served `GetAttr`/`Lookup`, publish what it found, off the reply's path.
    pub fn fill(self: &Arc<Self>, req: &Request, resp: &Response) {
        let (name, ino) = match (req, resp) {
            (Request::GetAttr(r), Response::GetAttr(_)) => (None, r.ino),
            (Request::Lookup(r), Response::Lookup(a)) => (Some((r.parent, r.name.clone())), a.ino),
            _ => return,
        };
        let Ok(permit) = self.fills.clone().try_acquire_owned() else { return };
        let me = self.clone();
        tokio::spawn(async move {
            let _permit = permit;
            if let Some((parent, name)) = name {
                me.refresh_attr(parent, Mode::Fill).await;
                me.refresh_entry(parent, &name, Mode::Fill).await;
            }
            me.refresh_attr(ino, Mode::Fill).await;
        });
    }

    fn stripe(&self, hash: u64) -> &Mutex<()> {
        &self.stripes[(hash % STRIPES as u64) as usize]
    }

    /// Publishes what the store holds now for `ino`, under its stripe.
    async fn refresh_attr(&self, ino: u64, mode: Mode) {
        let _g = self.stripe(ino.wrapping_mul(0x9e37_79b9_7f4a_7c15)).lock().await;
        let attr = match self.ns.store().read(|t| t.get_inode(ino)) {
            Ok(i) => i.map(|i| i.attr()),
            Err(e) => {
                tracing::warn!(ino, "reading inode for the cache bank: {e}");
                None
            }
        };
        match (mode, attr) {
            (Mode::Fill, Some(a)) => {
                self.bank.fill_attr(ino, &a).await;
            }
            (Mode::Fill, None) => {}
            (Mode::Push, attr) => {
                if !self.bank.push_attr(ino, attr.as_ref()).await {
                    tracing::debug!(ino, "cache bank push of attributes failed; the item's expiry bounds it");
                }
            }
        }
    }

    /// Publishes what the store holds now for `parent`/`name`, under its stripe.
    async fn refresh_entry(&self, parent: u64, name: &str, mode: Mode) {
        let mut h = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(&(parent, name), &mut h);
        let _g = self.stripe(std::hash::Hasher::finish(&h)).lock().await;
        let ino = match self.ns.store().read(|t| t.get_dirent(parent, name)) {
            Ok(e) => e.map(|(ino, _)| ino),
            Err(e) => {
                tracing::warn!(parent, name, "reading an entry for the cache bank: {e}");
                None
            }
        };
        match (mode, ino) {
            (Mode::Fill, Some(ino)) => {
                self.bank.fill_entry(parent, name, ino).await;
            }
            (Mode::Fill, None) => {}
            (Mode::Push, ino) => {
                if !self.bank.push_entry(parent, name, ino).await {
                    tracing::debug!(parent, name, "cache bank push of an entry failed; the item's expiry bounds it");
                }
            }
        }
    }
}

/// The inode a reply says the op made or returned.
fn made(resp: &Response) -> Option<&Attr> {
    match resp {
        Response::Create(a) | Response::Mkdir(a) | Response::Symlink(a) | Response::Mknod(a) | Response::Link(a) => {
            Some(a)
        }
        Response::CreateOpen(OpenResp { attr, .. }) => Some(attr),
        _ => None,
    }
}
