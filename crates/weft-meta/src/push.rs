//! The MDS's side of the cache bank (issue 16): after a change commits and before its reply, the attributes of
//! every inode it touched and the entries of every name it made or removed are published to the bank.
//!
//! Pushes re-read the store instead of sending what the op computed, each under a lock striped by key: two
//! changes to one inode may commit in one order and push in the other, but the last push to take the lock reads
//! what the last commit wrote, so the bank ends with the newest state. Fill on miss (after the MDS served a
//! `GetAttr` or `Lookup`) re-reads the same way under the stripe but stores with `add` (only into an empty key,
//! never over a push); it runs off the reply's path and is dropped when `FILLS_MAX` are already running (a fill
//! is an optimisation; a push is not dropped, it waits for its stripe). A key filled lately is not filled again
//! ([`FilledLately`]): a client whose lookups miss in its own key namespace, or one not using the bank, would
//! otherwise cost the MDS a store read and an `add` per key on every call it serves.

use std::sync::Arc;

use tokio::sync::{Mutex, Semaphore};
use weft_cache::Bank;
use weft_proto::{Request, Response};

use crate::MdsNamespace;
use crate::store::MetaStore;
use crate::touched::{Touched, made};

/// Lock stripes: pushes of different keys rarely wait for each other.
const STRIPES: usize = 256;
/// Fills running at once; more are dropped.
const FILLS_MAX: usize = 64;

/// Slots of the "filled lately" table (direct-mapped, so bounded by construction).
const FILLED_SLOTS: usize = 16384;
/// How long a fill is remembered when items never expire (`attr_ttl_s = 0`).
const FILLED_HOLD_MS_MAX: u64 = 30_000;

/// Keys this MDS filled lately, as (tag, when): a fill of one of them within `hold_ms` is skipped. Skipping a fill
/// never makes an answer wrong (a fill only `add`s into an empty key); it costs at most a miss. A push of a key
/// forgets it (its item may have been deleted), and so does any change in the bank's health (a daemon that failed
/// or came back may have lost its items). Half the item expiry, so an item that expired is filled again soon.
struct FilledLately {
    slots: Vec<std::sync::Mutex<(u64, u64)>>,
    hold_ms: u64,
    epoch: std::time::Instant,
    /// `Bank::health_changes` when the table was last valid.
    health: std::sync::atomic::AtomicU64,
}

impl FilledLately {
    fn new(attr_ttl_s: u32) -> FilledLately {
        let hold_ms = match attr_ttl_s {
            0 => FILLED_HOLD_MS_MAX,
            s => (u64::from(s) * 1000 / 2).min(FILLED_HOLD_MS_MAX),
        };
        FilledLately {
            slots: (0..FILLED_SLOTS).map(|_| std::sync::Mutex::new((0, 0))).collect(),
            hold_ms,
            epoch: std::time::Instant::now(),
            health: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        // +1: a slot's time 0 means empty.
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    fn slot(&self, tag: u64) -> std::sync::MutexGuard<'_, (u64, u64)> {
        self.slots[(tag % FILLED_SLOTS as u64) as usize].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `tag` should be filled now (and if so, it is remembered as filled). `health` is the bank's
    /// `health_changes`: when it moved since the last call, everything remembered is forgotten.
    fn should_fill(&self, tag: u64, health: u64) -> bool {
        use std::sync::atomic::Ordering;
        if self.health.swap(health, Ordering::Relaxed) != health {
            for s in &self.slots {
                *s.lock().unwrap_or_else(|e| e.into_inner()) = (0, 0);
            }
        }
        let now = self.now_ms();
        let mut s = self.slot(tag);
        if s.0 == tag && s.1 != 0 && now.saturating_sub(s.1) < self.hold_ms {
            return false;
        }
        *s = (tag, now);
        true
    }

    /// A push of `tag`: its item may be gone, so the next fill goes through.
    fn forget(&self, tag: u64) {
        let mut s = self.slot(tag);
        if s.0 == tag {
            *s = (0, 0);
        }
    }
}

/// The tag of an attributes key (`entry: None`) or of an entry key in the "filled lately" table.
fn fill_tag(ino_or_parent: u64, entry: Option<&str>) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    std::hash::Hash::hash(&(ino_or_parent, entry), &mut h);
    std::hash::Hasher::finish(&h)
}

/// A push publishes a change (store, or delete what is gone); a fill only stores into an empty key.
#[derive(Debug, Clone, Copy)]
enum Mode {
    Push,
    Fill,
}

pub(crate) struct Pusher {
    bank: Bank,
    ns: Arc<MdsNamespace>,
    stripes: Vec<Mutex<()>>,
    fills: Arc<Semaphore>,
    filled: FilledLately,
}

impl Pusher {
    pub fn new(bank: Bank, ns: Arc<MdsNamespace>) -> Arc<Pusher> {
        Arc::new(Pusher {
            filled: FilledLately::new(bank.config().attr_ttl_s),
            bank,
            ns,
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            fills: Arc::new(Semaphore::new(FILLS_MAX)),
        })
    }

