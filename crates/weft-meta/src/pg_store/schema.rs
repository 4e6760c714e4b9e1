//! The PostgreSQL schema's versions and the migration steps between them (docs/format.md §26).
//!
//! Why a list of steps: a database written by an older build is brought up to date in order, one step per
//! version, inside one transaction (PostgreSQL's DDL is transactional), so a failed step changes nothing; a newer
//! database is refused rather than misread.

use super::pool::Conn;
use crate::error::MetaError;

/// The schema version this build writes.
pub const SCHEMA_VERSION: i32 = 1;

/// Step `i` migrates a database of version `i` to `i + 1`.
const STEPS: [&str; SCHEMA_VERSION as usize] = [STEP_1];

/// 0 → 1: the version 1 tables and sequences.
const STEP_1: &str = "
CREATE TABLE weft_inodes (ino bigint PRIMARY KEY, record bytea NOT NULL);
CREATE TABLE weft_dirents (
    parent bigint, name bytea, ino bigint NOT NULL, kind smallint NOT NULL, PRIMARY KEY (parent, name));
CREATE TABLE weft_servers (id bigint PRIMARY KEY, addr text NOT NULL);
CREATE TABLE weft_server_phases (id bigint PRIMARY KEY, phase smallint NOT NULL);
CREATE TABLE weft_orphans (ino bigint PRIMARY KEY, record bytea NOT NULL);
CREATE TABLE weft_xattrs (ino bigint, name bytea, value bytea NOT NULL, PRIMARY KEY (ino, name));
CREATE TABLE weft_stale (ino bigint, slot bigint, record bytea NOT NULL, PRIMARY KEY (ino, slot));
CREATE SEQUENCE weft_ino_seq AS bigint START 2 MINVALUE 2 NO CYCLE;
CREATE SEQUENCE weft_stale_seq AS bigint START 1 MINVALUE 1 NO CYCLE;
";

/// Serializes services migrating one database at once (`pg_advisory_xact_lock`'s key: "weft", issue 29).
const MIGRATION_LOCK: i64 = 0x7765_6674_0000_0029;

/// Brings the database to [`SCHEMA_VERSION`]; returns the version it found (0: empty).
pub(super) fn migrate(conn: &mut Conn) -> Result<i32, MetaError> {
    let pg = |e: tokio_postgres::Error| MetaError::Store(format!("migrating the schema: {}", super::describe(&e)));
    conn.begin("BEGIN ISOLATION LEVEL READ COMMITTED").map_err(|f| f.into_error())?;
    let found = (|| {
        conn.query("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).map_err(pg)?;
        conn.batch(
            "CREATE TABLE IF NOT EXISTS weft_schema (id smallint PRIMARY KEY CHECK (id = 0), version integer NOT NULL)",
        )
        .map_err(pg)?;
        let found = stored_version(conn)?;
        if found > SCHEMA_VERSION {
            return Err(MetaError::SchemaTooNew { found, supported: SCHEMA_VERSION });
        }
        if found < 0 {
            return Err(MetaError::Corrupt(format!("metadata database schema version {found}")));
        }
        for step in &STEPS[found as usize..] {
            conn.batch(step).map_err(pg)?;
        }
        conn.query(
            "INSERT INTO weft_schema (id, version) VALUES (0, $1) ON CONFLICT (id) DO UPDATE SET version = $1",
            &[&SCHEMA_VERSION],
        )
        .map_err(pg)?;
        Ok(found)
    })();
    match found {
        Ok(found) => {
            conn.commit().map_err(|f| f.into_error())?;
            Ok(found)
        }
        Err(e) => {
            conn.rollback();
            Err(e)
        }
    }
}

/// The version in `weft_schema` (0 without a row). The table must exist.
pub(super) fn stored_version(conn: &mut Conn) -> Result<i32, MetaError> {
    let rows = conn
        .query("SELECT version FROM weft_schema WHERE id = 0", &[])
        .map_err(|e| MetaError::Store(format!("reading the schema version: {}", super::describe(&e))))?;
    match rows.first() {
        Some(row) => row.try_get(0).map_err(|e| MetaError::Corrupt(format!("schema version: {e}"))),
        None => Ok(0),
    }
}
