//! Which chunks of an ec stripe row may be decoded together (docs/format.md §17), as a pure function of the chunk
//! versions found: the rule that closes the write hole.
//!
//! Every chunk carries a version; every parity chunk also the versions of the `k` data chunks it was computed
//! from. A parity chunk is *usable* only if that vector agrees with the version of every data chunk that
//! survived; decoding uses the surviving data chunks and usable parity chunks that agree with each other on the
//! missing ones, so a decoded chunk is always a version that was fully written (the parity's vector names it).
//! Too few: [`Undecodable`], which the caller turns into a clear error, never bytes.
//!
//! Invariant: [`plan_row`] never selects chunks whose versions disagree, so the Reed–Solomon decode of its
//! selection yields, for every data chunk `j`, exactly the bytes of version `data_versions[j]` of chunk `j`.

/// What a read found of one chunk of a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Found {
    /// The server did not answer (or its answer was not about this chunk).
    Unreachable,
    /// The chunk's bytes do not match its record (a write that did not finish, or rot): it is missing, but its
    /// server answers, so it can be repaired. `version` is its record's (0 for none or a damaged record).
    Damaged { version: u64 },
    /// The chunk's bytes match its record. `parity_of` is empty for a data chunk (and for a parity chunk never
    /// written, version 0, which encodes all-zero data at version 0).
    Intact { version: u64, parity_of: Vec<u64> },
}

impl Found {
    /// The record's version (what a compare-and-set write must expect), if the server answered.
    pub(crate) fn version(&self) -> Option<u64> {
        match self {
            Found::Unreachable => None,
            Found::Damaged { version } | Found::Intact { version, .. } => Some(*version),
        }
    }
}

/// How to decode a row, and what to repair once it is decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RowPlan {
    /// Per chunk (`k + m`): feed it to the decoder.
    pub use_chunk: Vec<bool>,
    /// The version of each of the `k` data chunks in the decoded row.
    pub data_versions: Vec<u64>,
    /// Chunks whose server answered but whose bytes are not the decoded row's: damaged data chunks, and parity
    /// chunks damaged or computed from other data versions. Rewriting them from the decoded row repairs the row.
    pub repair: Vec<usize>,
}

/// Why a row cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Undecodable {
    /// Intact data chunks plus the most parity chunks that agree with them and each other.
    pub consistent: usize,
    pub needed: usize,
    pub torn: bool,
}

impl std::fmt::Display for Undecodable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} consistent chunks of the {} needed", self.consistent, self.needed)?;
        if self.torn {
            write!(f, " (some chunks are from writes that did not finish)")?;
        }
        Ok(())
    }
}

/// The vector a parity chunk stands for: a never-written parity chunk (version 0) encodes the all-zero data
/// chunks of version 0.
pub(crate) fn vector_of(k: usize, version: u64, parity_of: &[u64]) -> Option<Vec<u64>> {
    if version == 0 && parity_of.is_empty() {
        return Some(vec![0; k]);
    }
    (parity_of.len() == k).then(|| parity_of.to_vec())
}

/// Plans the decode of one row of `k` data and `m` parity chunks from what was found of each (`found.len() ==
/// k + m`, data first).
pub(crate) fn plan_row(k: usize, m: usize, found: &[Found]) -> Result<RowPlan, Undecodable> {
    plan_row_cut(k, m, found, k)
}

