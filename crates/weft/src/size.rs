//! Byte sizes on the command line: `4096`, `4K`, `1M`, `2G`, `1T` (binary multiples).

use anyhow::{Result, bail};

pub fn parse(s: &str) -> Result<u64> {
    weft_launch::parse_bytes(s).map_or_else(|| bail!("{s:?} is not a size (examples: 4096, 64K, 1M, 2G)"), Ok)
}
