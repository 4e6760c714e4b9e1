//! The Reed–Solomon code of ec layouts (docs/format.md §16) and what counts as a lost chunk: the pure parts under
//! the ec read, write and heal paths (`ec.rs`, `ec_rows.rs`, `ec_delta.rs`, `stale.rs`, `scrub.rs`), which all
//! import from here and never from each other for these.

use reed_solomon_erasure::galois_8::ReedSolomon;
use weft_proto::{DataRedundancy, ErrorCode, Layout};

use crate::ClientError;

/// A Reed–Solomon code of `k` data and `m` parity shards over GF(2^8) (the `reed-solomon-erasure` crate; see
/// ARCHITECTURE.md for why not ISA-L). Shards of one row all have the same length.
pub(crate) struct Codec {
    rs: ReedSolomon,
    pub(crate) k: usize,
    pub(crate) m: usize,
    /// `M[k+p][j]` of the encoding matrix (docs/format.md §16) at `p * k + j`: what data chunk `j` adds to parity
    /// chunk `p` per byte, for delta parity (`ec_delta.rs`); worked out on its first use.
    coefficients: std::sync::OnceLock<Vec<u8>>,
}

impl Codec {
    pub(crate) fn new(k: usize, m: usize) -> Result<Codec, ClientError> {
        let rs = ReedSolomon::new(k, m).map_err(|e| ClientError::Protocol(format!("ec {k}+{m}: {e:?}")))?;
        Ok(Codec { rs, k, m, coefficients: std::sync::OnceLock::new() })
    }

    /// The parity rows of the encoding matrix: the code is linear column by column, so encoding the one-byte unit
    /// vector e_j gives column j.
    fn coefficients(&self) -> &[u8] {
        self.coefficients.get_or_init(|| {
            let (k, m) = (self.k, self.m);
            let mut coefficients = vec![0u8; m * k];
            for j in 0..k {
                let data: Vec<[u8; 1]> = (0..k).map(|i| [u8::from(i == j)]).collect();
                let mut parity = vec![[0u8; 1]; m];
                self.rs.encode_sep(&data, &mut parity).expect("k one-byte shards and m outputs");
                for (p, b) in parity.iter().enumerate() {
                    coefficients[p * k + j] = b[0];
                }
            }
            coefficients
        })
    }

    /// Adds to `parity` (a range of parity chunk `p`) what `delta` (the XOR of new and old bytes of data chunk `j`
    /// over the same range) changes in it: `parity ^= M[k+p][j] · delta`, byte by byte over GF(2^8).
    pub(crate) fn add_delta(&self, p: usize, j: usize, delta: &[u8], parity: &mut [u8]) {
        assert!(p < self.m && j < self.k && delta.len() == parity.len(), "one range of one data and parity chunk");
        reed_solomon_erasure::galois_8::mul_slice_xor(self.coefficients()[p * self.k + j], delta, parity);
    }

    /// The `m` parity shards of `data` (`k` shards of one length).
    pub(crate) fn encode(&self, data: &[&[u8]]) -> Vec<Vec<u8>> {
        assert_eq!(data.len(), self.k, "k data shards");
        let len = data.first().map_or(0, |d| d.len());
        let mut parity = vec![vec![0u8; len]; self.m];
        self.rs.encode_sep(data, &mut parity).expect("shard counts and lengths are checked above");
        parity
    }

    /// The `m` parity shards of `data` (`k` shards of one length) into `parity` (`m` buffers of that length): no
    /// allocation, for callers that encode row after row.
    pub(crate) fn encode_into<P: AsRef<[u8]> + AsMut<[u8]>>(&self, data: &[&[u8]], parity: &mut [P]) {
        assert_eq!(data.len(), self.k, "k data shards");
        assert_eq!(parity.len(), self.m, "m parity shards");
        self.rs.encode_sep(data, parity).expect("shard counts and lengths are checked above");
    }

    /// Fills the `None`s among the `k` data shards of `shards` (`k + m`, at least `k` present) from the others; the
    /// parity shards stay as they are: the library's cheaper call, for readers that need only the data.
    pub(crate) fn reconstruct_data(&self, shards: &mut [Option<Vec<u8>>]) -> Result<(), String> {
        assert_eq!(shards.len(), self.k + self.m, "k + m shards");
        self.rs.reconstruct_data(shards).map_err(|e| format!("{e:?}"))?;
        if weft_rpc::CHECK_INVARIANTS {
            let data: Vec<&[u8]> = shards[..self.k].iter().map(|s| s.as_deref().expect("reconstructed")).collect();
            let parity: Vec<Option<&[u8]>> = shards[self.k..].iter().map(|s| s.as_deref()).collect();
            self.check_decoded(&data, &parity);
        }
        Ok(())
    }

