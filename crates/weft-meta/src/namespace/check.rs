//! The namespace's whole-tree invariants, checked by a full scan (an fsck of the records): what the op rules in
//! `namespace.rs` keep true one transaction at a time, verified all at once. The exerciser runs it after every step
//! and the simulations at their end; it is O(inodes + entries), so it never runs on a service's request path.
//!
//! Checked: the root is a directory that is its own parent; every entry names an inode of the entry's kind; every
//! directory has exactly one name, its `parent` is the directory holding it, and its link count is 2 plus its
//! subdirectories; every other inode's link count is its number of names; a recorded sole name is a name of the
//! inode; every inode is reachable from the root (which, with one name per directory, makes the directories a tree).

use std::collections::BTreeMap;

use weft_proto::{FileKind, ROOT_INO};

use crate::error::MetaError;
use crate::store::{Inode, MetaTxn};

/// Entries or inodes read per store call.
const PAGE: usize = 1024;

/// A broken invariant of the namespace's records.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TreeFault {
    #[error("the root inode {ROOT_INO} is missing, not a directory, or not its own parent")]
    Root,
    #[error("entry {name:?} of directory {parent} names inode {ino}, which does not exist")]
    Dangling { parent: u64, name: String, ino: u64 },
    #[error("entry {name:?} of directory {parent} says inode {ino} is a {entry:?}; the inode is a {inode:?}")]
    Kind { parent: u64, name: String, ino: u64, entry: FileKind, inode: FileKind },
    #[error("directory {ino} has a second name {name:?} in directory {parent}")]
    DirTwice { ino: u64, parent: u64, name: String },
    #[error("directory {ino} is held by directory {holder}, but records {recorded} as its parent")]
    Parent { ino: u64, holder: u64, recorded: u64 },
    #[error("inode {ino} records {recorded} links; the tree gives it {counted}")]
    Links { ino: u64, recorded: u32, counted: u64 },
    #[error("inode {ino} records {name:?} in directory {parent} as its sole name, which does not name it")]
    SoleName { ino: u64, parent: u64, name: String },
    #[error("inode {ino} is not reachable from the root")]
    Unreachable { ino: u64 },
}

/// What a check failed on: a broken invariant, or the store it read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckError {
    #[error("{0}")]
    Fault(#[from] TreeFault),
    #[error(transparent)]
    Store(#[from] MetaError),
}

/// What a check that passed counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeCount {
    pub inodes: u64,
    pub dirs: u64,
    pub entries: u64,
}

/// What the check keeps of one inode: its record's fields the rules speak of, and what the walk counted.
struct Node {
    kind: FileKind,
    nlink: u32,
    parent: u64,
    sole_name: Option<(u64, String)>,
    /// Entries naming it (a directory: entries naming a subdirectory of it are counted in `subdirs`).
    names: u64,
    subdirs: u64,
    reached: bool,
    /// The walk met the entry its sole name names.
    sole_name_seen: bool,
}

/// Checks every invariant above on the records `t` reads (one consistent snapshot: run it in a read transaction).
/// Memory: one small record per inode; store calls: one per page of inodes or entries.
pub fn check_tree(t: &mut dyn MetaTxn) -> Result<TreeCount, CheckError> {
    let mut nodes = all_inodes(t)?;
    let root = nodes.get_mut(&ROOT_INO).ok_or(TreeFault::Root)?;
    if root.kind != FileKind::Dir || root.parent != ROOT_INO {
        return Err(TreeFault::Root.into());
    }
    root.reached = true;
    let (mut todo, mut entries) = (vec![ROOT_INO], 0u64);
    while let Some(dir) = todo.pop() {
        let mut after = String::new();
        loop {
            let page = t.list_dirents(dir, &after, PAGE)?;
            for (name, ino, kind) in &page {
                entries += 1;
                if visit(&mut nodes, dir, name, *ino, *kind)? {
                    todo.push(*ino);
                }
            }
            match page.last() {
                Some((name, _, _)) if page.len() == PAGE => after = name.clone(),
                _ => break,
            }
        }
    }
    // An unreachable inode first: it explains the link counts it leaves wrong above it.
    if let Some((ino, _)) = nodes.iter().find(|(_, n)| !n.reached) {
        return Err(TreeFault::Unreachable { ino: *ino }.into());
    }
    for (ino, n) in &nodes {
        check_node(*ino, n)?;
    }
    let dirs = nodes.values().filter(|n| n.kind == FileKind::Dir).count() as u64;
    Ok(TreeCount { inodes: nodes.len() as u64, dirs, entries })
}

/// Every inode, by number (so a check reports the same fault every run).
fn all_inodes(t: &mut dyn MetaTxn) -> Result<BTreeMap<u64, Node>, MetaError> {
    let mut nodes = BTreeMap::new();
    let mut after = 0;
    loop {
        let page = t.list_inodes(after, PAGE)?;
        let full = page.len() == PAGE;
        for i in page {
            after = after.max(i.ino);
            let Inode { ino, kind, nlink, parent, sole_name, .. } = i;
            let node =
                Node { kind, nlink, parent, sole_name, names: 0, subdirs: 0, reached: false, sole_name_seen: false };
            nodes.insert(ino, node);
        }
        if !full {
            return Ok(nodes);
        }
    }
}

/// Entry `name` of directory `dir`, naming `ino` of `kind`: it names an inode of its kind, a directory's `parent`
/// is `dir` and it has no other name. Counts it; `true` for a directory to walk.
fn visit(nodes: &mut BTreeMap<u64, Node>, dir: u64, name: &str, ino: u64, kind: FileKind) -> Result<bool, TreeFault> {
    let Some(n) = nodes.get_mut(&ino) else {
        return Err(TreeFault::Dangling { parent: dir, name: name.to_string(), ino });
    };
    if n.kind != kind {
        return Err(TreeFault::Kind { parent: dir, name: name.to_string(), ino, entry: kind, inode: n.kind });
    }
    // 0: a record written before directories kept their parent (reach checks take it as the root).
    if kind == FileKind::Dir && n.parent != dir && n.parent != 0 {
        return Err(TreeFault::Parent { ino, holder: dir, recorded: n.parent });
    }
    if kind == FileKind::Dir && n.reached {
        return Err(TreeFault::DirTwice { ino, parent: dir, name: name.to_string() });
    }
    n.reached = true;
    n.names += 1;
    n.sole_name_seen |= n.sole_name.as_ref().is_some_and(|(p, s)| *p == dir && s == name);
    if kind == FileKind::Dir {
        nodes.get_mut(&dir).expect("a directory being walked is an inode").subdirs += 1;
    }
    Ok(kind == FileKind::Dir)
}

/// Inode `ino`'s link count is what the tree gives it, and its sole name (if recorded) is one of its names.
fn check_node(ino: u64, n: &Node) -> Result<(), TreeFault> {
    let counted = if n.kind == FileKind::Dir { 2 + n.subdirs } else { n.names };
    if u64::from(n.nlink) != counted {
        return Err(TreeFault::Links { ino, recorded: n.nlink, counted });
    }
    if let Some((parent, name)) = &n.sole_name
        && !n.sole_name_seen
    {
        return Err(TreeFault::SoleName { ino, parent: *parent, name: name.clone() });
    }
    Ok(())
}
