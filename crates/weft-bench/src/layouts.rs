//! Layouts the redundancy benchmarks measure (`--layout plain,ec4+2,mirror2`): parsing, the directory each one's
//! files are created in (set up with the `SetLayout` call `weft setstripe --ec/--mirror` makes), the bytes of a
//! file written with a seeded pattern, and which data servers hold a file's chunks.

use std::path::Path;

use anyhow::{Context, Result, bail};
use weft_client::Client;
use weft_proto::DataRedundancy;

/// One layout to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayoutChoice(pub DataRedundancy);

impl LayoutChoice {
    pub const PLAIN: LayoutChoice = LayoutChoice(DataRedundancy::Plain);

    /// `plain`, `ecK+M` (also `ec K+M`, `ec:K+M`), `mirrorN`.
    pub fn parse(s: &str) -> Option<LayoutChoice> {
        let s = s.trim().to_ascii_lowercase();
        let r = if s == "plain" {
            DataRedundancy::Plain
        } else if let Some(rest) = s.strip_prefix("ec") {
            let (k, m) = rest.trim_start_matches([' ', ':']).split_once('+')?;
            DataRedundancy::Ec { k: k.trim().parse().ok()?, m: m.trim().parse().ok()? }
        } else if let Some(n) = s.strip_prefix("mirror") {
            DataRedundancy::Mirror { n: n.trim_start_matches([' ', ':']).trim().parse().ok()? }
        } else {
            return None;
        };
        r.validate().ok()?;
        Some(LayoutChoice(r))
    }

    /// Parses `--layout`: a comma-separated list, each layout once.
    pub fn parse_list(list: &str) -> Result<Vec<LayoutChoice>> {
        let v = crate::parse_list(list, LayoutChoice::parse)
            .with_context(|| format!("--layout {list}: expected a list like plain,ec4+2,mirror2"))?;
        for (i, l) in v.iter().enumerate() {
            if v[..i].contains(l) {
                bail!("--layout {list}: {} is listed twice", l.name());
            }
        }
        Ok(v)
    }

    /// The name in results: `plain`, `ec4+2`, `mirror2`.
    pub fn name(self) -> String {
        match self.0 {
            DataRedundancy::Ec { k, m } => format!("ec{k}+{m}"),
            DataRedundancy::Mirror { n } => format!("mirror{n}"),
            _ => "plain".to_string(),
        }
    }

    pub fn is_plain(self) -> bool {
        self.0 == DataRedundancy::Plain
    }

    /// Data servers one file uses (`None`: plain, every server).
    pub fn width(self) -> Option<u32> {
        self.0.width()
    }

    /// Servers of a layout that may be lost with every byte still readable.
    pub fn tolerates(self) -> u32 {
        self.0.tolerates()
    }

    /// The directory this layout's files are created in: `""` (the root, whose default policy is plain: the
    /// paths of the benches from before `--layout`) for plain, else `/bench-<name>`, made here if missing and
    /// given the layout with `stripe_unit` bytes per chunk.
    pub async fn prepare_dir(self, client: &Client, stripe_unit: u32) -> Result<String> {
        if self.is_plain() {
            return Ok(String::new());
        }
        let dir = format!("/bench-{}", self.name());
        let attr = match client.resolve(&dir).await {
            Ok(a) => a,
            Err(_) => client.mkdir(weft_proto::ROOT_INO, dir.trim_start_matches('/'), 0o755).await?,
        };
        client
            .set_layout_with(attr.ino, stripe_unit, 0, self.0)
            .await
            .with_context(|| format!("setting layout {} on {dir}", self.name()))?;
        Ok(dir)
    }
}

