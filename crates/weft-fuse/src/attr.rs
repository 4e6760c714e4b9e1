//! Weft attributes as the kernel wants them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType, INodeNo};
use weft_proto::{Attr, FileKind};

/// Preferred I/O size reported in `st_blksize`: tools like cp and tar size their buffers by it.
const BLKSIZE_BYTES: u32 = 1 << 20;

pub(crate) fn file_type(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDev => FileType::CharDevice,
        FileKind::BlockDev => FileType::BlockDevice,
    }
}

fn time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

pub(crate) fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: time(a.atime_ns),
        mtime: time(a.mtime_ns),
        ctime: time(a.ctime_ns),
        crtime: time(a.ctime_ns),
        kind: file_type(a.kind),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: BLKSIZE_BYTES,
        flags: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_map_kind_mode_and_times() {
        let a = Attr {
            ino: 7,
            kind: FileKind::Symlink,
            mode: 0o104755,
            uid: 1,
            gid: 2,
            nlink: 1,
            size: 1000,
            atime_ns: -1_500_000_000,
            mtime_ns: 1_000_000_001,
            ctime_ns: 0,
            layout: None,
            rdev: 0,
            data_version: 0,
        };
        let f = file_attr(&a);
        assert_eq!((f.ino, f.kind, f.perm, f.blocks), (INodeNo(7), FileType::Symlink, 0o4755, 2));
        assert_eq!(f.mtime.duration_since(UNIX_EPOCH).unwrap(), Duration::new(1, 1));
        assert_eq!(UNIX_EPOCH.duration_since(f.atime).unwrap(), Duration::from_millis(1500));
    }
}
