//! Striping arithmetic: byte `o` lives in stripe `s = o / unit`, on server index `s % count`, at
//! object offset `(s / count) * unit + o % unit`.
//!
//! A layout with redundancy (docs/format.md §16) keeps the same rule over its *data* servers: an `ec k+m` layout
//! stripes data over `servers[..k]` exactly as a plain layout of count `k` would ([`Layout::data_view`]), and
//! stores the `m` parity chunks of each stripe row on `servers[k..]` at the row's object offset; a `mirror n`
//! layout stores every byte at the same object offset on each of its `n` servers.

use serde::{Deserialize, Serialize};

pub const STRIPE_UNIT_BYTES_MIN: u32 = 4096;
pub const STRIPE_UNIT_BYTES_MAX: u32 = 64 << 20;
pub const STRIPE_COUNT_MAX: u32 = 256;
pub const DEFAULT_STRIPE_UNIT_BYTES: u32 = 1 << 20;
/// The most data chunks (`k`) and parity chunks (`m`) an erasure-coded layout may have, and the most copies of a
/// mirror: beyond these a stripe row costs more memory and requests than it can be worth.
pub const EC_DATA_MAX: u8 = 32;
pub const EC_PARITY_MAX: u8 = 8;
pub const MIRROR_COPIES_MAX: u8 = 8;

/// How a layout protects its bytes (docs/format.md §16). A postcard enum: new kinds are only ever appended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub enum DataRedundancy {
    /// Every byte stored once (the rule in this module's header).
    #[default]
    Plain,
    /// Reed–Solomon: `k` data chunks and `m` parity chunks per stripe row, on `k + m` distinct servers.
    Ec { k: u8, m: u8 },
    /// Every byte on `n` distinct servers at the same object offset.
    Mirror { n: u8 },
}

impl DataRedundancy {
    /// How many servers a file with this redundancy uses, or `None` for plain (the policy's count decides).
    pub fn width(self) -> Option<u32> {
        match self {
            DataRedundancy::Plain => None,
            DataRedundancy::Ec { k, m } => Some(u32::from(k) + u32::from(m)),
            DataRedundancy::Mirror { n } => Some(u32::from(n)),
        }
    }

    /// How many servers of the layout may be lost with every byte still readable.
    pub fn tolerates(self) -> u32 {
        match self {
            DataRedundancy::Plain => 0,
            DataRedundancy::Ec { m, .. } => u32::from(m),
            DataRedundancy::Mirror { n } => u32::from(n).saturating_sub(1),
        }
    }

    /// Checks the parameters (not the layout's server count).
    pub fn validate(self) -> Result<(), String> {
        match self {
            DataRedundancy::Plain => Ok(()),
            DataRedundancy::Ec { k, m } => {
                if !(1..=EC_DATA_MAX).contains(&k) || !(1..=EC_PARITY_MAX).contains(&m) {
                    return Err(format!("ec {k}+{m}: k must be 1..={EC_DATA_MAX} and m 1..={EC_PARITY_MAX}"));
                }
                Ok(())
            }
            DataRedundancy::Mirror { n } => {
                if !(2..=MIRROR_COPIES_MAX).contains(&n) {
                    return Err(format!("mirror {n}: the copies must be 2..={MIRROR_COPIES_MAX}"));
                }
                Ok(())
            }
        }
    }
}

impl std::fmt::Display for DataRedundancy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DataRedundancy::Plain => write!(f, "plain"),
            DataRedundancy::Ec { k, m } => write!(f, "ec {k}+{m}"),
            DataRedundancy::Mirror { n } => write!(f, "mirror {n}"),
        }
    }
}

