//! Arbitrary bytes into the pNFS layout ops' decoders (LAYOUTGET, LAYOUTCOMMIT, LAYOUTRETURN, GETDEVICEINFO,
//! GETDEVICELIST, crate weft-nfs, module nfs4::layout) and, from the same bytes, a file layout and a device
//! address body encoded and read back.
//!
//! Any panic is a bug. Checked properties:
//! - the decoders never panic, and consume no more than they were given;
//! - for any stripe unit the encoder takes (a multiple of 64), server count 1..=256 and filehandles up to 128
//!   bytes, the file layout body decodes back to the same device, unit (sparse), index 0, offset 0 and handles;
//! - a device address body decodes back to indices 0..N and each server's address list (at most 8 each), each
//!   with its netid (`tcp` or `rdma`);
//! - op 140's address strings (`ip:port`, `rdma:ip:port`, weft-proto `parse_pnfs_addr`): the input as text never
//!   panics, and what parses prints back to a string that parses the same.

#![no_main]

use std::net::{Ipv4Addr, SocketAddr};

use libfuzzer_sys::fuzz_target;
use weft_nfs::nfs4::layout::{self, MULTIPATH_ADDRS_MAX};
use weft_nfs::xdr::Reader;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data)
        && let Some((rdma, addr)) = weft_proto::msg::parse_pnfs_addr(text)
    {
        let again = format!("{}{addr}", if rdma { weft_proto::msg::PNFS_RDMA_PREFIX } else { "" });
        assert_eq!(weft_proto::msg::parse_pnfs_addr(&again), Some((rdma, addr)));
    }
    type Decode = fn(&mut Reader<'_>) -> bool;
    let decoders: [Decode; 5] = [
        |r| layout::decode_layoutget(r).is_ok(),
        |r| layout::decode_layoutcommit(r).is_ok(),
        |r| layout::decode_layoutreturn(r).is_ok(),
        |r| layout::decode_getdeviceinfo(r).is_ok(),
        |r| layout::decode_getdevicelist(r).is_ok(),
    ];
    for d in decoders {
        let mut r = Reader::new(data);
        let _ = d(&mut r);
        assert!(r.position() <= data.len());
    }
    if data.len() < 20 {
        return;
    }
    let unit = u32::from_be_bytes(data[..4].try_into().unwrap()) & layout::NFL4_UFLG_STRIPE_UNIT_SIZE_MASK;
    let count = 1 + data[4] as usize % layout::STRIPE_INDICES_MAX;
    let device: [u8; 16] = data[4..20].try_into().unwrap();
    let rest = &data[20..];
    if unit != 0 {
        let fhs: Vec<Vec<u8>> = (0..count)
            .map(|i| rest.iter().copied().cycle().skip(i).take(rest.len().min(128).saturating_sub(i % 7)).collect())
            .collect();
        let body = layout::file_layout_body(&device, unit, &fhs);
        let mut r = Reader::new(&body);
        assert_eq!(r.fixed(16).unwrap(), &device[..]);
        assert_eq!(r.u32().unwrap(), unit, "the unit, sparse");
        assert_eq!((r.u32().unwrap(), r.u64().unwrap()), (0, 0));
        assert_eq!(r.u32().unwrap() as usize, count);
        for fh in &fhs {
            assert_eq!(r.opaque(128).unwrap(), &fh[..]);
        }
        assert_eq!(r.remaining(), 0);
    }
    let servers: Vec<Vec<(SocketAddr, bool)>> = (0..count)
        .map(|i| {
            let b = rest.get(i).copied().unwrap_or(0);
            let n = b as usize % 12;
            (0..n)
                .map(|k| {
                    (SocketAddr::from((Ipv4Addr::from((i * 16 + k) as u32), (i + k) as u16)), b >> (k % 8) & 1 == 1)
                })
                .collect()
        })
        .collect();
    let body = layout::ds_addr_body_on(&servers);
    let mut r = Reader::new(&body);
    assert_eq!(r.u32().unwrap() as usize, count);
    for i in 0..count as u32 {
        assert_eq!(r.u32().unwrap(), i);
    }
    assert_eq!(r.u32().unwrap() as usize, count);
    for addrs in &servers {
        let n = r.u32().unwrap() as usize;
        assert_eq!(n, addrs.len().min(MULTIPATH_ADDRS_MAX));
        for (a, rdma) in &addrs[..n] {
            let (netid, uaddr) = layout::netaddr_on(a, *rdma);
            assert_eq!(netid.starts_with("rdma"), *rdma);
            assert_eq!(r.opaque(16).unwrap(), netid.as_bytes());
            assert_eq!(r.opaque(64).unwrap(), uaddr.as_bytes());
        }
    }
    assert_eq!(r.remaining(), 0);
});