    /// Invariant of a decode (docs/format.md §17: it uses only chunks whose versions agree): every parity chunk it
    /// was given is what the data chunks it returns encode to, so a decode never returns bytes its own inputs
    /// deny. One encode per decoded row, so checked where adversaries run ([`weft_rpc::CHECK_INVARIANTS`]: the
    /// tests' builds), not in the shipped build.
    fn check_decoded(&self, data: &[&[u8]], parity: &[Option<&[u8]>]) {
        if parity.iter().all(Option::is_none) {
            return;
        }
        let computed = self.encode(data);
        for (p, given) in parity.iter().enumerate() {
            if let Some(given) = given {
                assert!(computed[p] == *given, "ec decode: parity chunk {p} disagrees with the data decoded from it");
            }
        }
    }

    /// Fills the data shards not `present` in place from the present ones (`k + m` slices of one length, at
    /// least `k` present): nothing is copied.
    pub(crate) fn reconstruct_data_in_place(&self, shards: Vec<&mut [u8]>, present: &[bool]) -> Result<(), String> {
        assert!(shards.len() == self.k + self.m && present.len() == shards.len(), "k + m shards");
        let mut s: Vec<(&mut [u8], bool)> = shards.into_iter().zip(present.iter().copied()).collect();
        self.rs.reconstruct_data(&mut s).map_err(|e| format!("{e:?}"))?;
        if weft_rpc::CHECK_INVARIANTS {
            let data: Vec<&[u8]> = s[..self.k].iter().map(|(b, _)| &**b).collect();
            let parity: Vec<Option<&[u8]>> = s[self.k..].iter().map(|(b, used)| used.then_some(&**b)).collect();
            self.check_decoded(&data, &parity);
        }
        Ok(())
    }

    /// Fills every `None` of `shards` (`k + m` of one length, at least `k` present) from the others.
    pub(crate) fn reconstruct(&self, shards: &mut [Option<Vec<u8>>]) -> Result<(), String> {
        assert_eq!(shards.len(), self.k + self.m, "k + m shards");
        self.rs.reconstruct(shards).map_err(|e| format!("{e:?}"))
    }
}

/// `(k, m)` of an ec layout.
pub(crate) fn km(layout: &Layout) -> Option<(usize, usize)> {
    match layout.redundancy {
        DataRedundancy::Ec { k, m } => Some((usize::from(k), usize::from(m))),
        _ => None,
    }
}

