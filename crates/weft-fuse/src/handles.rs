//! Open file and directory handles of one mount, bounded by [`HANDLES_MAX`].
//!
//! All handles of one inode share one [`File`], so writes through one handle are seen (size included) through
//! the others, as POSIX wants within one machine. A directory handle keeps the listing it has shown so far, so
//! the offsets it gave the kernel stay valid while the directory changes.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};

use fuser::{Errno, FileType};
use weft_client::{Client, ClientError, File};
use weft_proto::{Attr, Rights};

/// Most handles (files and directories) open at once in one mount; more get ENFILE.
pub const HANDLES_MAX: usize = 65_536;
/// Entries fetched from the metadata service per readdir page (within both readdir's and readdirplus's caps).
const DIR_PAGE_ENTRIES: u32 = 1024;

#[derive(Default)]
pub(crate) struct Handles {
    state: Mutex<State>,
}

/// Where a file unlinked while open was renamed aside: (parent directory, hidden name).
pub(crate) type Hidden = (u64, String);

#[derive(Default)]
struct State {
    next_fh: u64,
    files: HashMap<u64, Arc<File>>,
    /// The file handles opened for writing: an ftruncate through one has the open's right (`File::truncate_by`),
    /// whatever rights the shared file gained from other opens.
    writable: HashSet<u64>,
    /// The shared file of each open inode, and how many handles hold it.
    by_ino: HashMap<u64, (Weak<File>, usize)>,
    dirs: HashMap<u64, Arc<DirHandle>>,
    /// Files unlinked while open here, renamed aside until their last handle closes.
    hidden: HashMap<u64, Hidden>,
}

impl State {
    fn new_fh(&mut self) -> Result<u64, Errno> {
        if self.files.len() + self.dirs.len() >= HANDLES_MAX {
            return Err(Errno::ENFILE);
        }
        self.next_fh += 1;
        Ok(self.next_fh)
    }
}

impl Handles {
    /// A new handle on `opened`, just opened at the metadata service (fresh attributes and a capability). A file
    /// already open in this mount is shared: it learns the fresh size and, if wider, the new capability's rights.
    pub(crate) fn open(&self, opened: File) -> Result<u64, Errno> {
        let mut s = self.state.lock().expect("handles");
        let fh = s.new_fh()?;
        let ino = opened.ino();
        if opened.rights().covers(Rights::WRITE) {
            s.writable.insert(fh);
        }
        let shared = s.by_ino.get(&ino).and_then(|(w, _)| w.upgrade());
        let file = match shared {
            Some(f) => {
                // Another client may have grown the file since this mount opened it.
                f.observe_open(opened.attr());
                f.adopt_capability(&opened);
                f
            }
            None => Arc::new(opened),
        };
        let entry = s.by_ino.entry(ino).or_insert_with(|| (Arc::downgrade(&file), 0));
        entry.0 = Arc::downgrade(&file);
        entry.1 += 1;
        s.files.insert(fh, file);
        Ok(fh)
    }

    pub(crate) fn file(&self, fh: u64) -> Option<Arc<File>> {
        self.state.lock().expect("handles").files.get(&fh).cloned()
    }

    /// The file of handle `fh` if that handle was opened for writing.
    pub(crate) fn writable_file(&self, fh: u64) -> Option<Arc<File>> {
        let s = self.state.lock().expect("handles");
        s.writable.contains(&fh).then(|| s.files.get(&fh).cloned()).flatten()
    }

    /// The file shared by this mount's open handles of `ino`, if any.
    pub(crate) fn open_file(&self, ino: u64) -> Option<Arc<File>> {
        self.state.lock().expect("handles").by_ino.get(&ino).and_then(|(w, _)| w.upgrade())
    }

    /// Forgets a file handle; returns its file for a last commit and, if this was the last handle of a file
    /// unlinked while open, the hidden name to remove now.
    pub(crate) fn close(&self, fh: u64) -> Option<(Arc<File>, Option<Hidden>)> {
        let mut s = self.state.lock().expect("handles");
        let f = s.files.remove(&fh)?;
        s.writable.remove(&fh);
        let ino = f.ino();
        let mut hidden = None;
        if let Some(e) = s.by_ino.get_mut(&ino) {
            e.1 -= 1;
            if e.1 == 0 {
                s.by_ino.remove(&ino);
                hidden = s.hidden.remove(&ino);
            }
        }
        Some((f, hidden))
    }

    /// True if any file is open in this mount (unlink only then looks for open files to rename aside).
    pub(crate) fn any_file_open(&self) -> bool {
        !self.state.lock().expect("handles").by_ino.is_empty()
    }

