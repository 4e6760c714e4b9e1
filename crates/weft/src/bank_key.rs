//! `weft key rotate --bank`: raises `key_generation` in the `[cache]` table of every config named, so each role,
//! once restarted, seals and opens the bank's items under a new bank key (docs/format.md §12). Items sealed under
//! the old key are then misses: a cold bank for a while, never a wrong byte.
//!
//! The files are edited as text (one line set or added under `[cache]`), so their comments and layout stay; every
//! file is read and checked before any is written, and each is replaced atomically (temporary file, rename).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// The `[cache]` table's `key_generation` in config `text` (0 when the table has none); `None` when the text has
/// no `[cache]` table.
pub fn bank_generation(text: &str) -> Result<Option<u32>> {
    let table: toml::Table = toml::from_str(text).context("not TOML")?;
    let Some(cache) = table.get("cache") else { return Ok(None) };
    let Some(cache) = cache.as_table() else { bail!("`cache` is not a table") };
    match cache.get("key_generation") {
        None => Ok(Some(0)),
        Some(v) => {
            let n = v.as_integer().and_then(|n| u32::try_from(n).ok());
            n.map(Some).context("`key_generation` is not a number from 0 to 2^32 - 1")
        }
    }
}

/// `text` with the `[cache]` table's `key_generation` set to `generation`: its line replaced, or added right after
/// the `[cache]` header. `None` when there is no `[cache]` header line.
pub fn with_bank_generation(text: &str, generation: u32) -> Option<String> {
    let line = format!("key_generation = {generation}");
    let mut out = Vec::new();
    let (mut in_cache, mut seen, mut done) = (false, false, false);
    for l in text.lines() {
        let t = l.trim();
        if t.starts_with('[') {
            if in_cache && !done {
                out.push(line.clone());
                done = true;
            }
            in_cache = t == "[cache]";
            seen |= in_cache;
            out.push(l.to_string());
            continue;
        }
        if in_cache && !done && t.split('=').next().map(str::trim) == Some("key_generation") {
            out.push(line.clone());
            done = true;
            continue;
        }
        out.push(l.to_string());
    }
    if in_cache && !done {
        out.push(line);
    }
    seen.then(|| out.join("\n") + "\n")
}

/// Rotates the bank key in every config of `files` to one new generation (one more than the highest found), so
/// all roles agree once restarted. Returns the new generation.
pub fn rotate(files: &[PathBuf]) -> Result<u32> {
    if files.is_empty() {
        bail!("name every config that has a [cache] table: cluster.toml, meta.toml, each dataN.toml");
    }
    let mut texts = Vec::new();
    let mut highest = 0;
    for f in files {
        let text = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        let generation = bank_generation(&text).with_context(|| format!("{}", f.display()))?;
        let Some(generation) = generation else { bail!("{} has no [cache] table: nothing to rotate", f.display()) };
        highest = highest.max(generation);
        texts.push(text);
    }
    let next = highest.checked_add(1).context("key_generation is at its largest value")?;
    for (f, text) in files.iter().zip(&texts) {
        let new = with_bank_generation(text, next).context("the [cache] header line went missing")?;
        assert_eq!(bank_generation(&new).ok().flatten(), Some(next), "the edited {} reads back", f.display());
        replace(f, &new)?;
    }
    Ok(next)
}

/// Writes `text` over `path` atomically (a temporary file beside it, same mode, synced, renamed).
fn replace(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("rotate.tmp");
    let mode = std::fs::metadata(path).with_context(|| format!("{}", path.display()))?.permissions();
    let mut f = std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    f.set_permissions(mode)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generation_is_set_or_added_and_nothing_else_changes() {
        let text = "# the cluster\nmds = \"a:1\"\n\n[cache]\nservers = [\"b:2\"] # daemons\nnamespace = 7\n\n[client]\nx = 1\n";
        assert_eq!(bank_generation(text).unwrap(), Some(0));
        let once = with_bank_generation(text, 1).unwrap();
        assert_eq!(bank_generation(&once).unwrap(), Some(1));
        assert!(once.contains("# the cluster") && once.contains("# daemons"), "comments stay: {once}");
        let cache: weft_cache::CacheConfig =
            toml::from_str::<toml::Table>(&once).unwrap()["cache"].clone().try_into().unwrap();
        assert_eq!((cache.key_generation, cache.namespace), (1, 7));
        let twice = with_bank_generation(&once, 2).unwrap();
        assert_eq!(bank_generation(&twice).unwrap(), Some(2));
        assert_eq!(twice.matches("key_generation").count(), 1, "replaced, not added again: {twice}");
        // [cache] last in the file, and a key named like it in another table untouched.
        let last = "[client]\nkey_generation_note = 1\n[cache]\nservers = []";
        let set = with_bank_generation(last, 5).unwrap();
        assert_eq!(bank_generation(&set).unwrap(), Some(5));
        assert!(set.contains("key_generation_note = 1"));
        assert_eq!(with_bank_generation("mds = \"a:1\"\n", 1), None);
        assert_eq!(bank_generation("mds = \"a:1\"\n").unwrap(), None);
        assert!(bank_generation("[cache]\nkey_generation = -1\n").is_err());
        assert!(bank_generation("[cache\n").is_err());
    }
}
