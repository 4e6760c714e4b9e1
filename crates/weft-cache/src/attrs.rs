//! Attributes and lookups in the bank (issue 16; items in docs/format.md §12): typed gets for the client and
//! pushes for the MDS.
//!
//! The MDS is the only writer: after each change commits it stores the new attributes of every inode the op
//! touched and the entry of every name it made, and deletes what the op removed ([`Bank::push_attr`],
//! [`Bank::push_entry`]). A push that cannot store tries a delete (a missing item is a miss, never wrong); when
//! both fail the daemon is being ejected, and the item's expiry (`attr_ttl_s`) bounds how long a copy left on it
//! may be served once it answers again. These items live on their owner daemon only (no fallback on the ring: a
//! copy left on a fallback could be read stale by a client whose view of the ring differs). Clients never store
//! them: a client's copy, read before a change and stored after that change's push, would overwrite newer
//! attributes. The MDS fills a missing item after serving it (`add`: never over an existing item).
//!
//! A lookup through the bank needs the entry (which inode the name names) and that inode's attributes. While a
//! name is its inode's sole name (the MDS records it, docs/format.md §6), the entry item carries the attributes
//! too, and the MDS refreshes it with every change of them: one multi-get of the directory's attributes and the
//! entry, to the one daemon that holds both (see `Bank::placement`). A file with several names (hard links) has
//! entries without attributes, since the MDS does not know every name to refresh: a client remembers which
//! inode each such name named last ([`EntryGuesses`], bounded) and asks for that inode's attributes in the same
//! multi-get; a wrong or missing guess costs a second round trip.

use weft_proto::Attr;

use crate::bank::Bank;
use crate::value::{AttrItem, CacheKey, LookupItem};

impl Bank {
    /// Whether attributes and lookups are cached (`attrs = true` and at least one daemon).
    pub fn caches_attrs(&self) -> bool {
        self.config().attrs && !self.config().servers.is_empty()
    }

    fn attr_expiry_s(&self) -> Option<u32> {
        Some(self.config().attr_ttl_s).filter(|&s| s > 0)
    }

    /// The attributes of `ino` in the bank, or `None` (absent, refused, or not answered in time).
    pub async fn get_attr(&self, ino: u64) -> Option<Attr> {
        let payload = self.get(&CacheKey::Attrs { ino }).await?;
        decoded(AttrItem::decode(&payload, ino), "attributes")
    }

    /// One multi-get for a lookup, to the one daemon that holds directory `parent`'s attributes and entries
    /// (see `Bank::placement`), plus the attributes of the inode the caller `guess`es the entry names when it
    /// gives one (worth it only for names whose entries carry no attributes: see [`EntryGuesses`]).
    pub async fn get_lookup(&self, parent: u64, name: &str, guess: Option<u64>) -> LookupFound {
        let mut keys = vec![CacheKey::Attrs { ino: parent }, self.lookup_key(parent, name)];
        keys.extend(guess.map(|ino| CacheKey::Attrs { ino }));
        let mut found = self.get_many(&keys).await.into_iter();
        let dir = found.next().flatten().and_then(|p| decoded(AttrItem::decode(&p, parent), "attributes"));
        let entry = found.next().flatten().and_then(|p| decoded(LookupItem::decode(&p, name), "lookup entry"));
        let guessed = found.next().flatten();
        let Some((child, carried)) = entry else { return LookupFound { dir, child: None, attr: None, carried: false } };
        if let Some(attr) = carried {
            return LookupFound { dir, child: Some(child), attr: Some(attr), carried: true };
        }
        // The guessed attributes are the child's only when the entry names the guess (AttrItem checks the ino).
        let attr =
            guessed.filter(|_| guess == Some(child)).and_then(|p| decoded(AttrItem::decode(&p, child), "attributes"));
        LookupFound { dir, child: Some(child), attr, carried: false }
    }

    /// Publishes the attributes of `ino` after a change: `Some` stores them, `None` (the inode is gone) deletes
    /// them. Returns whether the bank now holds no stale copy on the daemon that serves the key.
    pub async fn push_attr(&self, ino: u64, attr: Option<&Attr>) -> bool {
        let key = CacheKey::Attrs { ino };
        match attr {
            Some(a) => self.store_or_delete(&key, &AttrItem(a.clone()).encode()).await,
            None => self.delete(&key).await,
        }
    }

    /// Publishes directory `parent`'s entry `name` after a change: `Some((ino, attr))` stores it (with the
    /// child's attributes when `name` is its sole name), `None` (removed) deletes it. Returns as
    /// [`Bank::push_attr`].
    pub async fn push_entry(&self, parent: u64, name: &str, entry: Option<(u64, Option<&Attr>)>) -> bool {
        let key = self.lookup_key(parent, name);
        match entry {
            Some((ino, attr)) => {
                let item = LookupItem { name: name.to_string(), ino, attr: attr.cloned() };
                self.store_or_delete(&key, &item.encode()).await
            }
            None => self.delete(&key).await,
        }
    }

