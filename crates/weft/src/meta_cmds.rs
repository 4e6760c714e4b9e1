//! `weft meta backup | restore | migrate | check`: moving, keeping and checking a namespace (docs/format.md §29).
//! The copying is `weft_meta::copy`'s, the check `weft_meta::namespace::check_tree`; this is the command line around
//! them.

use std::path::Path;

use anyhow::{Context, Result};
use weft_meta::copy::{self, Digest, StoreSpec};

use crate::commands::{connect, print_json};

fn report(verb: &str, to: &str, d: &Digest, json: bool) -> Result<()> {
    if json {
        return print_json(&serde_json::json!({
            "to": to, "inodes": d.inodes, "entries": d.dirents, "xattrs": d.xattrs, "stale_entries": d.stale,
            "orphans": d.orphans, "servers": d.servers, "crc32c": format!("{:08x}", d.crc),
        }));
    }
    println!(
        "{verb} {to}: {} inodes, {} entries, {} xattrs, {} stale entries, {} orphans, {} data servers \
         (crc32c {:08x}; read back and compared)",
        d.inodes, d.dirents, d.xattrs, d.stale, d.orphans, d.servers, d.crc
    );
    Ok(())
}

/// `weft meta backup DIR`: the running service writes the copy on its host.
pub async fn backup(spec: &str, dir: &Path, json: bool) -> Result<()> {
    let dir = std::path::absolute(dir).with_context(|| format!("making {} absolute", dir.display()))?;
    let shown = dir.display().to_string();
    let c = connect(spec).await?;
    let r = c.meta_backup(&shown).await.with_context(|| format!("backing the namespace up into {shown}"))?;
    let d = Digest::from(r);
    report("backed up into", &shown, &d, json)
}

/// Opens both stores and copies, off the async runtime (the stores block).
async fn copy_between(from: StoreSpec, to: StoreSpec) -> Result<Digest> {
    tokio::task::spawn_blocking(move || {
        let source = from.open().with_context(|| format!("opening the source {from}"))?;
        let target = to.open().with_context(|| format!("opening the target {to}"))?;
        copy::copy_store(&source, &target).with_context(|| format!("copying {from} into {to}"))
    })
    .await
    .context("the copy's task failed")?
}

/// `weft meta restore BACKUP --to SPEC`.
pub async fn restore(backup: &Path, to: &str, json: bool) -> Result<()> {
    let store_file = backup.join(weft_meta::redb_store::STORE_FILE);
    if !store_file.is_file() {
        anyhow::bail!("{} holds no backup ({} is missing)", backup.display(), store_file.display());
    }
    let to: StoreSpec = to.parse()?;
    let shown = to.to_string();
    let d = copy_between(StoreSpec::Redb(backup.to_path_buf()), to).await?;
    report("restored into", &shown, &d, json)
}

/// An embedded store `spec` names must exist: opening one makes it, and an empty new store is not what was meant.
fn existing(spec: &StoreSpec) -> Result<()> {
    if let StoreSpec::Redb(dir) = spec {
        let store_file = dir.join(weft_meta::redb_store::STORE_FILE);
        anyhow::ensure!(
            store_file.is_file(),
            "{} holds no embedded store ({} is missing)",
            dir.display(),
            store_file.display()
        );
    }
    Ok(())
}

/// `weft meta migrate --from SPEC --to SPEC`.
pub async fn migrate(from: &str, to: &str, json: bool) -> Result<()> {
    let (from, to): (StoreSpec, StoreSpec) = (from.parse()?, to.parse()?);
    existing(&from)?;
    let shown = to.to_string();
    let d = copy_between(from, to).await?;
    report("migrated into", &shown, &d, json)
}

/// `weft meta check --store SPEC`: the tree's invariants on one snapshot of the store.
pub async fn check(store: &str, json: bool) -> Result<()> {
    let spec: StoreSpec = store.parse()?;
    existing(&spec)?;
    let shown = spec.to_string();
    let counted = tokio::task::spawn_blocking(move || {
        let s = spec.open().with_context(|| format!("opening {spec}"))?;
        weft_meta::MetaStore::read(&s, |t| weft_meta::namespace::check_tree(t))
            .with_context(|| format!("checking the namespace in {spec}"))
    })
    .await
    .context("the check's task failed")??;
    if json {
        return print_json(&serde_json::json!({
            "store": shown, "ok": true, "inodes": counted.inodes, "dirs": counted.dirs, "entries": counted.entries,
        }));
    }
    println!(
        "{shown}: the namespace is a tree: {} inodes ({} directories), {} entries, every link count and parent as the \
         tree gives",
        counted.inodes, counted.dirs, counted.entries
    );
    Ok(())
}