    /// Completes `touched` with what the reply names (a new inode) and publishes it all; returns when every
    /// push is done (each bounded by the bank's deadline).
    pub async fn after(&self, mut touched: Touched, resp: &Response) {
        if let Some(ino) = made(resp) {
            touched.ino(ino);
        }
        for ino in touched.inos.clone() {
            // The entry of the inode's sole name carries its attributes: published again too (once).
            if let Some((parent, name)) = self.refresh_attr(ino, Mode::Push).await
                && !touched.names.iter().any(|(p, n)| *p == parent && *n == name)
            {
                touched.names.push((parent, name));
            }
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
        // Only what was not filled lately: a lookup storm that misses must not become a fill storm.
        let health = self.bank.health_changes();
        let parent = name.filter(|(parent, name)| {
            let dir = self.filled.should_fill(fill_tag(*parent, None), health);
            let entry = self.filled.should_fill(fill_tag(*parent, Some(name)), health);
            dir || entry
        });
        let child = self.filled.should_fill(fill_tag(ino, None), health);
        if parent.is_none() && !child {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            let _permit = permit;
            if let Some((parent, name)) = parent {
                me.refresh_attr(parent, Mode::Fill).await;
                me.refresh_entry(parent, &name, Mode::Fill).await;
            }
            if child {
                me.refresh_attr(ino, Mode::Fill).await;
            }
        });
    }

    fn stripe(&self, hash: u64) -> &Mutex<()> {
        &self.stripes[(hash % STRIPES as u64) as usize]
    }

    /// Publishes what the store holds now for `ino`, under its stripe; returns the inode's sole name, whose
    /// entry carries these attributes (the caller publishes it, after this stripe is released). A directory with
    /// an access ACL is published as absent: a client decides from a directory's bank attributes whether a user
    /// may search it (mode bits only), and a named ACL entry can refuse what the mode grants, so lookups in such a
    /// directory go to the MDS, which applies the ACL (issue 31).
    async fn refresh_attr(&self, ino: u64, mode: Mode) -> Option<(u64, String)> {
        let _g = self.stripe(ino.wrapping_mul(0x9e37_79b9_7f4a_7c15)).lock().await;
        let read = self.ns.store().read(|t| {
            let Some(inode) = t.get_inode(ino)? else { return Ok(None) };
            let acl = inode.kind == weft_proto::FileKind::Dir && t.get_xattr(ino, crate::acl::ACCESS_XATTR)?.is_some();
            Ok::<_, crate::MetaError>(Some((inode, acl)))
        });
        let read = read.unwrap_or_else(|e| {
            tracing::warn!(ino, "reading inode for the cache bank: {e}");
            None
        });
        let sole_name = read.as_ref().and_then(|(i, _)| i.sole_name.clone());
        let attr = read.filter(|(_, acl)| !acl).map(|(i, _)| i.attr());
        match (mode, attr) {
            (Mode::Fill, Some(a)) => {
                self.bank.fill_attr(ino, &a).await;
            }
            (Mode::Fill, None) => {}
            (Mode::Push, attr) => {
                self.filled.forget(fill_tag(ino, None));
                if !self.bank.push_attr(ino, attr.as_ref()).await {
                    tracing::debug!(ino, "cache bank push of attributes failed; the item's expiry bounds it");
                }
            }
        }
        sole_name
    }

    /// Publishes what the store holds now for `parent`/`name`, under its stripe: the inode it names, with that
    /// inode's attributes when `name` is its sole name (read in the same transaction).
    async fn refresh_entry(&self, parent: u64, name: &str, mode: Mode) {
        let mut h = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(&(parent, name), &mut h);
        let _g = self.stripe(std::hash::Hasher::finish(&h)).lock().await;
        let entry = self.ns.store().read(|t| {
            let Some((ino, _)) = t.get_dirent(parent, name)? else { return Ok(None) };
            let attr = t.get_inode(ino)?.filter(|i| i.is_sole_name(parent, name)).map(|i| i.attr());
            Ok::<_, crate::MetaError>(Some((ino, attr)))
        });
        let entry = entry.unwrap_or_else(|e| {
            tracing::warn!(parent, name, "reading an entry for the cache bank: {e}");
            None
        });
        match (mode, entry) {
            (Mode::Fill, Some((ino, attr))) => {
                self.bank.fill_entry(parent, name, ino, attr.as_ref()).await;
            }
            (Mode::Fill, None) => {}
            (Mode::Push, entry) => {
                self.filled.forget(fill_tag(parent, Some(name)));
                let entry = entry.as_ref().map(|(ino, attr)| (*ino, attr.as_ref()));
                if !self.bank.push_entry(parent, name, entry).await {
                    tracing::debug!(parent, name, "cache bank push of an entry failed; the item's expiry bounds it");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_filled_lately_is_skipped_until_pushed_or_the_bank_changes() {
        let f = FilledLately::new(60);
        let (a, b) = (fill_tag(7, None), fill_tag(7, Some("x")));
        assert_ne!(a, b, "an inode's attributes and an entry of it are different keys");
        assert!(f.should_fill(a, 0), "first fill");
        assert!(!f.should_fill(a, 0), "filled lately");
        assert!(f.should_fill(b, 0), "another key");
        f.forget(a);
        assert!(f.should_fill(a, 0), "a push forgets");
        assert!(!f.should_fill(a, 0));
        assert!(f.should_fill(a, 1), "the bank's health moved: everything forgotten");
        assert!(f.should_fill(b, 1), "the other key too");
        assert!(!f.should_fill(b, 1));
        // Bounded: many keys through the table never grow it, and each is filled at least once.
        for i in 0..(3 * FILLED_SLOTS as u64) {
            assert!(f.should_fill(fill_tag(1000 + i, None), 1));
        }
        assert_eq!(f.slots.len(), FILLED_SLOTS);
        let none = FilledLately::new(0);
        assert_eq!(none.hold_ms, FILLED_HOLD_MS_MAX, "items that never expire: the longest hold");
        assert_eq!(FilledLately::new(10).hold_ms, 5_000, "half the expiry");
    }
}
