//! The namespace's whole-tree invariants, checked by a full scan (an fsck of the records): what the op rules in
//! `namespace.rs` keep true one transaction at a time, verified all at once. The exerciser runs it after every step
//! and the simulations at their end; it is O(inodes + entries), so it never runs on a service's request path.
//!
//! Checked: the root is a directory that is its own parent; every entry names an inode of the entry's kind; every
//! directory has exactly one name, its `parent` is the directory holding it, and its link count is 2 plus its
//! subdirectories; every other inode's link count is its number of names; a recorded sole name is a name of the
//! inode; every inode is reachable from the root (which, with one name per directory, makes the directories a tree).

use std::collections::{BTreeMap, HashMap, HashSet};

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

/// Checks every invariant above on the records `t` reads (one consistent snapshot: run it in a read transaction).
pub fn check_tree(t: &mut dyn MetaTxn) -> Result<TreeCount, CheckError> {
    let inodes = all_inodes(t)?;
    let root = inodes.get(&ROOT_INO).ok_or(TreeFault::Root)?;
    if root.kind != FileKind::Dir || root.parent != ROOT_INO {
        return Err(TreeFault::Root.into());
    }
    // Names per inode, counted by walking the directories down from the root.
    let mut names: HashMap<u64, u64> = HashMap::new();
    let mut subdirs: HashMap<u64, u64> = HashMap::new();
    let mut reached: HashSet<u64> = HashSet::from([ROOT_INO]);
    let (mut todo, mut entries) = (vec![ROOT_INO], 0u64);
    while let Some(dir) = todo.pop() {
        let mut after = String::new();
        loop {
            let page = t.list_dirents(dir, &after, PAGE)?;
            for (name, ino, kind) in &page {
                entries += 1;
                check_entry(&inodes, dir, name, *ino, *kind)?;
                *names.entry(*ino).or_default() += 1;
                if *kind == FileKind::Dir {
                    if !reached.insert(*ino) {
                        return Err(TreeFault::DirTwice { ino: *ino, parent: dir, name: name.clone() }.into());
                    }
                    *subdirs.entry(dir).or_default() += 1;
                    todo.push(*ino);
                } else {
                    reached.insert(*ino);
                }
            }
            match page.last() {
                Some((name, _, _)) if page.len() == PAGE => after = name.clone(),
                _ => break,
            }
        }
    }
    // An unreachable inode first: it explains the link counts it leaves wrong above it.
    if let Some(i) = inodes.keys().find(|i| !reached.contains(i)) {
        return Err(TreeFault::Unreachable { ino: *i }.into());
    }
    for i in inodes.values() {
        check_inode(t, i, &names, &subdirs)?;
    }
    let dirs = inodes.values().filter(|i| i.kind == FileKind::Dir).count() as u64;
    Ok(TreeCount { inodes: inodes.len() as u64, dirs, entries })
}

/// Every inode, by number (so a check reports the same fault every run).
fn all_inodes(t: &mut dyn MetaTxn) -> Result<BTreeMap<u64, Inode>, MetaError> {
    let mut inodes = BTreeMap::new();
    let mut after = 0;
    loop {
        let page = t.list_inodes(after, PAGE)?;
        let full = page.len() == PAGE;
        for i in page {
            after = after.max(i.ino);
            inodes.insert(i.ino, i);
        }
        if !full {
            return Ok(inodes);
        }
    }
}

/// Entry `name` of directory `dir` names an inode of its kind, and a directory's `parent` is `dir`.
fn check_entry(inodes: &BTreeMap<u64, Inode>, dir: u64, name: &str, ino: u64, kind: FileKind) -> Result<(), TreeFault> {
    let Some(i) = inodes.get(&ino) else {
        return Err(TreeFault::Dangling { parent: dir, name: name.to_string(), ino });
    };
    if i.kind != kind {
        return Err(TreeFault::Kind { parent: dir, name: name.to_string(), ino, entry: kind, inode: i.kind });
    }
    // 0: a record written before directories kept their parent (reach checks take it as the root).
    if kind == FileKind::Dir && i.parent != dir && i.parent != 0 {
        return Err(TreeFault::Parent { ino, holder: dir, recorded: i.parent });
    }
    Ok(())
}

/// Inode `i`'s link count is what the tree gives it, and its sole name (if recorded) names it.
fn check_inode(
    t: &mut dyn MetaTxn,
    i: &Inode,
    names: &HashMap<u64, u64>,
    subdirs: &HashMap<u64, u64>,
) -> Result<(), CheckError> {
    let counted = match i.kind {
        FileKind::Dir => 2 + subdirs.get(&i.ino).copied().unwrap_or(0),
        _ => names.get(&i.ino).copied().unwrap_or(0),
    };
    if u64::from(i.nlink) != counted {
        return Err(TreeFault::Links { ino: i.ino, recorded: i.nlink, counted }.into());
    }
    if let Some((parent, name)) = &i.sole_name
        && t.get_dirent(*parent, name)?.map(|(ino, _)| ino) != Some(i.ino)
    {
        return Err(TreeFault::SoleName { ino: i.ino, parent: *parent, name: name.clone() }.into());
    }
    Ok(())
}
