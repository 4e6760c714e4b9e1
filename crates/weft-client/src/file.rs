//! An open file's I/O as its users call it: read, write, truncate, fsync and close (the commit). Each goes down
//! through `redundancy.rs` to the layout's data path (`plain.rs`, `mirror.rs`, `ec.rs`, over `striped.rs`); the
//! file's state is `handle.rs`'s. Close-to-open: close and fsync make this handle's writes durable on their data
//! servers (`Fsync`) before the size commit at the metadata service.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use bytes::{Bytes, BytesMut};
use weft_proto::{Attr, Rights};

use crate::capability::is_expired;
use crate::handle::File;
use crate::{Client, ClientError};

impl File {
    /// Writes all of `data` at `offset`, to every server involved in parallel.
    pub async fn write_at(&self, offset: u64, data: Bytes) -> Result<(), ClientError> {
        let len = data.len() as u64;
        if len == 0 {
            return Ok(());
        }
        let end = offset
            .checked_add(len)
            .ok_or_else(|| ClientError::InvalidPath(format!("write at {offset} of {len} bytes overflows")))?;
        crate::redundancy::write(self, offset, data, end).await
    }

    /// Reads into `buf` (its length is the amount wanted) from `offset`; returns it cut to what lies before the end
    /// of the file. Holes read as zeros. With the cache bank on, blocks found there are copied in and only the
    /// rest is read from the data servers (which then store it in the bank).
    pub async fn read_at(&self, offset: u64, mut buf: BytesMut) -> Result<BytesMut, ClientError> {
        let avail = self.size().saturating_sub(offset).min(buf.len() as u64);
        buf.truncate(avail as usize);
        if avail == 0 {
            return Ok(buf);
        }
        crate::redundancy::read(self, offset, buf, avail).await
    }

    /// Truncates (or extends) the objects only; the caller records the size at the metadata service.
    pub(crate) async fn truncate_objects_only(&self, size: u64) -> Result<(), ClientError> {
        let _gate = self.size_gate.lock().await;
        self.note_truncate(size);
        self.wrote.store(true, Ordering::SeqCst);
        crate::redundancy::truncate(self, size).await?;
        self.size.store(size, Ordering::SeqCst);
        Ok(())
    }

    /// ftruncate through this handle, as its own user: see [`File::truncate_by`].
    pub async fn truncate(&self, size: u64) -> Result<(), ClientError> {
        self.truncate_by(&self.client, size).await
    }

    /// ftruncate through this handle on behalf of `who` (a client acting as the user who asked: a FUSE mount
    /// shares one `File` among its users). The right is this handle's open for writing, as Linux's
    /// `do_ftruncate` checks only the descriptor: a file created `O_CREAT|O_RDWR` with mode 0 can be cut. The MDS
    /// is shown the open's write capability (`SetSizeOpen`), never a claim; `who`'s identity decides, at the MDS,
    /// whether set-ID bits go.
    pub async fn truncate_by(&self, who: &Client, size: u64) -> Result<(), ClientError> {
        if !self.rights().covers(Rights::WRITE) {
            return Err(ClientError::Access(format!("file inode {} is not open for writing", self.attr.ino)));
        }
        self.set_size(who, size, true).await
    }

    /// truncate(2) of a file this handle holds open, as `who`, who must have write permission by the mode now
    /// (`SetAttr`; the caller checks it first, before the objects change). Through the handle so that its size
    /// and its commits stay ordered with the cut (`size_gate`).
    pub async fn truncate_path_as(&self, who: &Client, size: u64) -> Result<(), ClientError> {
        self.set_size(who, size, false).await
    }

    /// Sets the file's size: objects first, then the metadata service, with the right of the open (`by_open`) or
    /// of the mode.
    async fn set_size(&self, who: &Client, size: u64, by_open: bool) -> Result<(), ClientError> {
        let _gate = self.size_gate.lock().await;
        self.note_truncate(size);
        self.wrote.store(true, Ordering::SeqCst);
        crate::redundancy::truncate(self, size).await?;
        let attr = if by_open {
            self.record_size_by_open(who, size).await?
        } else {
            let set = weft_proto::SetAttrs { size: Some(size), ..Default::default() };
            who.meta_setattr_only(self.attr.ino, set).await?
        };
        self.mode.store(attr.mode, Ordering::SeqCst);
        self.size.store(size, Ordering::SeqCst);
        Ok(())
    }

    /// `SetSizeOpen` with this handle's write capability, renewed and sent once more if the MDS found it expired.
    async fn record_size_by_open(&self, who: &Client, size: u64) -> Result<Attr, ClientError> {
        let cap = self.caps.get().await?;
        match who.set_size_open(self.attr.ino, size, cap.clone()).await {
            Err(ClientError::Meta(e)) if is_expired(&e) => {
                let fresh = self.caps.renew_from(&cap).await?;
                who.set_size_open(self.attr.ino, size, fresh).await
            }
            r => r,
        }
    }

