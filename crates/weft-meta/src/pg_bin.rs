//! Where PostgreSQL's programs are, for what starts a server of its own (the PgStore tests; `weft up --meta
//! postgres`, through weft-launch).

use std::path::PathBuf;

/// The directory holding `initdb`, `postgres` and `pg_ctl`: `WEFT_PG_BINDIR`, else `pg_config --bindir`, else the
/// newest `/usr/lib/postgresql/*/bin` (Debian's layout). The error says how to install it.
pub fn bindir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("WEFT_PG_BINDIR") {
        let dir = PathBuf::from(dir);
        return if dir.join("initdb").exists() {
            Ok(dir)
        } else {
            Err(format!("WEFT_PG_BINDIR={} holds no initdb", dir.display()))
        };
    }
    let from_pg_config = std::process::Command::new("pg_config").arg("--bindir").output().ok();
    if let Some(out) = from_pg_config.filter(|o| o.status.success()) {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if dir.join("initdb").exists() {
            return Ok(dir);
        }
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, bin): &(u32, PathBuf)| bin.join("initdb").exists())
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).ok_or_else(|| {
        "PostgreSQL is not installed (no initdb): run `make deps` (Debian's postgresql package) or set \
         WEFT_PG_BINDIR to the directory holding initdb and postgres"
            .to_string()
    })
}
