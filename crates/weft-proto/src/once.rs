//! The once block: which call of which client a request is, across sessions and services, so a metadata service
//! can tell a retry of a call that already ran from a new one after the session that ran it is gone (docs/format.md
//! §1, §27).
//!
//! A request frame with [`crate::frame::FLAG_ONCE`] set carries this block in its body after the user block (if
//! `FLAG_USER` is set too) and before the op's postcard body; `body_len` and `body_crc` cover it. Every attempt of
//! one call carries the same block, also when the call moved to a new session or another service.
//!
//! Layout (little-endian, 16 bytes): `client u64` (random per client instance, never 0), `call u64` (the slot's
//! call number in that client, from 1, one per call and never reused; the frame's slot says which slot).

use crate::frame::FrameError;

/// Bytes of a once block.
pub const ONCE_BYTES: usize = 16;

/// The once block of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OnceTag {
    /// The client instance (random, not 0).
    pub client: u64,
    /// The call's number on its slot (from 1).
    pub call: u64,
}

impl OnceTag {
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.client.to_le_bytes());
        out.extend_from_slice(&self.call.to_le_bytes());
    }

    /// Decodes the block at the start of `buf`; returns it and the rest.
    pub fn decode_prefix(buf: &[u8]) -> Result<(OnceTag, &[u8]), FrameError> {
        if buf.len() < ONCE_BYTES {
            return Err(FrameError::Truncated { need: ONCE_BYTES, have: buf.len() });
        }
        let u64_at = |i: usize| u64::from_le_bytes(buf[i..i + 8].try_into().expect("8 bytes"));
        let tag = OnceTag { client: u64_at(0), call: u64_at(8) };
        if tag.client == 0 || tag.call == 0 {
            return Err(FrameError::BadOnce(format!("client {:#x} call {}: neither may be 0", tag.client, tag.call)));
        }
        Ok((tag, &buf[ONCE_BYTES..]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_round_trips_and_bad_ones_are_refused() {
        let tag = OnceTag { client: 0x0123_4567_89ab_cdef, call: 42 };
        let mut b = Vec::new();
        tag.encode_into(&mut b);
        b.extend_from_slice(b"rest");
        assert_eq!(b.len(), ONCE_BYTES + 4);
        assert_eq!(OnceTag::decode_prefix(&b).unwrap(), (tag, &b"rest"[..]));
        assert!(matches!(OnceTag::decode_prefix(&b[..15]), Err(FrameError::Truncated { need: 16, have: 15 })));
        let zero = [0u8; 16];
        assert!(matches!(OnceTag::decode_prefix(&zero), Err(FrameError::BadOnce(_))));
    }
}
