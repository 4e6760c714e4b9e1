//! Striping arithmetic: byte `o` lives in stripe `s = o / unit`, on server index `s % count`, at
//! object offset `(s / count) * unit + o % unit`.

use serde::{Deserialize, Serialize};

pub const STRIPE_UNIT_BYTES_MIN: u32 = 4096;
pub const STRIPE_UNIT_BYTES_MAX: u32 = 64 << 20;
pub const STRIPE_COUNT_MAX: u32 = 256;
pub const DEFAULT_STRIPE_UNIT_BYTES: u32 = 1 << 20;

/// How a file is spread over data servers. On a directory `servers` is empty and the layout is the policy that new
/// children inherit (`stripe_count == 0` there means "every data server").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    pub stripe_unit: u32,
    pub stripe_count: u32,
    /// Data server ids, in stripe order. `servers.len() == stripe_count` on a file.
    pub servers: Vec<u32>,
}

/// One contiguous run of a file range that lives on one server's object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Index into [`Layout::servers`].
    pub server_index: u32,
    pub object_offset: u64,
    pub file_offset: u64,
    pub len: u64,
}

impl Layout {
    /// Checks a layout (or a directory policy when `policy` is true) from the wire or a user.
    pub fn validate(&self, policy: bool) -> Result<(), String> {
        let u = self.stripe_unit;
        if !(STRIPE_UNIT_BYTES_MIN..=STRIPE_UNIT_BYTES_MAX).contains(&u) || !u.is_multiple_of(STRIPE_UNIT_BYTES_MIN) {
            return Err(format!(
                "stripe unit {u} must be a multiple of {STRIPE_UNIT_BYTES_MIN} between {STRIPE_UNIT_BYTES_MIN} and {STRIPE_UNIT_BYTES_MAX}"
            ));
        }
        if self.stripe_count > STRIPE_COUNT_MAX || (!policy && self.stripe_count == 0) {
            return Err(format!("stripe count {} must be 1..={STRIPE_COUNT_MAX}", self.stripe_count));
        }
        if !policy && self.servers.len() != self.stripe_count as usize {
            return Err(format!(
                "layout names {} servers for a stripe count of {}",
                self.servers.len(),
                self.stripe_count
            ));
        }
        Ok(())
    }

    /// Splits the file range `[offset, offset + len)` into per-server pieces, in file order. Pieces never cross a
    /// stripe unit. A valid file layout is assumed (see [`Layout::validate`]).
    pub fn pieces(&self, offset: u64, len: u64) -> Vec<Piece> {
        assert!(self.stripe_count > 0 && self.stripe_unit > 0, "pieces() on a directory policy");
        let unit = self.stripe_unit as u64;
        let count = self.stripe_count as u64;
        let mut out = Vec::new();
        let mut o = offset;
        let end = offset.saturating_add(len);
        while o < end {
            let s = o / unit;
            let within = o % unit;
            let n = (unit - within).min(end - o);
            out.push(Piece {
                server_index: (s % count) as u32,
                object_offset: (s / count) * unit + within,
                file_offset: o,
                len: n,
            });
            o += n;
        }
        out
    }

    /// The size server `server_index`'s object has when the file is exactly `file_size` bytes long.
    pub fn object_size(&self, file_size: u64, server_index: u32) -> u64 {
        let unit = self.stripe_unit as u64;
        let count = self.stripe_count as u64;
        let i = server_index as u64;
        let full = file_size / unit;
        let rem = file_size % unit;
        if rem > 0 && full % count == i {
            return (full / count) * unit + rem;
        }
        if full > i {
            let last = i + ((full - 1 - i) / count) * count;
            return (last / count + 1) * unit;
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lay(unit: u32, count: u32) -> Layout {
        Layout { stripe_unit: unit, stripe_count: count, servers: (0..count).collect() }
    }

    #[test]
    fn pieces_follow_the_formula() {
        let l = lay(4096, 3);
        let p = l.pieces(4000, 10_000);
        assert_eq!(p[0], Piece { server_index: 0, object_offset: 4000, file_offset: 4000, len: 96 });
        assert_eq!(p[1], Piece { server_index: 1, object_offset: 0, file_offset: 4096, len: 4096 });
        assert_eq!(p[2], Piece { server_index: 2, object_offset: 0, file_offset: 8192, len: 4096 });
        assert_eq!(p[3], Piece { server_index: 0, object_offset: 4096, file_offset: 12288, len: 1712 });
        assert_eq!(p.iter().map(|x| x.len).sum::<u64>(), 10_000);
    }

    #[test]
    fn object_size_matches_brute_force() {
        for count in 1..5u32 {
            let l = lay(4096, count);
            for size in [0u64, 1, 4095, 4096, 4097, 8192, 12_000, 40_961, 100_000] {
                for i in 0..count {
                    let brute = l
                        .pieces(0, size)
                        .iter()
                        .filter(|p| p.server_index == i)
                        .map(|p| p.object_offset + p.len)
                        .max()
                        .unwrap_or(0);
                    assert_eq!(l.object_size(size, i), brute, "count {count} size {size} server {i}");
                }
            }
        }
    }

    #[test]
    fn validate_refuses_bad_layouts() {
        assert!(lay(4096, 2).validate(false).is_ok());
        assert!(lay(1000, 2).validate(false).is_err());
        assert!(lay(4096, 0).validate(false).is_err());
        assert!(Layout { stripe_unit: 4096, stripe_count: 0, servers: vec![] }.validate(true).is_ok());
        assert!(Layout { stripe_unit: 4096, stripe_count: 2, servers: vec![1] }.validate(false).is_err());
    }
}
