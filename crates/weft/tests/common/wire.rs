//! Raw RPC frames for the tests that talk to a server by hand (hostile input, exactly-once, session ownership).

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use weft_proto::{FrameKind, FrameLimits, HEADER_LEN, Header};

/// A request's header and body, with `data_len` in the header whatever follows (a test may lie about it).
pub fn request_head(op: u16, session: u64, slot: u32, seq: u32, body: &[u8], data_len: u32) -> Vec<u8> {
    let h = Header {
        kind: FrameKind::Request,
        flags: 0,
        op,
        session,
        slot,
        seq,
        body_len: body.len() as u32,
        data_len,
        body_crc: crc32c::crc32c(body),
    };
    let mut v = h.encode().to_vec();
    v.extend_from_slice(body);
    v
}

/// A whole request frame: header, body and `data` as its payload.
pub fn request_frame(op: u16, session: u64, slot: u32, seq: u32, body: &[u8], data: &[u8]) -> Vec<u8> {
    let mut v = request_head(op, session, slot, seq, body, data.len() as u32);
    v.extend_from_slice(data);
    v
}

/// Reads one reply frame (checked against the default limits): header, body, payload.
pub async fn read_reply(s: &mut TcpStream) -> (Header, Vec<u8>, Vec<u8>) {
    let mut hb = [0u8; HEADER_LEN];
    s.read_exact(&mut hb).await.expect("a reply header");
    let h = Header::decode(&hb, &FrameLimits::default()).unwrap();
    let mut body = vec![0u8; h.body_len as usize];
    s.read_exact(&mut body).await.unwrap();
    let mut data = vec![0u8; h.data_len as usize];
    s.read_exact(&mut data).await.unwrap();
    (h, body, data)
}
