//! The POSIX ACL value decoder (`weft_meta::acl`, docs/format.md §13) on arbitrary bytes.
//!
//! `Acl::decode` must never panic; what it accepts re-encodes to a value that decodes to the same ACL, and the
//! mode rules (equivalent mode, chmod, create masking, the permission walk) never panic on an accepted ACL and
//! keep every permission within rwx.

#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_meta::acl::Acl;

fuzz_target!(|data: &[u8]| {
    let Ok(Some(acl)) = Acl::decode(data) else { return };
    let bytes = acl.encode();
    assert_eq!(Acl::decode(&bytes), Ok(Some(acl.clone())));
    let mode = data.first().map_or(0o644, |&b| u32::from(b) * 0o21 & 0o7777);
    let (bits, _) = acl.equiv_mode();
    assert_eq!(bits & !0o777, 0);
    let mut chmodded = acl.clone();
    chmodded.chmod(mode);
    assert_eq!(chmodded.equiv_mode().0, mode & 0o777, "a chmod sets exactly the mode's bits");
    let mut masked = acl.clone();
    let (new_mode, _) = masked.create_masq(mode);
    assert_eq!(new_mode & !0o777, mode & !0o777, "special bits kept");
    assert_eq!(new_mode & 0o777 & !(mode & 0o777), 0, "the ACL only narrows the mode");
    assert!(masked.entries().iter().all(|e| e.perm <= 7));
    for uid in [0, 1, 1000, u32::MAX - 1] {
        let _ = acl.permits(uid, &|g| g == uid, (1000, 1000), 7);
    }
});
