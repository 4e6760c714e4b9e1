//! Placement by consistent hashing, ketama-style: each daemon owns `points_per_daemon` points on a 32-bit
//! circle and a key belongs to the first point at or after its own hash, so adding or removing one of N daemons
//! moves only the keys that daemon gains or loses, about 1/N of them.
//!
//! The hash is SHA-256 (from `ring`, already in the tree for authentication): a daemon's points are the eight
//! 32-bit words of `SHA-256("<address>-<j>")` for j = 0, 1, … (ketama takes four words from each MD5), a key's
//! position the low 32 bits of its [`key_hash`](crate::value::key_hash), computed anyway for the value header.
//! SHA-256 is well distributed on short, similar inputs such as `host:port-17` (a weak hash there clusters the
//! points and unbalances the daemons) and costs well under a microsecond a key, small beside a network round
//! trip; MD5 would need a new dependency and be no better. Pure: no I/O, no clock.

/// One daemon's point on the circle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Point {
    position: u32,
    daemon: usize,
}

/// The circle for a list of daemons, identified by their addresses (the same list gives the same placement in
/// every process).
#[derive(Debug, Clone)]
pub struct Ring {
    points: Vec<Point>,
    daemons: usize,
}

/// ketama's customary count: enough points that each daemon's share is within a few per cent of 1/N.
pub const POINTS_PER_DAEMON_DEFAULT: usize = 160;

impl Ring {
    /// A ring over `addresses` (daemon i is `addresses[i]`), with `points_per_daemon` points each (rounded up to
    /// a multiple of 8).
    pub fn new<S: AsRef<str>>(addresses: &[S], points_per_daemon: usize) -> Ring {
        let digests = points_per_daemon.max(1).div_ceil(8);
        let mut points = Vec::with_capacity(addresses.len() * digests * 8);
        for (daemon, address) in addresses.iter().enumerate() {
            for j in 0..digests {
                let name = format!("{}-{j}", address.as_ref());
                let d = ring::digest::digest(&ring::digest::SHA256, name.as_bytes());
                for word in d.as_ref().chunks_exact(4) {
                    let position = u32::from_le_bytes(word.try_into().expect("4 bytes"));
                    points.push(Point { position, daemon });
                }
            }
        }
        points.sort_unstable();
        Ring { points, daemons: addresses.len() }
    }

    pub fn daemons(&self) -> usize {
        self.daemons
    }

    /// The key's position on the circle, from its [`key_hash`](crate::value::key_hash).
    pub fn position(key_hash: u64) -> u32 {
        key_hash as u32
    }

    /// The daemon that owns `key_hash`, or `None` on an empty ring.
    pub fn owner(&self, key_hash: u64) -> Option<usize> {
        self.route(key_hash, |_| true)
    }

