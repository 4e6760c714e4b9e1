//! The data path against a real cluster: striping placement, a 1 GiB round trip, holes, truncate, overwrites,
//! and checksums that refuse to return corrupted bytes.

use crate::common;

use bytes::{Bytes, BytesMut};
use common::*;
use weft_client::{ClientError, OpenMode};
use weft_proto::{ROOT_INO, SetAttrs};

#[tokio::test]
async fn bytes_land_on_the_expected_servers_at_the_expected_offsets() {
    let c = start("striping", 4).await;
    let client = c.client().await;
    let dir = client.mkdir(ROOT_INO, "d", 0o755).await.unwrap();
    client.set_layout(dir.ino, 64 << 10, 3).await.unwrap();
    let f = client.create_path("/d/f", 0o644, true, false).await.unwrap();
    let layout = f.layout().clone();
    assert_eq!((layout.stripe_unit, layout.stripe_count), (64 << 10, 3), "layout inherited from the directory");
    assert_eq!(layout.servers.len(), 3);
    let len = 1_000_000usize;
    let data = pattern(7, 0, len);
    f.write_at(0, Bytes::from(data.clone())).await.unwrap();
    let ino = f.ino();
    f.close().await.unwrap();

    let unit = 64u64 << 10;
    let mut checked = 0u64;
    for (i, &server) in layout.servers.iter().enumerate() {
        let obj = std::fs::read(object_path(&c.data_root(server), ino)).unwrap();
        // Stripe s lives on server s % 3 at object offset (s / 3) * unit.
        let mut s = i as u64;
        while s * unit < len as u64 {
            let file_off = s * unit;
            let n = unit.min(len as u64 - file_off) as usize;
            let obj_off = ((s / 3) * unit) as usize;
            assert_eq!(&obj[obj_off..obj_off + n], &data[file_off as usize..file_off as usize + n], "stripe {s}");
            checked += n as u64;
            s += 3;
        }
        assert_eq!(obj.len() as u64, layout.object_size(len as u64, i as u32));
    }
    assert_eq!(checked, len as u64);
    // Servers outside the layout hold nothing of the file.
    for id in 0..4 {
        if !layout.servers.contains(&id) {
            assert!(!object_path(&c.data_root(id), ino).exists());
        }
    }
}

#[tokio::test]
async fn one_gib_round_trip_has_equal_checksums() {
    let c = start("gib", 4).await;
    let client = c.client().await;
    let f = client.create_path("/big", 0o644, true, false).await.unwrap();
    let chunk = 16usize << 20;
    let total = 1u64 << 30;
    let mut crc_in = 0u32;
    let mut off = 0u64;
    while off < total {
        let data = pattern(42, off, chunk);
        crc_in = crc32c::crc32c_append(crc_in, &data);
        f.write_at(off, Bytes::from(data)).await.unwrap();
        off += chunk as u64;
    }
    f.close().await.unwrap();

    let f = client.open("/big", OpenMode::ReadWrite).await.unwrap();
    assert_eq!(f.size(), total);
    let mut crc_out = 0u32;
    let mut off = 0u64;
    let mut buf = BytesMut::zeroed(chunk);
    while off < total {
        buf = f.read_at(off, buf).await.unwrap();
        assert_eq!(buf.len(), chunk);
        crc_out = crc32c::crc32c_append(crc_out, &buf);
        off += chunk as u64;
    }
    assert_eq!(crc_in, crc_out);
}

