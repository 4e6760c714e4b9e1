//! What a change touches: the inodes whose attributes and the names whose entries an op may change, known before
//! it runs (a removed name's inode is gone from the store after). The cache bank's pusher publishes them again and
//! the lease table recalls them (docs/format.md §31).

use weft_proto::msg::{OpenResp, Recall};
use weft_proto::{Request, Response};

use crate::MdsNamespace;
use crate::store::MetaStore;

/// What an op changed: inodes whose attributes to re-publish, and names whose entries to re-publish.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Touched {
    pub inos: Vec<u64>,
    pub names: Vec<(u64, String)>,
    /// The op only adds names (a create, mkdir, symlink, mknod or link): no one can have cached them, as a missing
    /// name is never cached, so their entries need no recall.
    pub adds_only: bool,
}

impl Touched {
    /// The names and inodes `req` may change, known before it runs: for a removal or rename the inode a name
    /// names now (read without a permission check: it only says what to refresh, and is never sent anywhere).
    pub fn before(ns: &MdsNamespace, req: &Request) -> Touched {
        let mut t = Touched::default();
        match req {
            Request::SetAttr(r) | Request::NfsSetAttr(r) => t.ino(r.ino),
            Request::SetSizeOpen(r) => t.ino(r.ino),
            // An open for writing advances the data version.
            Request::Open(r) if r.rights.covers(weft_proto::Rights::WRITE) => t.ino(r.ino),
            Request::RenewOpen(r) if r.rights.covers(weft_proto::Rights::WRITE) => t.ino(r.ino),
            Request::NfsOpen(r) if r.rights.covers(weft_proto::Rights::WRITE) => t.ino(r.ino),
            Request::Commit(r) | Request::CommitWcc(r) => t.ino(r.ino),
            Request::SetLayout(r) => t.ino(r.ino),
            // An ACL changes the mode; any attribute change stamps the ctime.
            Request::SetXattr(r) => t.ino(r.ino),
            Request::RemoveXattr(r) => t.ino(r.ino),
            Request::Create(r) | Request::CreateOpen(r) => t.added(r.parent, &r.name),
            Request::Mkdir(r) => t.added(r.parent, &r.name),
            Request::Symlink(r) => t.added(r.parent, &r.name),
            Request::Mknod(r) => t.added(r.parent, &r.name),
            Request::Link(r) => {
                t.adds_only = true;
                t.ino(r.ino);
                // The old sole name's entry carried the attributes: it is published again without them.
                if let Ok(Some(i)) = ns.store().read(|x| x.get_inode(r.ino))
                    && let Some((parent, name)) = &i.sole_name
                {
                    t.name(*parent, name);
                }
                t.name(r.new_parent, &r.new_name);
            }
            Request::Unlink(r) | Request::Rmdir(r) => {
                t.named(ns, r.parent, &r.name);
                t.name(r.parent, &r.name);
            }
            Request::Rename(r) => {
                t.named(ns, r.src_parent, &r.src_name);
                t.named(ns, r.dst_parent, &r.dst_name);
                t.name(r.src_parent, &r.src_name);
                t.name(r.dst_parent, &r.dst_name);
            }
            _ => {}
        }
        t
    }

    /// Adds the inode `parent`/`name` names now, if any.
    fn named(&mut self, ns: &MdsNamespace, parent: u64, name: &str) {
        if let Ok(Some((ino, _))) = ns.store().read(|x| x.get_dirent(parent, name)) {
            self.ino(ino);
        }
    }

    pub(crate) fn ino(&mut self, ino: u64) {
        if !self.inos.contains(&ino) {
            self.inos.push(ino);
        }
    }

    fn name(&mut self, parent: u64, name: &str) {
        self.ino(parent);
        self.names.push((parent, name.to_string()));
    }

    /// A name the op only adds.
    fn added(&mut self, parent: u64, name: &str) {
        self.adds_only = true;
        self.name(parent, name);
    }

    /// The recalls of everything touched: each inode's attributes and each name's entry, except names an op only
    /// added. (A name's recall takes the directory's lock in a FUSE client's kernel, which that client's own change
    /// in the directory may hold while it waits for this one's recall in turn: recalling only removed or replaced
    /// names leaves concurrent creates in one directory free of that wait.)
    pub fn recalls(&self) -> Vec<Recall> {
        let attrs = self.inos.iter().map(|&ino| Recall { ino, name: None });
        let names = self.names.iter().filter(|_| !self.adds_only);
        attrs.chain(names.map(|(p, n)| Recall { ino: *p, name: Some(n.clone()) })).collect()
    }
}

/// The inode a reply says the op made or returned.
pub(crate) fn made(resp: &Response) -> Option<u64> {
    match resp {
        Response::Create(a) | Response::Mkdir(a) | Response::Symlink(a) | Response::Mknod(a) | Response::Link(a) => {
            Some(a.ino)
        }
        Response::CreateOpen(OpenResp { attr, .. }) => Some(attr.ino),
        _ => None,
    }
}