    /// The first daemon clockwise from the key's position that `usable` accepts: an ejected daemon's keys go to
    /// the next daemon on the circle, and return to it when it is back. `None` when no daemon is usable.
    pub fn route(&self, key_hash: u64, mut usable: impl FnMut(usize) -> bool) -> Option<usize> {
        if self.points.is_empty() {
            return None;
        }
        let position = Ring::position(key_hash);
        let start = self.points.partition_point(|p| p.position < position);
        // Daemons already refused: a bit mask for the usual small bank, a vector (allocated only then) beyond 64.
        let mut refused_mask = 0u64;
        let mut refused_many = if self.daemons > 64 { vec![false; self.daemons] } else { Vec::new() };
        let mut refused_count = 0;
        for i in 0..self.points.len() {
            let daemon = self.points[(start + i) % self.points.len()].daemon;
            let seen = match refused_many.get_mut(daemon) {
                Some(flag) => std::mem::replace(flag, true),
                None => {
                    let bit = 1u64 << daemon;
                    let seen = refused_mask & bit != 0;
                    refused_mask |= bit;
                    seen
                }
            };
            if seen {
                continue;
            }
            if usable(daemon) {
                return Some(daemon);
            }
            refused_count += 1;
            if refused_count == self.daemons {
                break;
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::key_hash;

    /// Seeded keys: SplitMix64 from a fixed seed, formatted as cache keys are.
    fn keys(n: usize) -> Vec<u64> {
        let mut state: u64 = 0x5eed_0016;
        (0..n)
            .map(|_| {
                state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = state;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^= z >> 31;
                key_hash(format!("wf1/0/b/{z:x}/1/0").as_bytes())
            })
            .collect()
    }

    fn addresses(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("127.0.0.1:{}", 11211 + i)).collect()
    }

    #[test]
    fn placement_is_deterministic_and_balanced() {
        let ks = keys(50_000);
        let a = Ring::new(&addresses(8), POINTS_PER_DAEMON_DEFAULT);
        let b = Ring::new(&addresses(8), POINTS_PER_DAEMON_DEFAULT);
        let mut share = [0usize; 8];
        for &k in &ks {
            let owner = a.owner(k).unwrap();
            assert_eq!(Some(owner), b.owner(k));
            share[owner] += 1;
        }
        let mean = ks.len() / 8;
        for (d, &s) in share.iter().enumerate() {
            assert!(s > mean * 7 / 10 && s < mean * 13 / 10, "daemon {d} owns {s} keys, mean {mean}: {share:?}");
        }
        assert_eq!(Ring::new(&Vec::<String>::new(), 160).owner(1), None);
    }

    #[test]
    fn removing_one_of_n_moves_about_one_nth() {
        let n = 10;
        let ks = keys(50_000);
        let full = addresses(n);
        let before = Ring::new(&full, POINTS_PER_DAEMON_DEFAULT);
        // Remove daemon 3: only its keys move, and they are about 1/N of all.
        let mut fewer = full.clone();
        fewer.remove(3);
        let after = Ring::new(&fewer, POINTS_PER_DAEMON_DEFAULT);
        let mut moved = 0;
        for &k in &ks {
            let was = &full[before.owner(k).unwrap()];
            let now = &fewer[after.owner(k).unwrap()];
            if was != now {
                assert_eq!(was, &full[3], "a key of a remaining daemon moved");
                moved += 1;
            }
        }
        let fraction = moved as f64 / ks.len() as f64;
        assert!((0.07..0.13).contains(&fraction), "removing 1 of {n} moved {fraction:.3} of the keys");
    }

    #[test]
    fn adding_one_moves_about_one_nth_to_the_new_daemon() {
        let n = 10;
        let ks = keys(50_000);
        let old = addresses(n);
        let new = addresses(n + 1);
        let before = Ring::new(&old, POINTS_PER_DAEMON_DEFAULT);
        let after = Ring::new(&new, POINTS_PER_DAEMON_DEFAULT);
        let mut moved = 0;
        for &k in &ks {
            let was = &old[before.owner(k).unwrap()];
            let now = &new[after.owner(k).unwrap()];
            if was != now {
                assert_eq!(now, &new[n], "a key moved between old daemons");
                moved += 1;
            }
        }
        let fraction = moved as f64 / ks.len() as f64;
        assert!((0.06..0.125).contains(&fraction), "adding an 11th moved {fraction:.3} of the keys");
    }

    #[test]
    fn routing_around_unusable_daemons() {
        let ring = Ring::new(&addresses(3), POINTS_PER_DAEMON_DEFAULT);
        let ks = keys(2_000);
        for &k in &ks {
            let owner = ring.owner(k).unwrap();
            // The owner refused: the key goes elsewhere, the same place each time.
            let detour = ring.route(k, |d| d != owner).unwrap();
            assert_ne!(detour, owner);
            assert_eq!(ring.route(k, |d| d != owner), Some(detour));
            // Keys of other daemons do not move when one is refused.
            if owner != 0 {
                assert_eq!(ring.route(k, |d| d != 0), Some(owner));
            }
            assert_eq!(ring.route(k, |_| false), None);
        }
        // Past 64 daemons (the bit mask's width) the same walk holds.
        let big = Ring::new(&addresses(70), 16);
        for &k in ks.iter().take(200) {
            assert_eq!(big.route(k, |d| d == 69), Some(69));
            assert_eq!(big.route(k, |d| d == 3), Some(3));
            assert_eq!(big.route(k, |_| false), None);
        }
    }
}