#[tokio::test]
async fn holes_truncate_and_overwrites() {
    let c = start("holes", 3).await;
    let client = c.client().await;
    let dir = client.mkdir(ROOT_INO, "small", 0o755).await.unwrap();
    client.set_layout(dir.ino, 4096, 3).await.unwrap();

    // A hole: only the range [100000, 100100) is written.
    let f = client.create_path("/small/holey", 0o644, true, false).await.unwrap();
    f.write_at(100_000, Bytes::from(vec![0xAA; 100])).await.unwrap();
    f.close().await.unwrap();
    let f = client.open("/small/holey", OpenMode::ReadWrite).await.unwrap();
    assert_eq!(f.size(), 100_100);
    let buf = f.read_at(0, BytesMut::zeroed(200_000)).await.unwrap();
    assert_eq!(buf.len(), 100_100, "reads stop at the end of the file");
    assert!(buf[..100_000].iter().all(|&b| b == 0), "the hole reads as zeros");
    assert!(buf[100_000..].iter().all(|&b| b == 0xAA));

    // Overwrite in the middle of a stripe unit, across a unit boundary.
    let f = client.create_path("/small/over", 0o644, true, false).await.unwrap();
    let mut model = pattern(1, 0, 50_000);
    f.write_at(0, Bytes::from(model.clone())).await.unwrap();
    let patch = pattern(2, 0, 5000);
    f.write_at(6000, Bytes::from(patch.clone())).await.unwrap();
    model[6000..11_000].copy_from_slice(&patch);
    // fsync reaches every data server of the layout (an unserved op would fail here), then commits.
    f.sync().await.unwrap();
    assert_eq!(client.getattr(f.ino()).await.unwrap().size, 50_000, "sync commits the size");
    f.close().await.unwrap();
    let f = client.open("/small/over", OpenMode::ReadWrite).await.unwrap();
    let buf = f.read_at(0, BytesMut::zeroed(50_000)).await.unwrap();
    assert_eq!(&buf[..], &model[..]);

    // Truncate down, then extend: the cut bytes must not come back, the objects shrink.
    f.truncate(10_001).await.unwrap();
    for (i, &server) in f.layout().servers.iter().enumerate() {
        let len = std::fs::metadata(object_path(&c.data_root(server), f.ino())).map(|m| m.len()).unwrap_or(0);
        assert_eq!(len, f.layout().object_size(10_001, i as u32), "object of server {server} after truncate");
    }
    client.setattr(f.ino(), SetAttrs { size: Some(30_000), ..Default::default() }).await.unwrap();
    let f = client.open("/small/over", OpenMode::ReadWrite).await.unwrap();
    assert_eq!(f.size(), 30_000);
    let buf = f.read_at(0, BytesMut::zeroed(30_000)).await.unwrap();
    assert_eq!(&buf[..10_001], &model[..10_001]);
    assert!(buf[10_001..].iter().all(|&b| b == 0), "bytes past a truncation read as zeros");
}

#[tokio::test]
async fn a_corrupted_block_is_an_error_naming_file_and_offset_never_wrong_bytes() {
    let c = start("corrupt", 2).await;
    let client = c.client().await;
    let dir = client.mkdir(ROOT_INO, "d", 0o755).await.unwrap();
    client.set_layout(dir.ino, 64 << 10, 2).await.unwrap();
    let f = client.create_path("/d/victim", 0o644, true, false).await.unwrap();
    let data = pattern(9, 0, 256 << 10);
    f.write_at(0, Bytes::from(data.clone())).await.unwrap();
    let (server, victim) = (f.layout().servers[1], f.ino());
    f.close().await.unwrap();

    // Flip one byte at object offset 70000 of the second server's object: file offset is stripe 3 (server 1,
    // object row 1) → 3 * 64K + (70000 - 64K).
    let path = object_path(&c.data_root(server), victim);
    let mut obj = std::fs::read(&path).unwrap();
    obj[70_000] ^= 0xFF;
    std::fs::write(&path, &obj).unwrap();

    let f = client.open("/d/victim", OpenMode::ReadWrite).await.unwrap();
    let err = f.read_at(0, BytesMut::zeroed(256 << 10)).await.unwrap_err();
    let expected_block = 70_000 / 4096 * 4096;
    match &err {
        ClientError::Corrupt { ino, file_offset, object_offset, server: s } => {
            assert_eq!(*ino, f.ino());
            assert_eq!(*s, server);
            assert_eq!(*object_offset, expected_block);
            assert_eq!(*file_offset, 3 * 65_536 + (expected_block - 65_536));
        }
        other => panic!("expected a checksum error, got {other}"),
    }
    assert!(err.to_string().contains("checksum mismatch"));
    // The rest of the file is still readable.
    let ok = f.read_at(0, BytesMut::zeroed(64 << 10)).await.unwrap();
    assert_eq!(&ok[..], &data[..64 << 10]);
}
