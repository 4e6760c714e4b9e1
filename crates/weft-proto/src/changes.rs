//! What a metadata request changes, known from the request alone (docs/format.md §31). The MDS recalls it from
//! other sessions' leases and publishes it to the cache bank; a client with its own lease cache drops it there (the
//! MDS recalls nothing from the session that made a change). One classification, so the two cannot drift apart.

use crate::msg::Request;
use crate::{Rights, msg};

/// What a request changes of the namespace's attributes and entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetaChange<'a> {
    /// Nothing cached anywhere moves: a read, a lock, a lease poll, an open for reading.
    Nothing,
    Some(Changes<'a>),
    /// Not a namespace op: the MDS's duties, a data server's or a session's op. A cache drops everything.
    Unknown,
}

/// The parts of a change, as its request names them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes<'a> {
    /// Inodes whose attributes (mode and owner included) change.
    pub inos: Vec<u64>,
    /// Names that may exist after it. Their directory's times, size and link count move.
    pub added: Vec<(u64, &'a str)>,
    /// Names that may be gone or name another inode after it: the inode each named changes too (which only a
    /// reader of the namespace knows), and their directory's times, size and link count move.
    pub removed: Vec<(u64, &'a str)>,
}

impl Changes<'_> {
    /// Directories whose names change, each once.
    pub fn dirs(&self) -> Vec<u64> {
        let mut dirs: Vec<u64> = Vec::with_capacity(2);
        for &(dir, _) in self.added.iter().chain(&self.removed) {
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
        dirs
    }

    /// The change adds names and removes none (a create, mkdir, symlink, mknod or link).
    pub fn adds_only(&self) -> bool {
        self.removed.is_empty() && !self.added.is_empty()
    }
}

impl Request {
    /// What this request changes, from its fields alone.
    pub fn meta_change(&self) -> MetaChange<'_> {
        let writes = |r: Rights| r.covers(Rights::WRITE);
        match self {
            Request::Open(r) | Request::NfsOpen(r) if !writes(r.rights) => MetaChange::Nothing,
            Request::RenewOpen(r) if !writes(r.rights) => MetaChange::Nothing,
            Request::PnfsHandle(r) if !writes(r.rights) => MetaChange::Nothing,
            // An open for writing advances the data version (a pNFS handle for writing is one).
            Request::Open(r) | Request::NfsOpen(r) => inos(r.ino),
            Request::RenewOpen(r) => inos(r.ino),
            Request::PnfsHandle(r) => inos(r.ino),
            Request::SetAttr(r) | Request::NfsSetAttr(r) => inos(r.ino),
            Request::SetSizeOpen(r) => inos(r.ino),
            Request::Commit(r) | Request::CommitWcc(r) => inos(r.ino),
            Request::SetLayout(r) => inos(r.ino),
            // An ACL changes the mode; any attribute change stamps the ctime.
            Request::SetXattr(r) => inos(r.ino),
            Request::RemoveXattr(r) => inos(r.ino),
            Request::Create(r) | Request::CreateOpen(r) | Request::CreateOpenDir(r) => added(r.parent, &r.name),
            Request::Mknod(r) => added(r.parent, &r.name),
            Request::Mkdir(r) => added(r.parent, &r.name),
            Request::Symlink(r) => added(r.parent, &r.name),
            Request::Link(r) => MetaChange::Some(Changes {
                inos: vec![r.ino],
                added: vec![(r.new_parent, &r.new_name)],
                removed: Vec::new(),
            }),
            Request::Rmdir(r) | Request::Unlink(r) => {
                MetaChange::Some(Changes { removed: vec![(r.parent, &r.name)], ..Changes::default() })
            }
            Request::Rename(r) => rename(r),
            r if reads_only(r) => MetaChange::Nothing,
            _ => MetaChange::Unknown,
        }
    }
}

fn inos(ino: u64) -> MetaChange<'static> {
    MetaChange::Some(Changes { inos: vec![ino], ..Changes::default() })
}

fn added(parent: u64, name: &str) -> MetaChange<'_> {
    MetaChange::Some(Changes { added: vec![(parent, name)], ..Changes::default() })
}

/// A rename may replace the destination's name and always removes the source's.
fn rename(r: &msg::RenameReq) -> MetaChange<'_> {
    MetaChange::Some(Changes {
        inos: Vec::new(),
        added: vec![(r.dst_parent, &r.dst_name)],
        removed: vec![(r.src_parent, &r.src_name), (r.dst_parent, &r.dst_name)],
    })
}

/// Reads, locks and polls: they change no attribute or entry.
fn reads_only(r: &Request) -> bool {
    matches!(
        r,
        Request::Null(_)
            | Request::Lookup(_)
            | Request::GetAttr(_)
            | Request::Readlink(_)
            | Request::Readdir(_)
            | Request::ReaddirPlus(_)
            | Request::Statfs(_)
            | Request::ClusterInfo(_)
            | Request::GetXattr(_)
            | Request::ListXattr(_)
            | Request::SetLock(_)
            | Request::GetLock(_)
            | Request::ReleaseLocks(_)
            | Request::AdoptLocks(_)
            | Request::ListStale(_)
            | Request::MemberStatus(_)
            | Request::PnfsDevices(_)
            | Request::LeaseWait(_)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::{InoReq, NameReq, OpenReq, RenameReq};

    #[test]
    fn reads_change_nothing_and_unknown_ops_are_unknown() {
        assert_eq!(Request::GetAttr(InoReq { ino: 3 }).meta_change(), MetaChange::Nothing);
        assert_eq!(Request::Open(OpenReq { ino: 3, rights: Rights::READ }).meta_change(), MetaChange::Nothing);
        assert_eq!(
            Request::Open(OpenReq { ino: 3, rights: Rights::READ_WRITE }).meta_change(),
            MetaChange::Some(Changes { inos: vec![3], ..Changes::default() }),
            "an open for writing advances the data version"
        );
        assert_eq!(Request::HealNow(()).meta_change(), MetaChange::Unknown);
    }

    #[test]
    fn a_rename_removes_both_names_and_adds_the_destination() {
        let r = RenameReq { src_parent: 1, src_name: "a".into(), dst_parent: 2, dst_name: "b".into(), flags: 0 };
        let rename = Request::Rename(r);
        let MetaChange::Some(c) = rename.meta_change() else { panic!("a rename changes names") };
        assert_eq!(c.dirs(), vec![2, 1]);
        assert!(!c.adds_only());
        assert_eq!(c.removed, vec![(1, "a"), (2, "b")]);
        let unlink = Request::Unlink(NameReq { parent: 4, name: "x".into() });
        let MetaChange::Some(c) = unlink.meta_change() else { panic!("an unlink changes a name") };
        assert_eq!((c.dirs(), c.adds_only()), (vec![4], false));
    }
}