/// Word `w` (bytes `[8w, 8w + 8)`) of the seeded pattern of file `seed`: cheap, and different per file and per
/// position, so a chunk put back in the wrong row or the wrong file does not read back equal.
fn pattern_word(seed: u64, w: u64) -> u64 {
    let x = w.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed.wrapping_mul(0xD1B5_4A32_D192_ED03);
    let x = (x ^ (x >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^ (x >> 32)
}

/// Byte `i` of the pattern of file `seed`.
pub fn pattern_byte(seed: u64, i: u64) -> u8 {
    pattern_word(seed, i / 8).to_le_bytes()[(i % 8) as usize]
}

/// Fills `buf` with the pattern of file `seed` from file offset `at`, a word at a time where aligned (filling a
/// few GiB must not be what a benchmark measures).
pub fn fill_pattern(seed: u64, at: u64, buf: &mut [u8]) {
    let head = (at.next_multiple_of(8) - at).min(buf.len() as u64) as usize;
    let (first, rest) = buf.split_at_mut(head);
    for (j, b) in first.iter_mut().enumerate() {
        *b = pattern_byte(seed, at + j as u64);
    }
    let base = at + head as u64;
    let mut words = rest.chunks_exact_mut(8);
    let mut n = 0u64;
    for c in &mut words {
        c.copy_from_slice(&pattern_word(seed, base / 8 + n).to_le_bytes());
        n += 1;
    }
    let tail_at = base + 8 * n;
    for (j, b) in words.into_remainder().iter_mut().enumerate() {
        *b = pattern_byte(seed, tail_at + j as u64);
    }
}

/// The first offset in `buf` (read from file offset `at`) that differs from the pattern of file `seed`.
pub fn pattern_mismatch(seed: u64, at: u64, buf: &[u8]) -> Option<u64> {
    let mut want = vec![0u8; buf.len()];
    fill_pattern(seed, at, &mut want);
    if want == buf {
        return None;
    }
    buf.iter().zip(&want).position(|(a, b)| a != b).map(|j| at + j as u64)
}

/// Bytes of chunk objects under a data server's root (`objects/xx/<16 hex digits>`, docs/format.md §5; the `.crc`
/// sidecars are not counted): what it stores of files' bytes.
pub fn object_bytes(root: &Path) -> u64 {
    let Ok(dirs) = std::fs::read_dir(root.join("objects")) else { return 0 };
    let mut total = 0u64;
    for d in dirs.flatten() {
        let Ok(files) = std::fs::read_dir(d.path()) else { continue };
        for f in files.flatten() {
            let name = f.file_name();
            let name = name.to_string_lossy();
            if name.len() == 16 && name.bytes().all(|c| c.is_ascii_hexdigit()) {
                total += f.metadata().map(|m| m.len()).unwrap_or(0);
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_parse_and_name() {
        let v = LayoutChoice::parse_list("plain, ec4+2,mirror2,EC 2+1").unwrap();
        let names: Vec<String> = v.iter().map(|l| l.name()).collect();
        assert_eq!(names, ["plain", "ec4+2", "mirror2", "ec2+1"]);
        assert_eq!(v[1].0, DataRedundancy::Ec { k: 4, m: 2 });
        assert_eq!((v[1].width(), v[1].tolerates()), (Some(6), 2));
        assert_eq!((v[0].width(), v[2].tolerates()), (None, 1));
        for bad in ["raid5", "ec4", "ec0+2", "mirror1", "mirror", "plain,plain", "ec4+2,ec 4+2"] {
            assert!(LayoutChoice::parse_list(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_pattern_differs_per_file_and_position() {
        let mut a = vec![0u8; 4096];
        fill_pattern(1, 8192, &mut a);
        // Unaligned starts and ends give the same bytes as the byte-at-a-time rule.
        for (at, len) in [(3u64, 21usize), (8, 16), (13, 3), (0, 0), (5, 1)] {
            let mut b = vec![0u8; len];
            fill_pattern(1, at, &mut b);
            let want: Vec<u8> = (0..len as u64).map(|j| pattern_byte(1, at + j)).collect();
            assert_eq!(b, want, "at {at} len {len}");
        }
        assert_eq!(pattern_mismatch(1, 8192, &a), None);
        assert_eq!(pattern_mismatch(2, 8192, &a).map(|o| o < 8192 + 64), Some(true));
        assert_eq!(pattern_mismatch(1, 0, &a).map(|o| o < 64), Some(true));
        a[100] ^= 1;
        assert_eq!(pattern_mismatch(1, 8192, &a), Some(8292));
    }
}