/// Whether a failed chunk read means "use the other chunks": a server that is down or unreachable, fenced
/// (`StaleLayout`: not up at the MDS, or its lease lapsed; docs/format.md §19), or a chunk that failed its checksum.
/// Anything else (a refused capability, a protocol error) is the caller's problem.
pub(crate) fn is_chunk_loss(e: &ClientError) -> bool {
    match e {
        ClientError::Corrupt { .. } | ClientError::UnknownServer(_) => true,
        ClientError::Data { source, .. } | ClientError::DataAt { source, .. } => match source.remote() {
            Some(w) => {
                // `CapabilityExpired` here is after the renewal every call makes: that server's clock is off, its
                // chunk is read around as a dead server's would be (the model test's clock fault).
                matches!(
                    w.code,
                    ErrorCode::Corrupt
                        | ErrorCode::Io
                        | ErrorCode::Internal
                        | ErrorCode::StaleLayout
                        | ErrorCode::CapabilityExpired
                )
            }
            None => true,
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A seeded xorshift, so every run checks the same bytes.
    fn bytes(seed: u64, n: usize) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// Every choice of which chunks survive, for every count of survivors from `k` to `k + m`.
    fn survivor_sets(n: usize) -> impl Iterator<Item = Vec<bool>> {
        (0u32..1 << n).map(move |mask| (0..n).map(|i| mask & (1 << i) != 0).collect())
    }

    /// Delta parity gives the parity a full encode of the changed row gives, for every data chunk changed, any
    /// range of it, on several widths.
    #[test]
    fn delta_parity_equals_a_full_encode() {
        for (k, m) in [(1, 1), (2, 1), (4, 2), (6, 3), (10, 4)] {
            let codec = Codec::new(k, m).unwrap();
            let len = 1000;
            let mut data: Vec<Vec<u8>> = (0..k).map(|j| bytes(7 + j as u64, len)).collect();
            let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
            let mut parity = codec.encode(&refs);
            for (n, (j, lo, hi)) in [(0, 0, len), (k - 1, 3, 4), (k / 2, 100, 900)].into_iter().enumerate() {
                let new = bytes(1000 + n as u64, hi - lo);
                let delta: Vec<u8> = data[j][lo..hi].iter().zip(&new).map(|(o, n)| o ^ n).collect();
                for (p, par) in parity.iter_mut().enumerate() {
                    codec.add_delta(p, j, &delta, &mut par[lo..hi]);
                }
                data[j][lo..hi].copy_from_slice(&new);
                let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
                assert_eq!(parity, codec.encode(&refs), "ec {k}+{m}, chunk {j}, bytes [{lo}, {hi})");
            }
        }
    }

    fn decodes_from_every_k_survivors(k: usize, m: usize) {
        let codec = Codec::new(k, m).unwrap();
        for (seed, len) in [(1u64, 4096usize), (2, 1), (3, 777)] {
            let data: Vec<Vec<u8>> = (0..k).map(|j| bytes(seed * 100 + j as u64, len)).collect();
            let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
            let parity = codec.encode(&refs);
            let all: Vec<Vec<u8>> = data.iter().chain(parity.iter()).cloned().collect();
            let mut tried = 0;
            for alive in survivor_sets(k + m) {
                let n_alive = alive.iter().filter(|a| **a).count();
                let mut shards: Vec<Option<Vec<u8>>> =
                    all.iter().zip(&alive).map(|(s, a)| a.then(|| s.clone())).collect();
                let r = codec.reconstruct(&mut shards);
                if n_alive < k {
                    assert!(r.is_err(), "{k}+{m}: {n_alive} survivors cannot decode");
                    continue;
                }
                tried += 1;
                r.unwrap();
                let got: Vec<Vec<u8>> = shards.into_iter().map(|s| s.unwrap()).collect();
                assert_eq!(got, all, "{k}+{m}, survivors {alive:?}");
                // In place: lost data chunks hold garbage first and are overwritten.
                let mut place: Vec<Vec<u8>> =
                    all.iter().zip(&alive).map(|(s, a)| if *a { s.clone() } else { vec![0xA5; len] }).collect();
                let slices: Vec<&mut [u8]> = place.iter_mut().map(|v| v.as_mut_slice()).collect();
                codec.reconstruct_data_in_place(slices, &alive).unwrap();
                assert_eq!(place[..k], all[..k], "{k}+{m} in place, survivors {alive:?}");
            }
            // Every subset of at least k of k+m chunks.
            let expect: usize = (k..=k + m).map(|s| binom(k + m, s)).sum();
            assert_eq!(tried, expect);
        }
    }

    fn binom(n: usize, r: usize) -> usize {
        (0..r).fold(1, |acc, i| acc * (n - i) / (i + 1))
    }

    #[test]
    fn ec_4_2_decodes_from_every_set_of_k_survivors() {
        decodes_from_every_k_survivors(4, 2);
    }

    #[test]
    fn ec_2_1_decodes_from_every_set_of_k_survivors() {
        decodes_from_every_k_survivors(2, 1);
    }

    /// Parity is column-wise: zeros in every data chunk past some length give zeros in parity there, which is why
    /// a short last row stores neither its padding nor its parity's (§16).
    #[test]
    fn parity_of_zero_padding_is_zero() {
        let codec = Codec::new(4, 2).unwrap();
        let mut data: Vec<Vec<u8>> = (0..4).map(|j| bytes(9 + j, 4096)).collect();
        for d in &mut data[1..] {
            d.fill(0);
        }
        data[0][1000..].fill(0);
        let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        for p in codec.encode(&refs) {
            assert!(p[1000..].iter().all(|&b| b == 0));
            assert!(p[..1000].iter().any(|&b| b != 0));
        }
    }

    #[test]
    fn a_decode_its_own_parity_denies_breaks_the_invariant() {
        if !weft_rpc::CHECK_INVARIANTS {
            return;
        }
        let codec = Codec::new(2, 2).unwrap();
        let (d0, d1) = (bytes(1, 64), bytes(2, 64));
        let parity = codec.encode(&[&d0, &d1]);
        // Data chunk 0 missing: decoded from chunk 1 and parity 0. Parity 1, also given, agrees...
        let mut shards = vec![None, Some(d1.clone()), Some(parity[0].clone()), Some(parity[1].clone())];
        codec.reconstruct_data(&mut shards).unwrap();
        assert_eq!(shards[0].as_deref(), Some(&d0[..]));
        // ...or denies it: the decode is refused by the invariant, never returned.
        let mut denied = parity[1].clone();
        denied[5] ^= 1;
        let mut shards = vec![None, Some(d1), Some(parity[0].clone()), Some(denied)];
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| codec.reconstruct_data(&mut shards)));
        assert!(r.is_err(), "a parity chunk that denies the decoded data breaks the invariant");
    }

    #[test]
    fn chunk_loss_is_told_apart_from_other_failures() {
        let corrupt = ClientError::Corrupt { ino: 1, file_offset: 0, server: 2, object_offset: 0 };
        assert!(is_chunk_loss(&corrupt));
        assert!(is_chunk_loss(&ClientError::UnknownServer(3)));
        assert!(!is_chunk_loss(&ClientError::Access("no".into())));
        let remote = |code| ClientError::Data {
            server: 4,
            source: weft_rpc::RpcError::Remote(weft_proto::WireError::new(code, "x")),
        };
        assert!(is_chunk_loss(&remote(ErrorCode::StaleLayout)), "a fenced server's chunk is read around");
        assert!(!is_chunk_loss(&remote(ErrorCode::CapabilityRefused)));
        assert!(is_chunk_loss(&remote(ErrorCode::CapabilityExpired)), "a renewed capability refused: a bad clock");
    }
}
