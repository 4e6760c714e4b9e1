//! The user block: who a request acts for (uid, gid, supplementary groups), as ONC RPC's AUTH_SYS credential.
//!
//! A request frame with [`crate::frame::FLAG_USER`] set has this block at the start of its body, before the op's
//! postcard body; `body_len` and `body_crc` cover both. The RPC layer decodes and checks it before the service runs
//! and knows nothing of what it means; the metadata service maps it, with the connection's proved key, to the
//! identity an operation runs as (docs/format.md §1).
//!
//! Layout (little-endian): `uid u32, gid u32, ngroups u16, reserved u16 (0), groups [u32; ngroups]`.

use crate::frame::FrameError;

/// Most supplementary groups a user block carries. AUTH_SYS allows 16, which users of NFS keep running into; 32
/// covers the accounts seen in practice while keeping the block (at most 140 bytes) small enough to send on every
/// metadata request. A caller in more groups gets a clear error, never a silently shortened list: a missing group
/// could only refuse access, but a surprising refusal is harder to debug than an error naming the limit.
pub const USER_GROUPS_MAX: usize = 32;

/// Bytes before the groups.
const FIXED_BYTES: usize = 12;

/// The identity a request asserts.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct UserCred {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups, at most [`USER_GROUPS_MAX`].
    pub groups: Vec<u32>,
}

/// A user block that cannot be built or read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UserCredError {
    #[error("{0} supplementary groups: a request carries at most {USER_GROUPS_MAX}")]
    TooManyGroups(usize),
    #[error("user block truncated: need {need} bytes, have {have}")]
    Truncated { need: usize, have: usize },
    #[error("user block reserved field is {0:#x}, not 0")]
    Reserved(u16),
}

impl From<UserCredError> for FrameError {
    fn from(e: UserCredError) -> FrameError {
        FrameError::BadUser(e.to_string())
    }
}

impl UserCred {
    /// A credential, refusing more than [`USER_GROUPS_MAX`] groups.
    pub fn new(uid: u32, gid: u32, groups: Vec<u32>) -> Result<UserCred, UserCredError> {
        if groups.len() > USER_GROUPS_MAX {
            return Err(UserCredError::TooManyGroups(groups.len()));
        }
        Ok(UserCred { uid, gid, groups })
    }

    /// Bytes of the encoded block.
    pub fn encoded_len(&self) -> usize {
        FIXED_BYTES + 4 * self.groups.len()
    }

    /// Appends the block to `out`. Groups past [`USER_GROUPS_MAX`] (only possible by building the struct by hand)
    /// are an error, so the receiver never sees a block it must refuse.
    pub fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), UserCredError> {
        if self.groups.len() > USER_GROUPS_MAX {
            return Err(UserCredError::TooManyGroups(self.groups.len()));
        }
        out.reserve(self.encoded_len());
        out.extend_from_slice(&self.uid.to_le_bytes());
        out.extend_from_slice(&self.gid.to_le_bytes());
        out.extend_from_slice(&(self.groups.len() as u16).to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        for g in &self.groups {
            out.extend_from_slice(&g.to_le_bytes());
        }
        Ok(())
    }

    /// Reads a block from the start of `buf`; returns it and the bytes after it (the op's body).
    pub fn decode_prefix(buf: &[u8]) -> Result<(UserCred, &[u8]), UserCredError> {
        if buf.len() < FIXED_BYTES {
            return Err(UserCredError::Truncated { need: FIXED_BYTES, have: buf.len() });
        }
        let u32_at = |i: usize| u32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
        let ngroups = u16::from_le_bytes([buf[8], buf[9]]) as usize;
        let reserved = u16::from_le_bytes([buf[10], buf[11]]);
        if reserved != 0 {
            return Err(UserCredError::Reserved(reserved));
        }
        if ngroups > USER_GROUPS_MAX {
            return Err(UserCredError::TooManyGroups(ngroups));
        }
        let need = FIXED_BYTES + 4 * ngroups;
        if buf.len() < need {
            return Err(UserCredError::Truncated { need, have: buf.len() });
        }
        let groups = (0..ngroups).map(|i| u32_at(FIXED_BYTES + 4 * i)).collect();
        Ok((UserCred { uid: u32_at(0), gid: u32_at(4), groups }, &buf[need..]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_blocks_round_trip_byte_for_byte() {
        let u = UserCred::new(1000, 100, vec![4, 24, 27]).unwrap();
        let mut b = Vec::new();
        u.encode_into(&mut b).unwrap();
        b.extend_from_slice(b"rest");
        assert_eq!(&b[..12], &[0xe8, 3, 0, 0, 100, 0, 0, 0, 3, 0, 0, 0]);
        assert_eq!(b.len(), u.encoded_len() + 4);
        let (d, rest) = UserCred::decode_prefix(&b).unwrap();
        assert_eq!((d, rest), (u, &b"rest"[..]));
        let none = UserCred::new(0, 0, vec![]).unwrap();
        let mut b = Vec::new();
        none.encode_into(&mut b).unwrap();
        assert_eq!(UserCred::decode_prefix(&b).unwrap(), (none, &[][..]));
    }

    #[test]
    fn bad_user_blocks_are_refused() {
        assert_eq!(UserCred::new(1, 1, vec![0; 33]), Err(UserCredError::TooManyGroups(33)));
        assert!(UserCred::new(1, 1, vec![0; 32]).is_ok());
        let too_many = UserCred { uid: 1, gid: 1, groups: vec![0; 40] };
        assert!(too_many.encode_into(&mut Vec::new()).is_err());
        assert!(matches!(UserCred::decode_prefix(&[0; 11]), Err(UserCredError::Truncated { need: 12, have: 11 })));
        let mut b = vec![1, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 5, 0, 0, 0];
        assert!(matches!(UserCred::decode_prefix(&b), Err(UserCredError::Truncated { need: 20, have: 16 })));
        b[8] = 33;
        assert_eq!(UserCred::decode_prefix(&b), Err(UserCredError::TooManyGroups(33)));
        b[8] = 1;
        b[10] = 1;
        assert_eq!(UserCred::decode_prefix(&b), Err(UserCredError::Reserved(1)));
    }
}