    /// Whether the file may have a set-ID bit, as this handle last learned its mode: a write need not look further
    /// when it has none.
    pub fn may_be_set_id(&self) -> bool {
        self.mode.load(Ordering::SeqCst) & 0o6000 != 0
    }

    /// Before a write by `writer` (a client acting as the user who writes) that may not keep set-ID bits: asks the
    /// MDS, as `writer`, to drop them now, if the mode this handle knows would lose any for that user
    /// ([`weft_proto::mode_after_unprivileged_write`]). The ask is a `Commit` that raises neither size nor mtime:
    /// the MDS drops the bits at every commit by a caller who is not root (format §2), judged by the identity it
    /// authenticated, so a writer can only lose bits, never keep them. Root is privileged (`CAP_FSETID`) and
    /// keeps them, so it never asks. Linux drops them before the write's bytes land (`file_remove_privs`): a
    /// set-ID program is never run half rewritten; the commit at close alone would leave that window open.
    ///
    /// Callers: the FUSE mount for a write the kernel flags `FUSE_WRITE_KILL_SUIDGID`, and the NFS gateway before
    /// every WRITE (knfsd's VFS does the same). Cheap when there is nothing to drop: no round trip.
    pub async fn drop_set_id_before_write(&self, writer: &Client) -> Result<(), ClientError> {
        let user = writer.user();
        let mode = self.mode.load(Ordering::SeqCst);
        let in_group = user.gid == self.attr.gid || user.groups.contains(&self.attr.gid);
        if user.uid == 0 || weft_proto::mode_after_unprivileged_write(mode, in_group) == mode {
            return Ok(());
        }
        let after = writer.commit(self.attr.ino, 0, 0).await?.mode;
        // The MDS kept the bits (it maps this writer to root, or knows other groups): this handle does not ask
        // again for them; a commit at close, or a fresh open, applies the MDS's rule anyway.
        let hint = if after == mode { mode & !0o6000 } else { after };
        self.mode.store(hint, Ordering::SeqCst);
        Ok(())
    }

    /// `Fsync` of every object this handle changed since their last sync, every server at once. A plain file:
    /// any failure fails ([`ClientError::Unsynced`]) and those objects stay to be synced. A redundant file: up to
    /// as many failed servers as the layout tolerates have the rows written recorded stale (`MarkStale`), as a
    /// degraded write's are, and the healer rebuilds them; more fail. A server whose write verifier moved since
    /// the writes (a reboot: docs/format.md §33) counts as failed, and a plain file's sync reports it once
    /// ([`ClientError::WritesLost`]).
    async fn sync_objects(&self) -> Result<(), ClientError> {
        // The verifiers first: a write after this sees its slot taken below and keeps a record of its own.
        let kept = self.kept.take();
        let slots = self.unsynced.take();
        if slots.is_empty() {
            self.kept.restore(kept);
            return Ok(());
        }
        let rows = self.unsynced_rows.lock().unwrap_or_else(|p| p.into_inner()).take();
        let layout = self.layout();
        let synced = match self.client.fsync_slots(self.attr.ino, &layout, &self.caps, &slots).await {
            Ok(s) => s,
            Err(e) => {
                self.keep_unsynced(&slots, rows, kept);
                return Err(e);
            }
        };
        let moved = crate::verifier::lost(&kept, |s| self.client.verifiers().get(s), &synced.answers);
        let mut failed = synced.failed;
        for m in &moved {
            tracing::warn!(
                ino = self.attr.ino,
                server = m.server,
                kept = m.kept,
                now = m.now,
                "a data server's write verifier moved under unsynced writes: they may be lost there"
            );
            failed.push((m.slot, self.writes_lost(m)));
        }
        if failed.is_empty() {
            return Ok(());
        }
        failed.sort_by_key(|(slot, _)| *slot);
        let tolerated = layout.redundancy.tolerates() as usize;
        let in_layout = failed.iter().all(|(slot, _)| *slot < layout.servers.len());
        if let Some((first, end)) = rows
            && failed.len() <= tolerated
            && in_layout
        {
            let offset = first.saturating_mul(u64::from(layout.stripe_unit));
            if let Err(e) = crate::stale::record_missed(self, failed, offset, first, end).await {
                self.keep_unsynced(&slots, rows, kept);
                return Err(e);
            }
            return Ok(());
        }
        self.keep_unsynced(&slots, rows, kept);
        // A loss is reported once, as a page cache's writeback error is: the next sync judges by the new verifier.
        moved.iter().for_each(|m| self.kept.reported(m.server, m.now));
        let (slot, e) = failed.into_iter().next().expect("one failure at least");
        Err(self.unsynced_error(&layout, slot, e))
    }

