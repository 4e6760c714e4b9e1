//! Fixed little-endian formats of the rdma backend: the connection info swapped over the TCP side channel, and
//! the header in front of every two-sided message. Both decoders check every field; a malformed peer gets an
//! error, never a panic.

use super::{RdmaError, Result};

const MAGIC: [u8; 4] = *b"WFRC";
const VERSION: u16 = 1;
/// Bytes of [`ConnInfo`] on the side channel.
pub const CONN_INFO_BYTES: usize = 48;
/// Bytes of the header in front of each two-sided message: payload length (u32), credits returned (u16), flags
/// (u16).
pub const MSG_HEADER_BYTES: usize = 8;
/// Header flag: the message only returns credits and carries no payload for the application.
pub const FLAG_CREDIT_ONLY: u16 = 1;
/// QPNs and PSNs are 24-bit quantities.
const MAX_24BIT: u32 = 0x00ff_ffff;
/// Upper bounds a peer may ask for: they size our send ring and its completion waits.
pub const RECV_CREDITS_MAX: u32 = 4096;
pub const MSG_BYTES_MAX_LIMIT: u32 = 16 << 20;

/// Bytes of the client's hello, sent on the side channel once both queue pairs are up.
pub const HELLO_BYTES: usize = 32;
const HELLO_MAGIC: &[u8; 8] = b"WFTRDM01";
/// Largest arena a client may name in its hello.
pub const ARENA_BYTES_MAX: u64 = 1 << 30;

/// The client's arena as its hello names it: `"WFTRDM01" | addr u64 | len u64 | rkey u32 | reserved u32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaHello {
    pub addr: u64,
    pub len: u64,
    pub rkey: u32,
}

impl ArenaHello {
    pub fn encode(&self) -> [u8; HELLO_BYTES] {
        let mut h = [0u8; HELLO_BYTES];
        h[..8].copy_from_slice(HELLO_MAGIC);
        h[8..16].copy_from_slice(&self.addr.to_le_bytes());
        h[16..24].copy_from_slice(&self.len.to_le_bytes());
        h[24..28].copy_from_slice(&self.rkey.to_le_bytes());
        h
    }

    /// Checks magic, size (1 byte ..= [`ARENA_BYTES_MAX`]) and that the arena does not wrap the address space.
    pub fn decode(h: &[u8]) -> Result<Self> {
        let bad = |why: String| Err(RdmaError::Protocol(format!("bad hello: {why}")));
        if h.len() != HELLO_BYTES {
            return bad(format!("{} bytes instead of {HELLO_BYTES}", h.len()));
        }
        if &h[..8] != HELLO_MAGIC {
            return bad("not a Weft rdma hello".into());
        }
        let u64_at = |at: usize| u64::from_le_bytes(h[at..at + 8].try_into().unwrap_or_default());
        let (addr, len) = (u64_at(8), u64_at(16));
        let rkey = u32::from_le_bytes(h[24..28].try_into().unwrap_or_default());
        if len == 0 || len > ARENA_BYTES_MAX || addr.checked_add(len).is_none() {
            return bad(format!("arena of {len} bytes at {addr:#x}"));
        }
        Ok(ArenaHello { addr, len, rkey })
    }
}

/// What each side of a new RC connection tells the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnInfo {
    /// Port LID (InfiniBand); 0 on RoCE.
    pub lid: u16,
    pub qpn: u32,
    /// The first packet sequence number this side will send.
    pub psn: u32,
    /// The GID the peer must address (RoCE needs it; IB uses it across subnets).
    pub gid: [u8; 16],
    /// The port's active MTU as `enum ibv_mtu` (1 = 256 … 5 = 4096); both use the smaller.
    pub mtu: u32,
    /// Receives this side pre-posted: the peer's initial send credits.
    pub recv_credits: u32,
    /// Largest message (header included) one of this side's receive buffers holds.
    pub msg_bytes_max: u32,
}

impl ConnInfo {
    pub fn encode(&self) -> [u8; CONN_INFO_BYTES] {
        let mut b = [0u8; CONN_INFO_BYTES];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&self.lid.to_le_bytes());
        b[8..12].copy_from_slice(&self.qpn.to_le_bytes());
        b[12..16].copy_from_slice(&self.psn.to_le_bytes());
        b[16..32].copy_from_slice(&self.gid);
        b[32..36].copy_from_slice(&self.mtu.to_le_bytes());
        b[36..40].copy_from_slice(&self.recv_credits.to_le_bytes());
        b[40..44].copy_from_slice(&self.msg_bytes_max.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self> {
        let bad = |m: String| Err(RdmaError::Protocol(m));
        if b.len() != CONN_INFO_BYTES {
            return bad(format!("connection info is {} bytes, expected {CONN_INFO_BYTES}", b.len()));
        }
        if b[0..4] != MAGIC {
            return bad("connection info has a bad magic (not a Weft rdma peer?)".into());
        }
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let version = u16_at(4);
        if version != VERSION {
            return bad(format!("connection info version {version}, this side speaks {VERSION}"));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[16..32]);
        let info = Self {
            lid: u16_at(6),
            qpn: u32_at(8),
            psn: u32_at(12),
            gid,
            mtu: u32_at(32),
            recv_credits: u32_at(36),
            msg_bytes_max: u32_at(40),
        };
        if info.qpn > MAX_24BIT || info.psn > MAX_24BIT {
            return bad(format!("QPN {:#x} or PSN {:#x} exceeds 24 bits", info.qpn, info.psn));
        }
        if !(1..=5).contains(&info.mtu) {
            return bad(format!("MTU code {} is not 1..=5", info.mtu));
        }
        if !(1..=RECV_CREDITS_MAX).contains(&info.recv_credits) {
            return bad(format!("{} receive credits is not 1..={RECV_CREDITS_MAX}", info.recv_credits));
        }
        if info.msg_bytes_max <= MSG_HEADER_BYTES as u32 || info.msg_bytes_max > MSG_BYTES_MAX_LIMIT {
            return bad(format!("message size {} is out of range", info.msg_bytes_max));
        }
        if u32_at(44) != 0 {
            return bad("reserved connection info bytes are not zero".into());
        }
        Ok(info)
    }
}

/// A decoded message header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsgHeader {
    pub payload_len: usize,
    /// Receive buffers the sender re-posted since its last message: send credits for us.
    pub credits: u16,
    pub flags: u16,
}