    /// Fill on miss: stores the attributes of `ino` only where the bank holds none, so a fill never replaces a
    /// push's item (nor anything else: a refused item stays refused until the next push or its expiry).
    pub async fn fill_attr(&self, ino: u64, attr: &Attr) -> bool {
        self.add_expiring(&CacheKey::Attrs { ino }, &AttrItem(attr.clone()).encode(), self.attr_expiry_s()).await
    }

    /// Fill on miss of directory `parent`'s entry `name` (as [`Bank::fill_attr`]; `attr` as in
    /// [`Bank::push_entry`]).
    pub async fn fill_entry(&self, parent: u64, name: &str, ino: u64, attr: Option<&Attr>) -> bool {
        let payload = LookupItem { name: name.to_string(), ino, attr: attr.cloned() }.encode();
        self.add_expiring(&self.lookup_key(parent, name), &payload, self.attr_expiry_s()).await
    }

    async fn store_or_delete(&self, key: &CacheKey, payload: &[u8]) -> bool {
        if self.set_expiring(key, payload, self.attr_expiry_s()).await {
            return true;
        }
        // Not stored (the daemon refused, failed or timed out): at least the old copy must not stay.
        self.delete(key).await
    }
}

/// What one lookup multi-get found ([`Bank::get_lookup`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupFound {
    /// The directory's attributes.
    pub dir: Option<Attr>,
    /// The inode the entry names.
    pub child: Option<u64>,
    /// The child's attributes: carried by the entry, or the guessed inode's when the entry named it.
    pub attr: Option<Attr>,
    /// Whether the entry carried them (the name is the child's sole name).
    pub carried: bool,
}

/// A payload that passed the value checks but not its own (another item's payload, or a name-hash collision):
/// a miss.
fn decoded<T>(r: Result<T, crate::value::PayloadError>, what: &str) -> Option<T> {
    r.map_err(|e| tracing::debug!("cached {what} refused: {e}")).ok()
}

/// Which inode each (directory, name) named when this client last looked it up: a direct-mapped table of
/// `slots` entries (a new name replaces whatever shared its slot), so bounded by construction. A guess is only
/// a hint for which attributes to fetch alongside the entry; the entry fetched with them decides.
#[derive(Debug)]
pub struct EntryGuesses {
    slots: Vec<std::sync::Mutex<(u64, u64, u64)>>,
}

impl EntryGuesses {
    /// A table of `slots` entries (0: no guesses).
    pub fn new(slots: usize) -> EntryGuesses {
        EntryGuesses { slots: (0..slots).map(|_| std::sync::Mutex::new((0, 0, 0))).collect() }
    }

    /// (slot, tag) of a name: both from one SHA-256 of the directory and the name (as the entry key's hash).
    fn place(&self, parent: u64, name: &str) -> Option<(usize, u64)> {
        if self.slots.is_empty() {
            return None;
        }
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(&parent.to_le_bytes());
        ctx.update(name.as_bytes());
        let d = ctx.finish();
        let d = d.as_ref();
        let slot = u64::from_le_bytes(d[..8].try_into().expect("8 bytes")) % self.slots.len() as u64;
        Some((slot as usize, u64::from_le_bytes(d[8..16].try_into().expect("8 bytes"))))
    }

    /// The inode `parent`'s `name` named last, if remembered.
    pub fn guess(&self, parent: u64, name: &str) -> Option<u64> {
        let (slot, tag) = self.place(parent, name)?;
        let (p, t, ino) = *self.slots[slot].lock().unwrap_or_else(|e| e.into_inner());
        (p == parent && t == tag && ino != 0).then_some(ino)
    }

    /// Remembers that `parent`'s `name` names `ino`.
    pub fn remember(&self, parent: u64, name: &str, ino: u64) {
        if let Some((slot, tag)) = self.place(parent, name) {
            *self.slots[slot].lock().unwrap_or_else(|e| e.into_inner()) = (parent, tag, ino);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guesses_are_bounded_and_only_for_the_same_name() {
        let g = EntryGuesses::new(8);
        assert_eq!(g.guess(1, "a"), None);
        g.remember(1, "a", 10);
        assert_eq!(g.guess(1, "a"), Some(10));
        assert_eq!(g.guess(2, "a"), None, "another directory");
        assert_eq!(g.guess(1, "b"), None, "another name");
        g.remember(1, "a", 11);
        assert_eq!(g.guess(1, "a"), Some(11), "the last answer wins");
        // Many names through 8 slots: never more than 8 remembered, the newest of each slot kept.
        for i in 0..1000u64 {
            g.remember(5, &format!("n{i}"), 100 + i);
        }
        let kept = (0..1000u64).filter(|i| g.guess(5, &format!("n{i}")) == Some(100 + i)).count();
        assert!((1..=8).contains(&kept), "{kept}");
        let none = EntryGuesses::new(0);
        none.remember(1, "a", 10);
        assert_eq!(none.guess(1, "a"), None);
    }
}
