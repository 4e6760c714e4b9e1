//! The NFS gateway's restart state file decoder (`weft_nfs::restart`, docs/format.md §22) on arbitrary bytes.
//!
//! `decode` must never panic, and every byte of the file is checked, so what it accepts is exactly the encoding
//! of the session it returns.

#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_nfs::restart;

fuzz_target!(|data: &[u8]| {
    if let Ok(session) = restart::decode(data) {
        assert_eq!(&restart::encode(session)[..], data);
    }
});