/// [`plan_row`] for a row whose data chunks from `cut` on lie wholly at or past the file's end: zeros whatever a
/// parity names for them (§16: a truncate drops their records, version 0, before it rewrites the row's parity),
/// so never [`outdated`].
pub(crate) fn plan_row_cut(k: usize, m: usize, found: &[Found], cut: usize) -> Result<RowPlan, Undecodable> {
    assert_eq!(found.len(), k + m, "one finding per chunk");
    let newest = newest_named(k, &found[k..], cut);
    let data: Vec<Option<u64>> = found[..k]
        .iter()
        .zip(&newest)
        .map(|(f, &newest)| match f {
            Found::Intact { version, .. } if !is_outdated(f, newest) => Some(*version),
            _ => None, // not found, damaged, or outdated (see `outdated`)
        })
        .collect();
    let survivors = data.iter().filter(|d| d.is_some()).count();
    let missing = k - survivors;
    // Intact parity chunks whose vector agrees with every surviving data chunk and names the newest version of
    // every missing one: a parity naming an older version of a missing chunk than another parity does would decode
    // bytes a later write replaced (ec_sim.rs: a reader got an acknowledged write's chunk back as it was before).
    let mut usable: Vec<(usize, Vec<u64>)> = Vec::new();
    for (p, f) in found[k..].iter().enumerate() {
        if let Found::Intact { version, parity_of } = f
            && let Some(v) = vector_of(k, *version, parity_of)
            && data.iter().zip(&v).zip(&newest).all(|((d, pv), n)| d.map_or(pv >= n, |d| d == *pv))
        {
            usable.push((k + p, v));
        }
    }
    // Usable parity chunks that also agree with each other (on the missing data chunks): the largest group, the
    // newest (greatest vector) among equals.
    let mut best: Option<(usize, &Vec<u64>)> = None;
    for (_, v) in &usable {
        let n = usable.iter().filter(|(_, w)| w == v).count();
        if best.is_none_or(|(bn, bv)| n > bn || (n == bn && v > bv)) {
            best = Some((n, v));
        }
    }
    let torn = found.iter().any(|f| matches!(f, Found::Damaged { .. }))
        || found[k..].iter().any(|f| matches!(f, Found::Intact { .. })) && usable.len() < m;
    let data_versions: Vec<u64> = match best {
        _ if missing == 0 => data.iter().map(|d| d.expect("all present")).collect(),
        Some((n, v)) if n >= missing => v.clone(),
        _ => {
            let consistent = survivors + best.map_or(0, |(n, _)| n);
            return Err(Undecodable { consistent, needed: k, torn });
        }
    };
    let mut use_chunk: Vec<bool> = data.iter().map(|d| d.is_some()).collect();
    use_chunk.resize(k + m, false);
    let mut take = missing;
    for (i, v) in &usable {
        if take > 0 && *v == data_versions {
            use_chunk[*i] = true;
            take -= 1;
        }
    }
    let repair = to_repair(k, found, &data, &data_versions);
    // A chunk decoded comes back at the newest version named for it, never an older content (§17).
    weft_rpc::invariant!(
        (0..k).all(|j| use_chunk[j] || data_versions[j] >= newest[j]),
        "decoded {data_versions:?} below the newest named {newest:?}"
    );
    Ok(RowPlan { use_chunk, data_versions, repair })
}

/// The chunks a decode planned with `data` (the surviving data chunks' versions) and `data_versions` leaves to
/// rewrite: damaged ones, outdated data chunks, and parity whose vector is not the row's.
fn to_repair(k: usize, found: &[Found], data: &[Option<u64>], data_versions: &[u64]) -> Vec<usize> {
    let fine = |i: usize, f: &Found| match f {
        Found::Unreachable => true, // nothing to write it to
        Found::Damaged { .. } => false,
        Found::Intact { .. } if i < k => data[i].is_some(),
        Found::Intact { version, parity_of } => vector_of(k, *version, parity_of).is_some_and(|v| v == data_versions),
    };
    found.iter().enumerate().filter(|(i, f)| !fine(*i, f)).map(|(i, _)| i).collect()
}

/// Per data chunk: found intact, but below a version an intact parity chunk names for it. It missed a write whose
/// new bytes are only in that parity (its server was out of reach, or the chunk stale and left out), so it is
/// outdated: missing, not a survivor, even to a reader or writer whose stale view missed the mark (ec_sim.rs: a
/// writer with such a view overwrote an outdated chunk in place and a heal then took it for current, losing an
/// acknowledged write). Versions only move up (§17), so a lower version is never the newer content.
pub(crate) fn outdated(k: usize, found: &[Found], cut: usize) -> Vec<bool> {
    let newest = newest_named(k, &found[k..], cut);
    found[..k].iter().zip(newest).map(|(f, n)| is_outdated(f, n)).collect()
}

fn is_outdated(f: &Found, newest: u64) -> bool {
    matches!(f, Found::Intact { version, .. } if *version < newest)
}

/// Per data chunk, the highest version an intact parity chunk of `parity` names for it (0 for none): its newest
/// content, since versions only move up. Chunks from `cut` on (wholly past the file's end: zeros, §16) get 0.
pub(crate) fn newest_named(k: usize, parity: &[Found], cut: usize) -> Vec<u64> {
    let mut named = vec![0u64; k];
    for f in parity {
        if let Found::Intact { version, parity_of } = f
            && let Some(v) = vector_of(k, *version, parity_of)
        {
            named.iter_mut().zip(&v).take(cut).for_each(|(n, v)| *n = (*n).max(*v));
        }
    }
    named
}

