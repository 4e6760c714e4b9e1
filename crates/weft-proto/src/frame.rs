//! The fixed 40-byte frame header and its checked decoder.
//!
//! Layout (all little-endian):
//! ```text
//! 0  magic u32 "WFT1"   4 version u8   5 kind u8   6 flags u8   7 reserved u8
//! 8  op u16             10 reserved u16
//! 12 session u64        20 slot u32    24 seq u32
//! 28 body_len u32       32 data_len u32             36 body_crc u32 (CRC-32C of the body)
//! ```

use thiserror::Error;

/// "WFT1" read as a little-endian u32.
pub const MAGIC: u32 = u32::from_le_bytes(*b"WFT1");
/// Wire version; a peer with another version is refused.
pub const VERSION: u8 = 1;
pub const HEADER_LEN: usize = 40;

/// The reply carries a [`crate::WireError`] body instead of the op's response body.
pub const FLAG_ERROR: u8 = 0x01;
/// The reply was served from the slot's reply cache (a retransmission); informational.
pub const FLAG_CACHED: u8 = 0x02;
/// A request whose body starts with a user block ([`crate::UserCred`]): the user it acts for.
pub const FLAG_USER: u8 = 0x04;
/// A request whose body carries a once block ([`crate::OnceTag`]) after the user block (if any): which call of which
/// client it is, across sessions and services.
pub const FLAG_ONCE: u8 = 0x08;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    Request = 1,
    Reply = 2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: FrameKind,
    pub flags: u8,
    /// Raw op code; see [`crate::Op`]. Kept raw so an unknown op can still be answered with an error.
    pub op: u16,
    pub session: u64,
    pub slot: u32,
    pub seq: u32,
    pub body_len: u32,
    pub data_len: u32,
    pub body_crc: u32,
}

/// Limits a receiver enforces before it allocates anything for a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLimits {
    pub body_bytes_max: u32,
    pub data_bytes_max: u32,
}

impl Default for FrameLimits {
    fn default() -> Self {
        FrameLimits { body_bytes_max: 4 << 20, data_bytes_max: 4 << 20 }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum FrameError {
    #[error("truncated frame: need {need} bytes, have {have}")]
    Truncated { need: usize, have: usize },
    #[error("bad magic {0:#010x}: not a Weft peer")]
    BadMagic(u32),
    #[error("unsupported wire version {0} (this build speaks {VERSION})")]
    BadVersion(u8),
    #[error("unknown frame kind {0}")]
    BadKind(u8),
    #[error("body of {len} bytes exceeds the limit of {max}")]
    BodyTooLarge { len: u32, max: u32 },
    #[error("data payload of {len} bytes exceeds the limit of {max}")]
    DataTooLarge { len: u32, max: u32 },
    #[error("body checksum mismatch (header says {expected:#010x}, body has {actual:#010x})")]
    BodyChecksum { expected: u32, actual: u32 },
    #[error("unknown op code {0}")]
    UnknownOp(u16),
    #[error("malformed body for op {op}: {reason}")]
    BadBody { op: u16, reason: String },
    #[error("bad user block: {0}")]
    BadUser(String),
    #[error("bad once block: {0}")]
    BadOnce(String),
    #[error("op {op} does not carry a data payload, but the frame has {len} bytes of it")]
    UnexpectedData { op: u16, len: u32 },
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = VERSION;
        b[5] = self.kind as u8;
        b[6] = self.flags;
        b[8..10].copy_from_slice(&self.op.to_le_bytes());
        b[12..20].copy_from_slice(&self.session.to_le_bytes());
        b[20..24].copy_from_slice(&self.slot.to_le_bytes());
        b[24..28].copy_from_slice(&self.seq.to_le_bytes());
        b[28..32].copy_from_slice(&self.body_len.to_le_bytes());
        b[32..36].copy_from_slice(&self.data_len.to_le_bytes());
        b[36..40].copy_from_slice(&self.body_crc.to_le_bytes());
        b
    }

    /// Decodes and checks a header. Lengths are checked against `limits` here, before the caller allocates.
    pub fn decode(buf: &[u8], limits: &FrameLimits) -> Result<Header, FrameError> {
        if buf.len() < HEADER_LEN {
            return Err(FrameError::Truncated { need: HEADER_LEN, have: buf.len() });
        }
        let u32_at = |i: usize| u32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
        let magic = u32_at(0);
        if magic != MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        if buf[4] != VERSION {
            return Err(FrameError::BadVersion(buf[4]));
        }
        let kind = match buf[5] {
            1 => FrameKind::Request,
            2 => FrameKind::Reply,
            k => return Err(FrameError::BadKind(k)),
        };
        let body_len = u32_at(28);
        let data_len = u32_at(32);
        if body_len > limits.body_bytes_max {
            return Err(FrameError::BodyTooLarge { len: body_len, max: limits.body_bytes_max });
        }
        if data_len > limits.data_bytes_max {
            return Err(FrameError::DataTooLarge { len: data_len, max: limits.data_bytes_max });
        }
        let mut session = [0u8; 8];
        session.copy_from_slice(&buf[12..20]);
        Ok(Header {
            kind,
            flags: buf[6],
            op: u16::from_le_bytes([buf[8], buf[9]]),
            session: u64::from_le_bytes(session),
            slot: u32_at(20),
            seq: u32_at(24),
            body_len,
            data_len,
            body_crc: u32_at(36),
        })
    }

    /// Checks a received body against the header's checksum.
    pub fn check_body(&self, body: &[u8]) -> Result<(), FrameError> {
        let actual = crc32c::crc32c(body);
        if actual != self.body_crc {
            return Err(FrameError::BodyChecksum { expected: self.body_crc, actual });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Header {
        Header {
            kind: FrameKind::Request,
            flags: 0,
            op: 200,
            session: 0xdead_beef_0000_0001,
            slot: 3,
            seq: 77,
            body_len: 12,
            data_len: 1 << 20,
            body_crc: 0x1234_5678,
        }
    }

    #[test]
    fn header_round_trips() {
        let h = sample();
        assert_eq!(Header::decode(&h.encode(), &FrameLimits::default()).unwrap(), h);
    }

    #[test]
    fn header_rejects_bad_input() {
        let l = FrameLimits::default();
        let enc = sample().encode();
        assert!(matches!(Header::decode(&enc[..39], &l), Err(FrameError::Truncated { .. })));
        let mut bad = enc;
        bad[0] ^= 1;
        assert!(matches!(Header::decode(&bad, &l), Err(FrameError::BadMagic(_))));
        let mut bad = enc;
        bad[4] = 9;
        assert_eq!(Header::decode(&bad, &l), Err(FrameError::BadVersion(9)));
        let mut bad = enc;
        bad[5] = 7;
        assert_eq!(Header::decode(&bad, &l), Err(FrameError::BadKind(7)));
        let small = FrameLimits { body_bytes_max: 11, data_bytes_max: 1 << 20 };
        assert!(matches!(Header::decode(&enc, &small), Err(FrameError::BodyTooLarge { len: 12, max: 11 })));
        let small = FrameLimits { body_bytes_max: 64, data_bytes_max: 1000 };
        assert!(matches!(Header::decode(&enc, &small), Err(FrameError::DataTooLarge { .. })));
    }

    #[test]
    fn body_checksum_is_verified() {
        let body = b"hello";
        let mut h = sample();
        h.body_crc = crc32c::crc32c(body);
        assert!(h.check_body(body).is_ok());
        assert!(matches!(h.check_body(b"hellp"), Err(FrameError::BodyChecksum { .. })));
    }
}