    /// Records that open file `ino` now lives under `name` in `parent`, to be removed at its last close. False if
    /// its last handle closed meanwhile: the caller removes it at once.
    pub(crate) fn hide(&self, ino: u64, parent: u64, name: String) -> bool {
        let mut s = self.state.lock().expect("handles");
        if !s.by_ino.contains_key(&ino) {
            return false;
        }
        s.hidden.insert(ino, (parent, name));
        true
    }

    pub(crate) fn open_dir(&self, d: DirHandle) -> Result<u64, Errno> {
        let mut s = self.state.lock().expect("handles");
        let fh = s.new_fh()?;
        s.dirs.insert(fh, Arc::new(d));
        Ok(fh)
    }

    pub(crate) fn dir(&self, fh: u64) -> Option<Arc<DirHandle>> {
        self.state.lock().expect("handles").dirs.get(&fh).cloned()
    }

    pub(crate) fn close_dir(&self, fh: u64) {
        self.state.lock().expect("handles").dirs.remove(&fh);
    }
}

/// One entry of a directory listing; `attr` is there when the page came from readdirplus.
#[derive(Clone)]
pub(crate) struct DirItem {
    pub(crate) ino: u64,
    pub(crate) kind: FileType,
    pub(crate) name: String,
    pub(crate) attr: Option<Attr>,
    /// The lease ticket the page it came in was asked under (readdirplus pages only).
    pub(crate) asked: Option<crate::leases::Ticket>,
}

/// An open directory: the entries listed so far ("." and ".." first), fetched page by page on demand.
///
/// Offsets (`d_off`) come in two kinds. By position (the default): an entry's place in this handle's listing,
/// which only ever grows, so stable for this handle under concurrent changes. By name (`hashed`, for a directory
/// the kernel caches, `FOPEN_CACHE_DIR`): the kernel keeps one listing per directory across opens and resumes any
/// open at an offset another open produced, so an entry's offset must be its own, as ext4's hash cookies are:
/// the handle lists the whole directory, orders it by [`name_cookie`], and resumes after any cookie, whether or not
/// its entry still exists. Entries present all along are then listed once each, in every open.
pub(crate) struct DirHandle {
    ino: u64,
    /// Fetch pages with their attributes (the kernel negotiated readdirplus).
    plus: bool,
    hashed: bool,
    state: tokio::sync::Mutex<DirState>,
}

struct DirState {
    entries: Vec<DirItem>,
    after: String,
    eof: bool,
    /// Hashed: the offset of each entry (ascending); empty until the listing is taken.
    cookies: Vec<u64>,
    /// Hashed: the names of the last whole listing and the lease ticket taken before it, until the caller takes
    /// them ([`DirHandle::take_listed`]).
    listed: Option<(crate::leases::Ticket, Vec<String>)>,
}

/// The offset of the entry `name` in a hashed listing: [`weft_client::name_hash`] in 3..2⁶³ (1 and 2 are "." and
/// "..", and the kernel's offsets are signed). Two names of one directory share one with odds of about n²/2⁶⁴.
pub(crate) fn name_cookie(name: &str) -> u64 {
    (weft_client::name_hash(name) >> 1).max(3)
}

impl DirHandle {
    /// A handle on the directory `dir` (attributes fresh from the metadata service).
    pub(crate) fn new(dir: Attr, plus: bool) -> DirHandle {
        let ino = dir.ino;
        // ".." carries inode 0 until it is first listed, when `entries_from` asks the metadata service for the
        // parent (a lookup of ".."): an entry with inode 0 is skipped by readdir(3), so `ls -a` would not show it.
        let entries = vec![
            DirItem { ino, kind: FileType::Directory, name: ".".into(), attr: Some(dir.clone()), asked: None },
            DirItem {
                ino: 0,
                kind: FileType::Directory,
                name: "..".into(),
                attr: Some(Attr { ino: 0, ..dir }),
                asked: None,
            },
        ];
        let state = DirState { entries, after: String::new(), eof: false, cookies: Vec::new(), listed: None };
        DirHandle { ino, plus, hashed: false, state: tokio::sync::Mutex::new(state) }
    }

    /// [`DirHandle::new`] with offsets by name, for a directory the kernel caches.
    pub(crate) fn hashed(dir: Attr, plus: bool) -> DirHandle {
        DirHandle { hashed: true, ..DirHandle::new(dir, plus) }
    }

    /// The directory's inode.
    pub(crate) fn ino(&self) -> u64 {
        self.ino
    }

