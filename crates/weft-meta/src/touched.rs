//! What a change touches: the inodes whose attributes and the names whose entries an op may change, known before
//! it runs (a removed name's inode is gone from the store after). The cache bank's pusher publishes them again and
//! the lease table recalls them (docs/format.md §31).

use weft_proto::msg::{OpenResp, Recall};
use weft_proto::{MetaChange, Request, Response};

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
    /// The names and inodes `req` may change, known before it runs (weft-proto's [`MetaChange`], the classification
    /// clients drop their own changes by), plus what only the store knows: for a removal or rename the inode a
    /// name names now, for a link the old sole name (read without a permission check: it only says what to
    /// refresh, and is never sent anywhere).
    pub fn before(ns: &MdsNamespace, req: &Request) -> Touched {
        let mut t = Touched::default();
        let MetaChange::Some(c) = req.meta_change() else { return t };
        t.adds_only = c.adds_only();
        for &ino in &c.inos {
            t.ino(ino);
        }
        if let Request::Link(r) = req
            && let Ok(Some(i)) = ns.store().read(|x| x.get_inode(r.ino))
            && let Some((parent, name)) = &i.sole_name
        {
            // The old sole name's entry carried the attributes: it is published again without them.
            t.name(*parent, name);
        }
        for &(parent, name) in &c.removed {
            t.named(ns, parent, name);
        }
        for &(parent, name) in c.removed.iter().chain(&c.added) {
            t.name(parent, name);
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
        if !self.names.iter().any(|(p, n)| *p == parent && n == name) {
            self.names.push((parent, name.to_string()));
        }
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
        Response::CreateOpenDir(r) => Some(r.open.attr.ino),
        _ => None,
    }
}