    /// What a sync that failed at position `slot` with `e` reports: the file, the server and why.
    fn unsynced_error(&self, layout: &weft_proto::Layout, slot: usize, e: ClientError) -> ClientError {
        match e {
            ClientError::Data { server, source } => ClientError::Unsynced {
                ino: self.attr.ino,
                server,
                addr: self.client.server_addr(server).unwrap_or_else(|| "address unknown".into()),
                source,
            },
            e @ ClientError::WritesLost { .. } => e,
            other if slot < layout.servers.len() => {
                let server = layout.servers[slot];
                ClientError::Protocol(format!(
                    "file inode {}: its writes could not be made durable on data server {server}: {other}; the size \
                     was not committed",
                    self.attr.ino
                ))
            }
            other => other,
        }
    }

    /// The error of a server whose verifier moved under this handle's unsynced writes.
    fn writes_lost(&self, m: &crate::verifier::Moved) -> ClientError {
        ClientError::WritesLost {
            ino: self.attr.ino,
            server: m.server,
            addr: self.client.server_addr(m.server).unwrap_or_else(|| "address unknown".into()),
            kept: m.kept,
            now: m.now,
        }
    }

    /// Puts back what a failed [`File::sync_objects`] took, for the next close or fsync to try again.
    fn keep_unsynced(&self, slots: &[u32], rows: Option<(u64, u64)>, kept: HashMap<u32, crate::verifier::Before>) {
        slots.iter().for_each(|&s| self.unsynced.add(s));
        self.kept.restore(kept);
        if let Some((first, end)) = rows {
            let mut held = self.unsynced_rows.lock().unwrap_or_else(|p| p.into_inner());
            *held = Some(held.map_or((first, end), |(a, b)| (a.min(first), b.max(end))));
        }
    }

    /// [`File::flush`] without taking a failure kept from earlier sends (this one's is kept too): for a path
    /// that makes another user's writes visible and must leave their errors to that user's fsync or close.
    pub async fn send_held(&self) -> Result<(), ClientError> {
        crate::redundancy::send_held(self).await
    }

    /// Sends the writes this handle holds (an ec file's partial stripe rows, `ec_gather.rs`) to the data servers,
    /// where other clients' reads see them, without making them durable (no `Fsync`) or committing the size: what
    /// a plain file's `write_at` does by itself. A failure to send held writes since the last commit is returned
    /// (once). fsync and close do this first.
    pub async fn flush(&self) -> Result<(), ClientError> {
        let drained = self.send_held().await;
        let behind = self.take_write_behind_failure();
        drained?;
        behind.map_or(Ok(()), Err)
    }

    /// fsync: the same as [`File::commit`], which makes this handle's writes durable before committing them.
    pub async fn sync(&self) -> Result<(), ClientError> {
        self.commit_wcc().await.map(|_| ())
    }

    /// [`File::sync`], returning what [`File::commit_wcc`] returns.
    pub async fn sync_wcc(&self) -> Result<Option<weft_proto::msg::CommitWccResp>, ClientError> {
        self.commit_wcc().await
    }

    /// The commit at close (close-to-open, as the Linux NFS client's flush and COMMIT at close): first every object
    /// this handle wrote since its last sync is made durable on its data server (`Fsync`, all servers at once),
    /// then, if it wrote since the last commit, size and mtime are committed to the metadata service (pNFS
    /// LAYOUTCOMMIT). A failed sync fails the commit and the size stays as it was; a handle that only read sends
    /// nothing.
    pub async fn commit(&self) -> Result<(), ClientError> {
        self.commit_wcc().await.map(|_| ())
    }

    /// [`File::commit`] that returns, when it committed, the file's mtime and size just before and its
    /// attributes after (a cache keyed by (mtime, size) stays valid across the commit iff the "before" matches).
    pub async fn commit_wcc(&self) -> Result<Option<weft_proto::msg::CommitWccResp>, ClientError> {
        // Held until the MDS answered: no truncate slips between the size read below and its commit, and a
        // concurrent fsync waits for this commit's `Fsync` instead of finding the objects already taken.
        let _gate = self.size_gate.lock().await;
        // Held writes (ec) are sent first; a failure to send them, now or since the last commit, fails this one.
        self.flush().await?;
        // Order matters against concurrent writes: a write marks its objects before it sends and raises the size
        // after, so every byte below the size read here is in an object the sync below covers.
        let dirty = self.dirty.swap(false, Ordering::SeqCst);
        let size = self.size();
        if let Err(e) = self.sync_objects().await {
            if dirty {
                self.dirty.store(true, Ordering::SeqCst);
            }
            return Err(e);
        }
        if !dirty {
            return Ok(None);
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as i64)
            .unwrap_or(0);
        match self.client.commit_wcc(self.attr.ino, size, now).await {
            Ok(w) => Ok(Some(w)),
            Err(e) => {
                self.dirty.store(true, Ordering::SeqCst);
                Err(e)
            }
        }
    }

    /// Makes this handle's writes durable, commits them (see [`File::commit`]) and closes.
    pub async fn close(self) -> Result<(), ClientError> {
        self.commit().await
    }
}
