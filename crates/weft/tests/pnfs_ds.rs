//! Every data server as a pNFS data server (docs/format.md §23), against a real cluster of four with
//! `ds_nfs` on: a handle from `Client::pnfs_handle` written and read at each data server directly, at the file
//! offsets of its stripes, then read back by Weft's own path (`weft cat`) after the size is committed; and the
//! refusals: a flipped handle byte, an expired handle, a read-only handle used to WRITE, a handle forged for
//! another inode, a Weft capability in a DS handle, a range crossing into another server's stripe; the server
//! keeps serving after each; a corrupt block is NFS4ERR_IO, logged with its file offset. The MDS side: no handle without read access, none for an ec file.

use crate::common;

use std::collections::HashMap;

use common::nfs41::V41;
use weft_nfs::ds::fh;
use weft_nfs::nfs4::consts::*;
use weft_proto::{DataRedundancy, ROOT_INO, Rights, UserCred};

const UNIT: u32 = 64 << 10;
const SERVERS: u32 = 4;
const STRIPES: u64 = 8;
const UNSTABLE4: u32 = 0;
const FILE_SYNC4: u32 = 2;

/// Seeded bytes (xorshift), so a failure reproduces.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// A READ that must still work after a refusal: the data server keeps serving.
async fn good_read(v: &mut V41, fh: &[u8], want: &[u8]) {
    let mut res = v
        .on_fh(fh, |o| {
            o.read(0, want.len() as u32);
        })
        .await;
    assert!(res.read().1 == want, "the data server keeps serving");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn data_servers_serve_a_striped_file_by_sealed_handles_and_refuse_the_rest() {
    let c = common::start_with("pnfs-ds", SERVERS, |o| o.ds_nfs = true).await;
    let client = c.client().await;
    let dir = client.mkdir(ROOT_INO, "p", 0o755).await.unwrap();
    client.set_layout(dir.ino, UNIT, SERVERS).await.unwrap();
    let f = client.create(dir.ino, "f", 0o600, true).await.unwrap();
    let layout = f.layout.clone().expect("a regular file has a layout");
    assert_eq!((layout.stripe_unit, layout.servers.len() as u32), (UNIT, SERVERS));

    // The MDS's side: devices, and a read+write handle sealed for key "pnfs".
    let devices: HashMap<u32, std::net::SocketAddr> =
        client.pnfs_devices().await.unwrap().into_iter().map(|d| (d.server, d.addrs[0])).collect();
    assert_eq!(devices.len(), SERVERS as usize, "every data server announced its NFS address");
    let cap = client.pnfs_handle(f.ino, true).await.unwrap();
    assert_eq!((cap.ino, cap.rights, cap.key_id.as_str()), (f.ino, Rights::READ_WRITE, "pnfs"));
    let bound = weft_rpc::capability::unix_now_ms() + weft_meta::service::DEFAULT_CAPABILITY_TTL_MS;
    assert!(cap.expiry_ms <= bound, "a pNFS handle lives no longer than a capability by default");
    let handle = |index: u32| fh::encode(&cap, UNIT, SERVERS, index, layout.generation);

    let mut ds = Vec::new();
    for index in 0..SERVERS {
        let mut v = V41::connect(devices[&layout.servers[index as usize]]).await;
        v.session(format!("pnfs-test-{index}").as_bytes()).await;
        assert_eq!(v.flags & 0x0004_0000, 0x0004_0000, "EXCHGID4_FLAG_USE_PNFS_DS");
        ds.push(v);
    }

    // Each stripe written at its own data server at its file offset: UNSTABLE and FILE_SYNC alternately.
    let data = pattern((STRIPES * u64::from(UNIT)) as usize, 15);
    let mut verifiers = vec![None; SERVERS as usize];
    for s in 0..STRIPES {
        let index = (s % u64::from(SERVERS)) as u32;
        let off = s * u64::from(UNIT);
        let bytes = &data[off as usize..(off + u64::from(UNIT)) as usize];
        let stable = if s % 2 == 0 { UNSTABLE4 } else { FILE_SYNC4 };
        let mut res = ds[index as usize]
            .on_fh(&handle(index), |o| {
                o.write(off, stable, bytes);
            })
            .await;
        let (count, committed, verf) = res.write();
        assert_eq!((count, committed), (UNIT, stable), "stripe {s}");
        verifiers[index as usize].get_or_insert(verf);
        assert_eq!(verifiers[index as usize], Some(verf), "one verifier per data server");
    }
    for index in 0..SERVERS {
        let mut res = ds[index as usize]
            .on_fh(&handle(index), |o| {
                o.commit(0, 0);
            })
            .await;
        assert_eq!(Some(res.commit()), verifiers[index as usize]);
    }
    // Read back from each data server, in pieces that stay inside one stripe unit.
    for s in 0..STRIPES {
        let index = (s % u64::from(SERVERS)) as u32;
        let off = s * u64::from(UNIT);
        for (piece_off, len) in [(0u64, 4096u32), (4096, UNIT - 4096)] {
            let mut res = ds[index as usize]
                .on_fh(&handle(index), |o| {
                    o.read(off + piece_off, len);
                })
                .await;
            let (eof, got) = res.read();
            assert!(!eof);
            assert!(got == data[(off + piece_off) as usize..][..len as usize], "stripe {s} at +{piece_off}");
        }
    }
    // GETATTR at a data server: its object's length (stripes 0 and 4 on index 0: two units).
    let mut res = ds[0]
        .on_fh(&handle(0), |o| {
            o.getattr(&[4, 20]);
        })
        .await;
    res.ok(OP_GETATTR);
    let attrs = res.with(|r| {
        let (b, l) = weft_nfs::nfs4::attrs::decode_raw(r).unwrap();
        weft_nfs::nfs4::attrs::decode_basic(&b, l).unwrap()
    });
    assert_eq!(attrs, vec![(4, 2 * u64::from(UNIT)), (20, f.ino)]);

    // Weft's own path reads what pNFS wrote, once the size is committed (what LAYOUTCOMMIT does).
    client.commit(f.ino, data.len() as u64, 1_700_000_000_000_000_000).await.unwrap();
    let cat = std::process::Command::new(common::WEFT)
        .args(["cat", "/p/f"])
        .env("WEFT_CLUSTER", c.cluster_file())
        .output()
        .unwrap();
    assert!(cat.status.success(), "{}", String::from_utf8_lossy(&cat.stderr));
    assert!(cat.stdout == data, "weft cat reads the bytes written at the data servers");

    // Refusals, each followed by a request that still works.
    let (h0, first) = (handle(0), data[..4096].to_vec());
    let refused = |res: &mut common::nfs41::Res, op: u32, want: u32, what: &str| {
        assert_eq!(res.op(op), want, "{what}");
        assert_eq!(res.status, want, "{what}");
    };
    // A flipped MAC byte: the handle decodes but its capability is forged.
    let mut forged = handle(0);
    *forged.last_mut().unwrap() ^= 1;
    let mut res = ds[0]
        .on_fh(&forged, |o| {
            o.read(0, 4096);
        })
        .await;
    refused(&mut res, OP_READ, NFS4ERR_ACCESS, "a flipped MAC byte");
    good_read(&mut ds[0], &h0, &first).await;
    // A flipped magic byte: not a data-server handle at all.
    let mut bad = handle(0);
    bad[0] ^= 0xff;
    let mut res = ds[0]
        .seq(|o| {
            o.putfh(&bad).read(0, 4096);
        })
        .await;
    res.seq();
    refused(&mut res, OP_PUTFH, NFS4ERR_BADHANDLE, "a flipped magic byte");
    good_read(&mut ds[0], &h0, &first).await;
    // Expired: sealed as the MDS seals them, an hour in the past (far beyond the allowed clock skew).
    let key = weft_rpc::Key::load(&c.key_file()).unwrap();
    let past = weft_rpc::capability::unix_now_ms() - 3_600_000;
    let expired = weft_rpc::CapabilityKey::derive(&key).seal(f.ino, Rights::READ, past, "pnfs", 0, 0).unwrap();
    let mut res = ds[0]
        .on_fh(&fh::encode(&expired, UNIT, SERVERS, 0, 0), |o| {
            o.read(0, 4096);
        })
        .await;
    refused(&mut res, OP_READ, NFS4ERR_STALE, "an expired handle (back to the MDS for a fresh layout)");
    good_read(&mut ds[0], &h0, &first).await;
    // A read-only handle reads but does not write.
    let ro = client.pnfs_handle(f.ino, false).await.unwrap();
    let ro_fh = fh::encode(&ro, UNIT, SERVERS, 0, layout.generation);
    let mut res = ds[0]
        .on_fh(&ro_fh, |o| {
            o.read(0, 4096);
        })
        .await;
    assert!(res.read().1 == data[..4096]);
    let mut res = ds[0]
        .on_fh(&ro_fh, |o| {
            o.write(0, FILE_SYNC4, b"nope");
        })
        .await;
    refused(&mut res, OP_WRITE, NFS4ERR_ACCESS, "a read-only handle used to WRITE");
    // A handle for another file, its inode changed to this one's: forged.
    let g = client.create(dir.ino, "g", 0o644, true).await.unwrap();
    let other = client.pnfs_handle(g.ino, true).await.unwrap();
    let moved = weft_proto::Capability { ino: f.ino, ..other.clone() };
    let mut res = ds[0]
        .on_fh(&fh::encode(&moved, UNIT, SERVERS, 0, 0), |o| {
            o.read(0, 4096);
        })
        .await;
    refused(&mut res, OP_READ, NFS4ERR_ACCESS, "a handle for another inode");
    // ... and the other file's own handle reaches only its own (empty) object.
    let mut res = ds[0]
        .on_fh(&fh::encode(&other, UNIT, SERVERS, 0, 0), |o| {
            o.read(0, 4096);
        })
        .await;
    assert_eq!(res.read().1, vec![0u8; 4096], "another file's handle reads that file, not this one");
    // A Weft capability (key "cluster", from `Open`) in a data-server handle: wrong key id.
    let weft_cap = client.open_capability(f.ino, Rights::READ).await.unwrap().cap;
    let mut res = ds[0]
        .on_fh(&fh::encode(&weft_cap, UNIT, SERVERS, 0, 0), |o| {
            o.read(0, 4096);
        })
        .await;
    refused(&mut res, OP_READ, NFS4ERR_ACCESS, "a Weft capability is not a pNFS handle");
    // Ranges: crossing the end of a stripe unit, or in another server's stripe.
    let mut res = ds[0]
        .on_fh(&handle(0), |o| {
            o.write(u64::from(UNIT) - 100, FILE_SYNC4, &[1; 200]);
        })
        .await;
    refused(&mut res, OP_WRITE, NFS4ERR_INVAL, "a WRITE crossing into the next stripe");
    let mut res = ds[0]
        .on_fh(&handle(0), |o| {
            o.read(u64::from(UNIT), 4096);
        })
        .await;
    refused(&mut res, OP_READ, NFS4ERR_INVAL, "a READ of another server's stripe");
    good_read(&mut ds[0], &h0, &first).await;
    // Nothing refused changed a byte.
    let cat = std::process::Command::new(common::WEFT)
        .args(["cat", "/p/f"])
        .env("WEFT_CLUSTER", c.cluster_file())
        .output()
        .unwrap();
    assert!(cat.stdout == data, "refused requests wrote nothing");

    // A block that fails its checksum: NFS4ERR_IO, logged with its file offset, and nothing of it is sent.
    let (index, object_offset) = (1u32, 8192u64);
    let server = layout.servers[index as usize];
    let object = c.dir().join(format!("data{server}/objects/{:02x}/{:016x}", f.ino & 0xff, f.ino));
    {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new().write(true).open(&object).unwrap();
        file.write_all_at(&[!data[(u64::from(UNIT) + object_offset) as usize]], object_offset).unwrap();
    }
    let file_offset = u64::from(UNIT) + object_offset;
    let mut res = ds[index as usize]
        .on_fh(&handle(index), |o| {
            o.read(file_offset, 4096);
        })
        .await;
    refused(&mut res, OP_READ, NFS4ERR_IO, "a corrupt block");
    assert!(
        c.log(&format!("data{server}")).contains(&format!("file_offset={file_offset}")),
        "logged with its file offset"
    );
    good_read(&mut ds[0], &h0, &first).await;

    // The MDS: no handle without read access, none for a file a file layout cannot express.
    let stranger = client.with_user(UserCred { uid: 4242, gid: 4242, groups: vec![] });
    let e = stranger.pnfs_handle(f.ino, false).await.unwrap_err();
    assert!(e.to_string().contains("ermission"), "{e}");
    let ec_dir = client.mkdir(ROOT_INO, "ec", 0o755).await.unwrap();
    client.set_layout_with(ec_dir.ino, UNIT, 0, DataRedundancy::Ec { k: 2, m: 1 }).await.unwrap();
    let e_file = client.create(ec_dir.ino, "e", 0o644, true).await.unwrap();
    let e = client.pnfs_handle(e_file.ino, false).await.unwrap_err();
    assert!(e.to_string().contains("plain striping"), "{e}");

    // Each data server logs what its connection moved when it closes (what the VM test greps).
    drop(ds);
    for index in 0..SERVERS {
        let role = format!("data{}", layout.servers[index as usize]);
        let want = format!("WRITE {} bytes for ino {}", 2 * u64::from(UNIT), f.ino);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let log = c.log(&role);
            if log.contains("pnfs ds: served READ") && log.contains(&want) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{role} did not log its bytes: {log}");
            // Polling for a log line written when the server notices the close; not a timing assumption.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

/// A pNFS handle is no stronger than a capability (issue 31 item 5): after a chmod takes the owner's rights away,
/// the MDS seals no new handle (the gateway's LAYOUTGET fails), and a client that ignores the recall and keeps
/// the handle it had is refused once its lifetime (`pnfs_handle_ttl_ms`, here 2 s) has passed: STALE, which
/// sends a Linux client back to the gateway. The wait is for the handle's own sealed expiry, not a guess.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_recalled_handle_is_refused_once_its_lifetime_has_passed() {
    const TTL_MS: u64 = 2_000;
    let c = common::start_with("pnfs-ttl", 1, |o| {
        o.ds_nfs = true;
        o.meta_extra_toml = format!("pnfs_handle_ttl_ms = {TTL_MS}\n");
        o.data_extra_toml = "capability_clock_skew_ms = 0\n".into();
    })
    .await;
    let root = c.client().await;
    let alice = root.with_user(UserCred::new(1000, 100, vec![]).unwrap());
    let dir = root.mkdir(ROOT_INO, "p", 0o777).await.unwrap();
    let f = alice.create(dir.ino, "f", 0o600, true).await.unwrap();
    let layout = f.layout.clone().unwrap();
    let addr = root.pnfs_devices().await.unwrap()[0].addrs[0];
    let issued = weft_rpc::capability::unix_now_ms();
    let cap = alice.pnfs_handle(f.ino, true).await.unwrap();
    assert!(cap.expiry_ms <= weft_rpc::capability::unix_now_ms() + TTL_MS && cap.expiry_ms >= issued + TTL_MS);
    let handle = fh::encode(&cap, layout.stripe_unit, 1, 0, layout.generation);
    let mut v = V41::connect(addr).await;
    v.session(b"pnfs-ttl").await;
    let mut res = v
        .on_fh(&handle, |o| {
            o.write(0, FILE_SYNC4, b"before the chmod");
        })
        .await;
    assert_eq!(res.write().0, 16);

    // Rights taken away: no new handle (what the gateway's LAYOUTGET after a recall would meet).
    let none = weft_proto::SetAttrs { mode: Some(0), ..weft_proto::SetAttrs::default() };
    alice.setattr(f.ino, none).await.unwrap();
    let e = alice.pnfs_handle(f.ino, true).await.expect_err("no handle without the rights");
    assert_eq!(e.code(), Some(weft_proto::ErrorCode::Permission), "{e}");

    // The old handle, kept past its sealed expiry: refused for writing and reading alike.
    let left_ms = cap.expiry_ms.saturating_sub(weft_rpc::capability::unix_now_ms());
    tokio::time::sleep(std::time::Duration::from_millis(left_ms + 1)).await;
    let mut res = v
        .on_fh(&handle, |o| {
            o.write(0, FILE_SYNC4, b"after the bound!");
        })
        .await;
    assert_eq!(res.op(OP_WRITE), NFS4ERR_STALE, "a write on an expired handle");
    let mut res = v
        .on_fh(&handle, |o| {
            o.read(0, 16);
        })
        .await;
    assert_eq!(res.op(OP_READ), NFS4ERR_STALE, "a read on an expired handle");
    // What the handle wrote while it was good is there; nothing after.
    root.commit(f.ino, 16, 1_700_000_000_000_000_000).await.unwrap();
    let check = root.open_ino(f.ino, weft_client::OpenMode::Read).await.unwrap();
    assert_eq!(&check.read_at(0, bytes::BytesMut::zeroed(16)).await.unwrap()[..], b"before the chmod");
}