    /// Entries after offset `offset` (at most one page), each with its own offset; empty at the end of the
    /// directory. `asked`: the lease ticket taken before this call, kept with the entries it fetches.
    pub(crate) async fn entries_from(
        &self,
        client: &Client,
        offset: u64,
        asked: Option<crate::leases::Ticket>,
    ) -> Result<Vec<(u64, DirItem)>, ClientError> {
        let mut s = self.state.lock().await;
        if self.hashed {
            // The start (an open, or a rewind) takes the directory as it is now.
            if offset == 0 || s.cookies.is_empty() {
                self.list_whole(client, &mut s, asked).await?;
            }
            debug_assert_eq!(s.cookies.len(), s.entries.len(), "an offset per entry");
            let at = s.cookies.partition_point(|&c| c <= offset);
            let end = s.cookies.len().min(at + DIR_PAGE_ENTRIES as usize);
            return Ok((at..end).map(|i| (s.cookies[i], s.entries[i].clone())).collect());
        }
        let pos = usize::try_from(offset).unwrap_or(usize::MAX);
        self.fetch_to(client, &mut s, pos, asked).await?;
        let end = s.entries.len().min(pos.saturating_add(DIR_PAGE_ENTRIES as usize));
        Ok((pos..end).map(|i| (i as u64 + 1, s.entries[i].clone())).collect())
    }

    /// Hashed: the whole listing again, ordered by offset.
    async fn list_whole(
        &self,
        client: &Client,
        s: &mut DirState,
        asked: Option<crate::leases::Ticket>,
    ) -> Result<(), ClientError> {
        // Until the listing is whole again there are no offsets (a failed fetch leaves none half-made).
        s.cookies.clear();
        s.entries.truncate(2);
        s.after.clear();
        s.eof = false;
        // Position 0 first: that also finds "..".
        self.fetch_to(client, s, 0, asked).await?;
        self.fetch_to(client, s, usize::MAX, asked).await?;
        let mut named: Vec<(u64, DirItem)> = s.entries.drain(2..).map(|e| (name_cookie(&e.name), e)).collect();
        named.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.name.cmp(&b.1.name)));
        s.cookies = [1, 2].into_iter().chain(named.iter().map(|(c, _)| *c)).collect();
        s.listed = asked.map(|t| (t, named.iter().map(|(_, e)| e.name.clone()).collect()));
        s.entries.extend(named.into_iter().map(|(_, e)| e));
        Ok(())
    }

    /// The names of the whole listing an [`DirHandle::entries_from`] call just took (hashed handles, with a
    /// ticket), with that ticket: what the mount may know the directory by ([`crate::leases::LeaseView::listed`]).
    pub(crate) async fn take_listed(&self) -> Option<(crate::leases::Ticket, Vec<String>)> {
        self.state.lock().await.listed.take()
    }

    /// Fetches pages until the listing holds position `pos` or the directory ended.
    async fn fetch_to(
        &self,
        client: &Client,
        s: &mut DirState,
        pos: usize,
        asked: Option<crate::leases::Ticket>,
    ) -> Result<(), ClientError> {
        if pos <= 1 && s.entries[1].ino == 0 {
            // The root is its own parent. A metadata service from before ".." lookups (or a caller without search
            // permission) gets the directory itself: listed, if not quite right, rather than hidden.
            s.entries[1] = match client.lookup(self.ino, "..").await {
                Ok(a) => {
                    DirItem { ino: a.ino, kind: FileType::Directory, name: "..".into(), attr: Some(a), asked: None }
                }
                Err(e) => {
                    tracing::debug!(ino = self.ino, "looking up ..: {e}");
                    let dot = s.entries[0].clone();
                    DirItem { name: "..".into(), ..dot }
                }
            };
        }
        while s.entries.len() <= pos && !s.eof {
            let (items, eof): (Vec<DirItem>, bool) = if self.plus {
                let page = client.readdir_plus_page(self.ino, &s.after, DIR_PAGE_ENTRIES).await?;
                let items = page
                    .entries
                    .into_iter()
                    .map(|(name, a)| DirItem {
                        ino: a.ino,
                        kind: crate::attr::file_type(a.kind),
                        name,
                        attr: Some(a),
                        asked,
                    })
                    .collect();
                (items, page.eof)
            } else {
                let page = client.readdir_page(self.ino, &s.after, DIR_PAGE_ENTRIES).await?;
                let items = page
                    .entries
                    .into_iter()
                    .map(|e| DirItem {
                        ino: e.ino,
                        kind: crate::attr::file_type(e.kind),
                        name: e.name,
                        attr: None,
                        asked: None,
                    })
                    .collect();
                (items, page.eof)
            };
            if let Some(last) = items.last() {
                s.after = last.name.clone();
            }
            s.eof = eof || items.is_empty();
            s.entries.extend(items);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::name_cookie;

    #[test]
    fn name_cookies_leave_the_dots_theirs_and_fit_a_signed_offset() {
        for name in ["", "a", "b", "f00001", "f00002", "\u{e9}t\u{e9}", &"x".repeat(255)] {
            let c = name_cookie(name);
            assert!((3..1 << 63).contains(&c), "{name:?}: {c}");
        }
        assert_eq!(name_cookie("f00001"), name_cookie("f00001"));
        assert_ne!(name_cookie("f00001"), name_cookie("f00002"));
    }
}