/// Writes the message header: payload length, the credits this side returns to the peer, flags.
pub fn encode_header(buf: &mut [u8], payload_len: u32, credits: u16, flags: u16) {
    buf[0..4].copy_from_slice(&payload_len.to_le_bytes());
    buf[4..6].copy_from_slice(&credits.to_le_bytes());
    buf[6..8].copy_from_slice(&flags.to_le_bytes());
}

/// Checks a received message of `received_len` bytes (the completion's byte count). `credits_max` bounds what the
/// peer may return (it never held more of ours).
pub fn decode_header(buf: &[u8], received_len: usize, credits_max: u32) -> Result<MsgHeader> {
    if received_len < MSG_HEADER_BYTES || received_len > buf.len() {
        return Err(RdmaError::Protocol(format!(
            "received {received_len} bytes into a {}-byte buffer (header is {MSG_HEADER_BYTES})",
            buf.len()
        )));
    }
    let payload_len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    let credits = u16::from_le_bytes([buf[4], buf[5]]);
    let flags = u16::from_le_bytes([buf[6], buf[7]]);
    if payload_len != received_len - MSG_HEADER_BYTES {
        return Err(RdmaError::Protocol(format!(
            "header says {payload_len} payload bytes, {} arrived",
            received_len - MSG_HEADER_BYTES
        )));
    }
    if u32::from(credits) > credits_max {
        return Err(RdmaError::Protocol(format!("peer returned {credits} credits, at most {credits_max} possible")));
    }
    if flags & !FLAG_CREDIT_ONLY != 0 || (flags & FLAG_CREDIT_ONLY != 0 && payload_len != 0) {
        return Err(RdmaError::Protocol(format!("bad message flags {flags:#x} for {payload_len} payload bytes")));
    }
    Ok(MsgHeader { payload_len, credits, flags })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ConnInfo {
        ConnInfo {
            lid: 0,
            qpn: 0x11,
            psn: 0xabcdef,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 2, 15],
            mtu: 3,
            recv_credits: 16,
            msg_bytes_max: 4096,
        }
    }

    #[test]
    fn conn_info_round_trips() {
        let info = sample();
        assert_eq!(ConnInfo::decode(&info.encode()).unwrap(), info);
    }

    #[test]
    fn conn_info_rejects_bad_fields() {
        let good = sample().encode();
        assert!(ConnInfo::decode(&good[..CONN_INFO_BYTES - 1]).is_err());
        let mut wrong_magic = good;
        wrong_magic[0] = b'X';
        assert!(ConnInfo::decode(&wrong_magic).is_err());
        for (field, value) in [(8usize, 0x0100_0000u32), (12, u32::MAX), (32, 0), (32, 6), (36, 0), (36, 4097), (40, 8)]
        {
            let mut b = good;
            b[field..field + 4].copy_from_slice(&value.to_le_bytes());
            assert!(ConnInfo::decode(&b).is_err(), "field at {field} = {value} accepted");
        }
        let mut reserved = good;
        reserved[47] = 1;
        assert!(ConnInfo::decode(&reserved).is_err());
    }

    #[test]
    fn header_checks_length_and_credits() {
        let mut buf = [0u8; 64];
        encode_header(&mut buf, 10, 3, 0);
        assert_eq!(decode_header(&buf, 18, 16).unwrap(), MsgHeader { payload_len: 10, credits: 3, flags: 0 });
        assert!(decode_header(&buf, 17, 16).is_err(), "length mismatch");
        assert!(decode_header(&buf, 4, 16).is_err(), "shorter than a header");
        assert!(decode_header(&buf, 65, 16).is_err(), "longer than the buffer");
        assert!(decode_header(&buf, 18, 2).is_err(), "more credits than possible");
        encode_header(&mut buf, 10, 3, FLAG_CREDIT_ONLY);
        assert!(decode_header(&buf, 18, 16).is_err(), "credit-only with a payload");
        encode_header(&mut buf, 0, 3, FLAG_CREDIT_ONLY);
        assert!(decode_header(&buf, 8, 16).is_ok());
        encode_header(&mut buf, 0, 3, 4);
        assert!(decode_header(&buf, 8, 16).is_err(), "unknown flag");
    }
}
