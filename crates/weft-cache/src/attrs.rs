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

    /// One multi-get for a lookup: the attributes of directory `parent` (for the caller's own search-permission
    /// check) and the inode its entry `name` names.
    pub async fn get_parent_and_entry(&self, parent: u64, name: &str) -> (Option<Attr>, Option<u64>) {
        let keys = [CacheKey::Attrs { ino: parent }, CacheKey::lookup(parent, name)];
        let mut found = self.get_many(&keys).await.into_iter();
        let dir = found.next().flatten().and_then(|p| decoded(AttrItem::decode(&p, parent), "attributes"));
        let child = found.next().flatten().and_then(|p| decoded(LookupItem::decode(&p, name), "lookup entry"));
        (dir, child)
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

    /// Publishes directory `parent`'s entry `name` after a change: `Some(ino)` stores it, `None` (removed)
    /// deletes it. Returns as [`Bank::push_attr`].
    pub async fn push_entry(&self, parent: u64, name: &str, ino: Option<u64>) -> bool {
        let key = CacheKey::lookup(parent, name);
        match ino {
            Some(ino) => self.store_or_delete(&key, &LookupItem { name: name.to_string(), ino }.encode()).await,
            None => self.delete(&key).await,
        }
    }

    /// Fill on miss: stores the attributes of `ino` only where the bank holds none, so a fill never replaces a
    /// push's item (nor anything else: a refused item stays refused until the next push or its expiry).
    pub async fn fill_attr(&self, ino: u64, attr: &Attr) -> bool {
        self.add_expiring(&CacheKey::Attrs { ino }, &AttrItem(attr.clone()).encode(), self.attr_expiry_s()).await
    }

    /// Fill on miss of directory `parent`'s entry `name` (as [`Bank::fill_attr`]).
    pub async fn fill_entry(&self, parent: u64, name: &str, ino: u64) -> bool {
        let payload = LookupItem { name: name.to_string(), ino }.encode();
        self.add_expiring(&CacheKey::lookup(parent, name), &payload, self.attr_expiry_s()).await
    }

    async fn store_or_delete(&self, key: &CacheKey, payload: &[u8]) -> bool {
        if self.set_expiring(key, payload, self.attr_expiry_s()).await {
            return true;
        }
        // Not stored (the daemon refused, failed or timed out): at least the old copy must not stay.
        self.delete(key).await
    }
}

/// A payload that passed the value checks but not its own (another item's payload, or a name-hash collision):
/// a miss.
fn decoded<T>(r: Result<T, crate::value::PayloadError>, what: &str) -> Option<T> {
    r.map_err(|e| tracing::debug!("cached {what} refused: {e}")).ok()
}
