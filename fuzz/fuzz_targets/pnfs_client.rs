//! Arbitrary bytes into the pNFS client's decoders (crate weft-nfs, module nfs4::layout): a file layout body as
//! LAYOUTGET answers it (`decode_file_layout`), a device address body as GETDEVICEINFO answers it
//! (`decode_ds_addr`) and a universal address (`parse_netaddr`), as `weft bench nfs --pnfs`'s client reads them.
//!
//! Any panic is a bug. Checked properties:
//! - the decoders never panic on any input;
//! - a decoded file layout has 1..=256 handles of at most 128 bytes, a stripe unit that is not 0 and a first
//!   stripe index naming one of its handles;
//! - a decoded device has 1..=256 stripe indices, each with at most 8 addresses;
//! - an address that parses prints back (through `netaddr`) to an address that parses to the same.

#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_nfs::nfs4::layout;

fuzz_target!(|data: &[u8]| {
    if let Ok(l) = layout::decode_file_layout(data) {
        assert!(!l.fhs.is_empty() && l.fhs.len() <= layout::STRIPE_INDICES_MAX);
        assert!(l.fhs.iter().all(|f| f.len() <= layout::FH_BYTES_MAX));
        assert!(l.stripe_unit != 0 && (l.first_stripe_index as usize) < l.fhs.len());
    }
    if let Ok(d) = layout::decode_ds_addr(data) {
        assert!(!d.is_empty() && d.len() <= layout::STRIPE_INDICES_MAX);
        assert!(d.iter().all(|a| a.len() <= layout::MULTIPATH_ADDRS_MAX));
    }
    let lossy = String::from_utf8_lossy(data);
    let text: &str = &lossy;
    let (netid, uaddr) = text.split_once(' ').unwrap_or(("tcp", text));
    if let Some(a) = layout::parse_netaddr(netid, uaddr) {
        let (n, u) = layout::netaddr(&a);
        assert_eq!(layout::parse_netaddr(n, &u), Some(a));
    }
});