/// Names each data chunk of `unreached` (changed by a write that could not write it: out of reach, or its
/// compare-and-set lost with its server) at a fresh [`unreachable_version`] in `versions`, the row's data versions
/// its parity will name.
pub(crate) fn rename_unreached(versions: &mut [u64], unreached: &[usize], parity: &[Found], random: u64) {
    for &j in unreached {
        versions[j] = unreachable_version(j, parity, random.wrapping_add(j as u64));
    }
}

/// [`outdated`] data chunks shown as what they are to a writer: damaged (missing, and rewritten from the decoded
/// row at a version above every one named, compare-and-set from their record).
pub(crate) fn outdated_as_damaged(k: usize, found: &mut [Found], cut: usize) {
    for (j, outdated) in outdated(k, found, cut).into_iter().enumerate() {
        if outdated && let Some(version) = found[j].version() {
            found[j] = Found::Damaged { version };
        }
    }
}

/// The version a compare-and-set write of data chunk `j` sets: above its record's `current` and above every
/// version of `j` a surviving parity chunk names, so no parity chunk can ever vouch for bytes it was not
/// computed from (a version is never reused, even after a damaged record read as 0).
pub(crate) fn next_data_version(j: usize, current: u64, found_parity: &[Found]) -> u64 {
    let named = found_parity
        .iter()
        .filter_map(|f| match f {
            Found::Intact { parity_of, .. } => parity_of.get(j).copied(),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let next = current.max(named).saturating_add(1);
    // Compare-and-set moves a chunk only up, past every version a parity names for it (§17).
    weft_rpc::invariant!(next > current && next > named || next == u64::MAX, "chunk {j}: version {next} not above");
    next
}

/// How far above every version named for it a write puts a data chunk it changes but cannot write
/// ([`unreachable_version`]): the versions its server may hold that no parity names are each one compare-and-set
/// write above the last named one, never this many.
pub(crate) const UNREACHABLE_GAP: u64 = 1 << 24;

/// The version a write names for data chunk `j` whose bytes it changes but cannot write (its server unreachable,
/// or the chunk stale and left out): its new bytes live only in the parity, and its server may hold versions no
/// surviving parity names (writes whose parity never landed). No compare-and-set on the chunk vouches for the
/// choice, so it is far above every named version ([`UNREACHABLE_GAP`]) and random below the next gap (`random`,
/// any value): it names no bytes on that server, nor, but with a chance of one in 2^24, those of another writer
/// racing on the same row from the same parity (docs/format.md §17, "A version names one content").
pub(crate) fn unreachable_version(j: usize, found_parity: &[Found], random: u64) -> u64 {
    let named_above = next_data_version(j, 0, found_parity);
    let v = named_above.saturating_add(UNREACHABLE_GAP).saturating_add(random % UNREACHABLE_GAP);
    // A version names one content: never one a parity names, nor one a compare-and-set write reaches from them.
    weft_rpc::invariant!(v >= named_above.saturating_add(UNREACHABLE_GAP), "chunk {j}: unreachable version {v}");
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ec_codec::Codec;

    /// A seeded xorshift.
    fn bytes(seed: u64, n: usize) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    const LEN: usize = 64;

    /// The content of data chunk `j` at version `v` (version 0 is zeros, as never written).
    fn content(j: usize, v: u64) -> Vec<u8> {
        if v == 0 { vec![0; LEN] } else { bytes(1000 * j as u64 + v, LEN) }
    }

    /// One chunk as stored: its bytes, version, and (parity) vector; `torn` = bytes do not match the record.
    #[derive(Clone, Debug)]
    struct Chunk {
        bytes: Vec<u8>,
        version: u64,
        parity_of: Vec<u64>,
        torn: bool,
    }

    /// A row as the data servers hold it.
    #[derive(Clone, Debug)]
    struct Row {
        k: usize,
        chunks: Vec<Chunk>,
    }

    impl Row {
        fn new(k: usize, m: usize) -> Row {
            let zero = Chunk { bytes: vec![0; LEN], version: 0, parity_of: vec![], torn: false };
            Row { k, chunks: vec![zero; k + m] }
        }

        fn parity_for(&self, codec: &Codec, versions: &[u64]) -> Vec<Vec<u8>> {
            let data: Vec<Vec<u8>> = versions.iter().enumerate().map(|(j, &v)| content(j, v)).collect();
            let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
            codec.encode(&refs)
        }

        /// Reads with the chunks in `lost` unreachable.
        fn found(&self, lost: &[bool]) -> Vec<Found> {
            self.chunks
                .iter()
                .zip(lost)
                .map(|(c, &l)| match (l, c.torn) {
                    (true, _) => Found::Unreachable,
                    (false, true) => Found::Damaged { version: c.version },
                    (false, false) => Found::Intact { version: c.version, parity_of: c.parity_of.clone() },
                })
                .collect()
        }

        /// Plans and decodes; checks every decoded data chunk is exactly the content of the version the plan
        /// names. Returns the plan's versions, or None when undecodable.
        fn check_decode(&self, codec: &Codec, m: usize, lost: &[bool]) -> Option<Vec<u64>> {
            let k = self.k;
            let plan = match plan_row(k, m, &self.found(lost)) {
                Ok(p) => p,
                Err(u) => {
                    assert!(u.consistent < k, "undecodable with {} consistent of {k}", u.consistent);
                    return None;
                }
            };
            let mut shards: Vec<Option<Vec<u8>>> = self
                .chunks
                .iter()
                .zip(&plan.use_chunk)
                .map(|(c, &u)| {
                    if u {
                        assert!(!c.torn, "a torn chunk is never used");
                        Some(c.bytes.clone())
                    } else {
                        None
                    }
                })
                .collect();
            assert_eq!(plan.use_chunk.iter().filter(|u| **u).count(), k, "exactly k chunks used");
            codec.reconstruct(&mut shards).unwrap();
            for (j, s) in shards.iter().take(k).enumerate() {
                assert_eq!(
                    s.as_ref().unwrap(),
                    &content(j, plan.data_versions[j]),
                    "chunk {j} of {self:?}, lost {lost:?}"
                );
            }
            // Repairs: every chunk that answered and is not the decoded row's.
            for (i, c) in self.chunks.iter().enumerate() {
                let stale = c.torn
                    || (i >= k
                        && c.parity_of != plan.data_versions
                        && !(c.version == 0 && plan.data_versions.iter().all(|&v| v == 0)));
                assert_eq!(plan.repair.contains(&i), !lost[i] && stale, "repair of chunk {i}: {plan:?} {self:?}");
            }
            Some(plan.data_versions)
        }

        /// Every set of lost chunks: decoding either fails or yields exact versions.
        fn check_every_loss(&self, codec: &Codec, m: usize) -> usize {
            let n = self.k + m;
            let mut decoded = 0;
            for mask in 0u32..1 << n {
                let lost: Vec<bool> = (0..n).map(|i| mask & (1 << i) != 0).collect();
                if self.check_decode(codec, m, &lost).is_some() {
                    decoded += 1;
                }
            }
            decoded
        }
    }

    /// The steps of one writer's RMW of data chunk `j` to version `v`: its data chunk, then each parity chunk.
    /// `torn_after` stops after that many chunk writes, the last one left torn (bytes written, record not).
    fn write_steps(row: &mut Row, codec: &Codec, m: usize, j: usize, steps: usize, torn_last: bool) {
        let k = row.k;
        let mut versions: Vec<u64> = (0..k).map(|i| row.chunks[i].version).collect();
        versions[j] += 1;
        let parity = row.parity_for(codec, &versions);
        for s in 0..steps.min(1 + m) {
            let torn = torn_last && s + 1 == steps;
            let c = &mut row.chunks[if s == 0 { j } else { k + s - 1 }];
            if s == 0 {
                c.bytes = content(j, versions[j]);
                // A torn write leaves new bytes under the old record.
                if !torn {
                    c.version = versions[j];
                }
            } else {
                c.bytes = parity[s - 1].clone();
                if !torn {
                    c.version += 1;
                    c.parity_of = versions.clone();
                }
            }
            c.torn = torn;
        }
    }

    fn consistent_row(k: usize, m: usize, codec: &Codec, versions: &[u64]) -> Row {
        let mut row = Row::new(k, m);
        for (j, &v) in versions.iter().enumerate() {
            row.chunks[j] = Chunk { bytes: content(j, v), version: v, parity_of: vec![], torn: false };
        }
        for (p, bytes) in row.parity_for(codec, versions).into_iter().enumerate() {
            row.chunks[k + p] = Chunk { bytes, version: 5, parity_of: versions.to_vec(), torn: false };
        }
        row
    }

    fn binom(n: usize, r: usize) -> usize {
        (0..r).fold(1, |acc, i| acc * (n - i) / (i + 1))
    }

    fn every_loss_of_a_consistent_row_decodes(k: usize, m: usize) {
        let codec = Codec::new(k, m).unwrap();
        let row = consistent_row(k, m, &codec, &(1..=k as u64).collect::<Vec<_>>());
        let decodable: usize = (0..=m).map(|lost| binom(k + m, lost)).sum();
        assert_eq!(row.check_every_loss(&codec, m), decodable);
        // A never-written row (no records, zeros) decodes too.
        assert_eq!(Row::new(k, m).check_every_loss(&codec, m), decodable);
    }

    #[test]
    fn every_loss_of_a_consistent_row_decodes_4_2_and_2_1() {
        every_loss_of_a_consistent_row_decodes(4, 2);
        every_loss_of_a_consistent_row_decodes(2, 1);
    }

    /// A write torn at every step (and stopped cleanly at every step), then every set of chunks lost: each
    /// decoded chunk is exactly a version that was written (old or new), never a mix.
    fn torn_writes(k: usize, m: usize) {
        let codec = Codec::new(k, m).unwrap();
        for j in 0..k {
            for steps in 0..=1 + m {
                for torn_last in [false, true] {
                    if steps == 0 && torn_last {
                        continue;
                    }
                    let mut row = consistent_row(k, m, &codec, &vec![3; k]);
                    write_steps(&mut row, &codec, m, j, steps, torn_last);
                    let decoded = row.check_every_loss(&codec, m);
                    // With nothing lost the row always decodes (data chunks intact, or one torn and parity
                    // agreeing with the old version).
                    assert!(decoded >= 1 || (torn_last && steps > 1), "j {j} steps {steps} torn {torn_last}");
                    if steps == 1 + m && !torn_last {
                        // A finished write is a consistent row: every loss up to m decodes, to the new bytes.
                        let all: usize = (0..=m).map(|l| binom(k + m, l)).sum();
                        assert_eq!(decoded, all);
                    }
                }
            }
        }
    }

    #[test]
    fn torn_writes_never_decode_to_a_mix_4_2() {
        torn_writes(4, 2);
    }

    #[test]
    fn torn_writes_never_decode_to_a_mix_2_1() {
        torn_writes(2, 1);
    }

    /// The client protocol of one writer of data chunk `j`, as steps against a shared row with compare-and-set:
    /// read parity versions, read data versions, write its data chunk, write each parity chunk. A failed CAS stops
    /// the writer (the real one retries; its retry is a new writer here).
    #[derive(Clone, Debug)]
    struct Writer {
        j: usize,
        pc: usize,
        parity_seen: Vec<u64>,
        data_seen: Vec<u64>,
        my_version: u64,
        failed: bool,
    }

    impl Writer {
        fn new(j: usize) -> Writer {
            Writer { j, pc: 0, parity_seen: vec![], data_seen: vec![], my_version: 0, failed: false }
        }

        fn done(&self, m: usize) -> bool {
            self.failed || self.pc == 3 + m
        }

        fn step(&mut self, row: &mut Row, codec: &Codec, m: usize) {
            let k = row.k;
            match self.pc {
                0 => self.parity_seen = row.chunks[k..].iter().map(|c| c.version).collect(),
                1 => self.data_seen = row.chunks[..k].iter().map(|c| c.version).collect(),
                2 => {
                    let c = &mut row.chunks[self.j];
                    if c.version != self.data_seen[self.j] {
                        self.failed = true;
                        return;
                    }
                    let found: Vec<Found> = row.found(&vec![false; k + m])[k..].to_vec();
                    self.my_version = next_data_version(self.j, self.data_seen[self.j], &found);
                    let c = &mut row.chunks[self.j];
                    c.version = self.my_version;
                    c.bytes = content(self.j, self.my_version);
                }
                s => {
                    let p = s - 3;
                    let mut versions = self.data_seen.clone();
                    versions[self.j] = self.my_version;
                    let parity = row.parity_for(codec, &versions);
                    let c = &mut row.chunks[k + p];
                    if c.version != self.parity_seen[p] {
                        self.failed = true;
                        return;
                    }
                    c.version += 1;
                    c.parity_of = versions;
                    c.bytes = parity[p].clone();
                }
            }
            self.pc += 1;
        }
    }

    /// Every interleaving of two writers of different data chunks of one row: at every point every loss decodes
    /// to exact versions or fails; when both finish, data and parity agree (no loss of up to m fails).
    fn concurrent(k: usize, m: usize) {
        let codec = Codec::new(k, m).unwrap();
        let steps = 3 + m;
        let all: usize = (0..=m).map(|l| binom(k + m, l)).sum();
        let mut both_finished = 0;
        // An interleaving is a choice of which of the 2·steps slots belong to writer A.
        for mask in 0u32..1 << (2 * steps) {
            if mask.count_ones() as usize != steps {
                continue;
            }
            let mut row = consistent_row(k, m, &codec, &vec![1; k]);
            let mut w = [Writer::new(0), Writer::new(k - 1)];
            for slot in 0..2 * steps {
                let who = usize::from(mask & (1 << slot) == 0);
                if !w[who].done(m) {
                    w[who].step(&mut row, &codec, m);
                    row.check_every_loss(&codec, m);
                }
            }
            if !w[0].failed && !w[1].failed {
                both_finished += 1;
                assert_eq!(row.check_every_loss(&codec, m), all, "both writers finished, row must be consistent");
            }
        }
        assert!(both_finished > 0);
    }

    #[test]
    fn concurrent_writers_4_2() {
        concurrent(4, 2);
    }

    #[test]
    fn concurrent_writers_2_1() {
        concurrent(2, 1);
    }

    #[test]
    fn parity_vouching_for_another_version_is_not_used() {
        // Data chunk 0 at version 2, parity computed from version 1: losing chunk 1 must not decode.
        let f = vec![
            Found::Intact { version: 2, parity_of: vec![] },
            Found::Unreachable,
            Found::Intact { version: 4, parity_of: vec![1, 1] },
        ];
        let e = plan_row(2, 1, &f).unwrap_err();
        assert_eq!((e.consistent, e.needed, e.torn), (1, 2, true));
        // All data present: the stale parity is named for repair.
        let f = vec![
            Found::Intact { version: 2, parity_of: vec![] },
            Found::Intact { version: 1, parity_of: vec![] },
            Found::Intact { version: 4, parity_of: vec![1, 1] },
        ];
        assert_eq!(plan_row(2, 1, &f).unwrap().repair, vec![2]);
        assert_eq!(next_data_version(0, 0, &f[2..]), 2);
    }

    fn intact(version: u64, parity_of: &[u64]) -> Found {
        Found::Intact { version, parity_of: parity_of.to_vec() }
    }

    #[test]
    fn an_outdated_data_chunk_counts_as_missing_unless_past_the_end() {
        // Chunk 1 missed the write that parity 2 names (version 5); parity 3 is older still.
        let f = vec![intact(1, &[]), intact(1, &[]), intact(9, &[1, 5]), intact(8, &[1, 1])];
        assert_eq!(outdated(2, &f, 2), vec![false, true]);
        let plan = plan_row(2, 2, &f).unwrap();
        assert_eq!(plan.data_versions, vec![1, 5], "decoded at the version the newer parity names");
        assert_eq!(plan.use_chunk, vec![true, false, true, false]);
        assert_eq!(plan.repair, vec![1, 3]);
        let mut w = f.clone();
        outdated_as_damaged(2, &mut w, 2);
        assert_eq!(w[1], Found::Damaged { version: 1 });
        // Wholly past the file's end, chunk 1 is zeros at version 0 whatever the parity names (§16).
        let cut = vec![intact(1, &[]), intact(0, &[]), intact(9, &[1, 5]), intact(8, &[1, 5])];
        assert_eq!(plan_row_cut(2, 2, &cut, 1).unwrap().data_versions, vec![1, 0]);
        assert_eq!(plan_row(2, 2, &cut).unwrap().data_versions, vec![1, 5]);
    }

    #[test]
    fn a_missing_chunk_decodes_only_at_the_newest_version_a_parity_names() {
        // Two parity chunks agree on an older version of chunk 1 than the third names: the larger group is older.
        let f = vec![intact(2, &[]), Found::Unreachable, intact(4, &[2, 3]), intact(4, &[2, 3]), intact(5, &[2, 7])];
        let plan = plan_row(2, 3, &f).unwrap();
        assert_eq!(plan.data_versions, vec![2, 7]);
        assert_eq!(plan.use_chunk, vec![true, false, false, false, true]);
        // Without the newer one, the older group is the newest named: used.
        let plan = plan_row(2, 2, &f[..4]).unwrap();
        assert_eq!(plan.data_versions, vec![2, 3]);
        // A chunk whose compare-and-set was lost is renamed far above every named version.
        let mut versions = vec![2, 8];
        rename_unreached(&mut versions, &[1], &f[2..], 0);
        assert!(versions[1] > 7 + UNREACHABLE_GAP && versions[0] == 2, "{versions:?}");
    }
}