/// How a file is spread over data servers. On a directory `servers` is empty and the layout is the policy that new
/// children inherit (`stripe_count == 0` there means "every data server").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    pub stripe_unit: u32,
    pub stripe_count: u32,
    /// Data server ids, in stripe order. `servers.len() == stripe_count` on a file.
    pub servers: Vec<u32>,
    /// Plain, erasure-coded or mirrored (§16). With redundancy, `stripe_count` is the layout's width (`k + m` or
    /// `n`) on a file and on a policy alike.
    pub redundancy: DataRedundancy,
    /// The layout generation (docs/format.md §19): 0 at create; the MDS adds 1 in the transaction that moves a
    /// failed server's slot to a spare, so a client holding an older layout can tell. Always 0 on a policy.
    pub generation: u64,
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
        self.redundancy.validate()?;
        if let Some(w) = self.redundancy.width()
            && self.stripe_count != w
        {
            return Err(format!(
                "a {} layout uses {w} servers, not a stripe count of {}",
                self.redundancy, self.stripe_count
            ));
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

    /// A plain layout, as a file layout: `stripe_count` servers named by `servers`.
    pub fn plain(stripe_unit: u32, servers: Vec<u32>) -> Layout {
        Layout {
            stripe_unit,
            stripe_count: servers.len() as u32,
            servers,
            redundancy: DataRedundancy::Plain,
            generation: 0,
        }
    }

    /// The plain layout the *data* of this file follows: itself when plain, `servers[..k]` with count `k` for
    /// `ec k+m`, and copy `copy`'s one server for a mirror (`copy` is ignored otherwise). A valid file layout is
    /// assumed.
    pub fn data_view(&self, copy: usize) -> Layout {
        match self.redundancy {
            DataRedundancy::Plain => self.clone(),
            DataRedundancy::Ec { k, .. } => Layout::plain(self.stripe_unit, self.servers[..usize::from(k)].to_vec()),
            DataRedundancy::Mirror { .. } => Layout::plain(self.stripe_unit, vec![self.servers[copy]]),
        }
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

    /// The size server `server_index`'s object has when the file is exactly `file_size` bytes long. With
    /// redundancy (§16): a data chunk's object as in the plain layout of its `k` data servers, a parity object as
    /// long as data chunk 0's (the longest of every row), and every mirror copy `file_size`.
    pub fn object_size(&self, file_size: u64, server_index: u32) -> u64 {
        match self.redundancy {
            DataRedundancy::Plain => plain_object_size(self.stripe_unit, self.stripe_count, file_size, server_index),
            DataRedundancy::Ec { k, .. } => {
                let i = if server_index < u32::from(k) { server_index } else { 0 };
                plain_object_size(self.stripe_unit, u32::from(k), file_size, i)
            }
            DataRedundancy::Mirror { .. } => file_size,
        }
    }
}

/// [`Layout::object_size`] of a plain layout of `stripe_count` servers.
fn plain_object_size(stripe_unit: u32, stripe_count: u32, file_size: u64, server_index: u32) -> u64 {
    {
        let unit = stripe_unit as u64;
        let count = stripe_count as u64;
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
        Layout::plain(unit, (0..count).collect())
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
    fn the_data_of_an_ec_layout_follows_the_plain_rule_over_k_servers() {
        let ec = Layout {
            stripe_unit: 4096,
            stripe_count: 6,
            servers: vec![10, 11, 12, 13, 14, 15],
            redundancy: DataRedundancy::Ec { k: 4, m: 2 },
            generation: 0,
        };
        let d = ec.data_view(0);
        assert_eq!(d, Layout::plain(4096, vec![10, 11, 12, 13]));
        // Byte 5 * 4096 + 7: stripe 5, data server 1, row 1 at object offset 4096 + 7.
        assert_eq!(
            d.pieces(5 * 4096 + 7, 1)[0],
            Piece { server_index: 1, object_offset: 4103, file_offset: 20487, len: 1 }
        );
        let m = Layout {
            stripe_unit: 4096,
            stripe_count: 2,
            servers: vec![7, 8],
            redundancy: DataRedundancy::Mirror { n: 2 },
            generation: 0,
        };
        assert_eq!(m.data_view(1), Layout::plain(4096, vec![8]));
    }

    #[test]
    fn validate_refuses_bad_layouts() {
        assert!(lay(4096, 2).validate(false).is_ok());
        assert!(lay(1000, 2).validate(false).is_err());
        assert!(lay(4096, 0).validate(false).is_err());
        let p = |count, servers, redundancy| Layout {
            stripe_unit: 4096,
            stripe_count: count,
            servers,
            redundancy,
            generation: 0,
        };
        assert!(p(0, vec![], DataRedundancy::Plain).validate(true).is_ok());
        assert!(p(2, vec![1], DataRedundancy::Plain).validate(false).is_err());
        assert!(p(6, vec![], DataRedundancy::Ec { k: 4, m: 2 }).validate(true).is_ok());
        assert!(p(6, (0..6).collect(), DataRedundancy::Ec { k: 4, m: 2 }).validate(false).is_ok());
        assert!(p(5, vec![], DataRedundancy::Ec { k: 4, m: 2 }).validate(true).is_err(), "width must be k+m");
        assert!(p(4, vec![], DataRedundancy::Ec { k: 4, m: 0 }).validate(true).is_err(), "m >= 1");
        assert!(p(1, vec![], DataRedundancy::Ec { k: 0, m: 1 }).validate(true).is_err(), "k >= 1");
        assert!(p(1, vec![], DataRedundancy::Mirror { n: 1 }).validate(true).is_err(), "n >= 2");
        assert!(p(2, vec![3, 4], DataRedundancy::Mirror { n: 2 }).validate(false).is_ok());
    }
}
