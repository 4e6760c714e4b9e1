//! The schema's migrations and the retry of conflicting transactions, on a real PostgreSQL server.

use std::sync::atomic::{AtomicU32, Ordering};

use super::*;
use crate::Inode;
use crate::pg_testing::{execute, fresh_url};
use weft_proto::FileKind;

fn dir_inode(ino: u64) -> Inode {
    Inode {
        ino,
        kind: FileKind::Dir,
        mode: 0o755,
        uid: 0,
        gid: 0,
        nlink: 2,
        size: 0,
        atime_ns: 0,
        mtime_ns: 0,
        ctime_ns: 0,
        parent: 1,
        layout: None,
        target: String::new(),
        rdev: 0,
        data_version: 0,
        sole_name: None,
    }
}

#[test]
fn an_empty_database_is_created_at_the_current_version_and_reopened_as_is() {
    let url = fresh_url();
    let store = PgStore::connect(&url).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    store.write(|t| t.put_inode(&dir_inode(5))).unwrap();
    drop(store);
    let again = PgStore::connect(&url).unwrap();
    assert_eq!(again.read(|t| t.get_inode(5)).unwrap(), Some(dir_inode(5)), "reopening migrates nothing away");
    assert_eq!(again.write(|t| t.next_ino()).unwrap(), 2, "the first inode number after the root's");
}

#[test]
fn a_version_0_database_is_migrated_in_order() {
    // Version 0 with its version table already there (a service that stopped before step 1 committed could not
    // leave this: the steps run in the same transaction; but a hand-made one can).
    let url = fresh_url();
    execute(
        &url,
        "CREATE TABLE weft_schema (id smallint PRIMARY KEY CHECK (id = 0), version integer NOT NULL); \
         INSERT INTO weft_schema VALUES (0, 0);",
    );
    let store = PgStore::connect(&url).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    assert_eq!(store.read(|t| t.count_inodes()).unwrap(), 0);
    assert_eq!(store.write(|t| t.next_stale_seq()).unwrap(), 1);
}

#[test]
fn a_newer_schema_is_refused_and_left_alone() {
    let url = fresh_url();
    drop(PgStore::connect(&url).unwrap());
    execute(&url, "UPDATE weft_schema SET version = 99");
    match PgStore::connect(&url) {
        Err(MetaError::SchemaTooNew { found: 99, supported: SCHEMA_VERSION }) => {}
        other => panic!("{other:?}"),
    }
    execute(&url, "UPDATE weft_schema SET version = 1");
    PgStore::connect(&url).unwrap();
}

#[test]
fn a_write_that_conflicts_with_another_services_runs_again() {
    let url = fresh_url();
    let (one, two) = (PgStore::connect(&url).unwrap(), PgStore::connect(&url).unwrap());
    one.write(|t| t.put_inode(&dir_inode(7))).unwrap();
    let runs = AtomicU32::new(0);
    let r: Result<u32, MetaError> = one.write(|t| {
        let run = runs.fetch_add(1, Ordering::SeqCst);
        let mut i = t.get_inode(7)?.unwrap();
        if run == 0 {
            // Another service changes the row this transaction read and commits first.
            two.write(|t2| t2.put_inode(&Inode { size: 100, ..dir_inode(7) })).unwrap();
        }
        i.nlink += 1;
        t.put_inode(&i)?;
        Ok(run)
    });
    assert_eq!(r.unwrap(), 1, "the second run committed");
    assert_eq!((one.stats().retries.get(), one.stats().gave_up.get()), (1, 0));
    let stored = two.read(|t| t.get_inode(7)).unwrap().unwrap();
    assert_eq!((stored.size, stored.nlink), (100, 3), "the retry saw the other service's write");
}

#[test]
fn a_failed_statement_is_never_committed_even_when_the_closure_swallows_it() {
    let store = PgStore::connect(&fresh_url()).unwrap();
    let r: Result<(), MetaError> = store.write(|t| {
        t.put_inode(&dir_inode(9))?;
        // Refused before the database sees it (docs/format.md §26): the transaction goes on.
        assert!(matches!(t.put_inode(&dir_inode(u64::MAX)), Err(MetaError::Store(_))));
        // PostgreSQL refuses a NUL in `text`, which aborts its transaction; the change goes with the commit, so
        // the failure shows there, and the closure would carry on regardless.
        t.put_server(1, "nul\0byte")?;
        Ok(())
    });
    assert!(matches!(r, Err(MetaError::Store(_))), "{r:?}");
    assert!(store.read(|t| t.get_inode(9)).unwrap().is_none(), "nothing of it is committed");
    assert!(store.read(|t| t.get_inode(u64::MAX)).unwrap().is_none());
    // A read refuses writes like every store's.
    assert!(matches!(store.read(|t| t.del_inode(9)), Err(MetaError::ReadOnly)));
}

#[test]
fn a_transaction_reads_its_own_deferred_changes_and_a_failed_one_fails_the_next_read() {
    let store = PgStore::connect(&fresh_url()).unwrap();
    store
        .write(|t| {
            t.put_inode(&dir_inode(21))?;
            t.put_dirent(21, "a", 22, FileKind::File)?;
            // The changes wait for this read and go ahead of it in its pipeline.
            assert_eq!(t.get_inode(21)?.map(|i| i.ino), Some(21));
            assert_eq!(t.get_dirent(21, "a")?, Some((22, FileKind::File)));
            t.del_dirent(21, "a")?;
            assert_eq!(t.get_dirent(21, "a")?, None);
            Ok::<(), MetaError>(())
        })
        .unwrap();
    assert!(store.read(|t| t.get_inode(21)).unwrap().is_some(), "committed");
    let r: Result<(), MetaError> = store.write(|t| {
        t.put_inode(&dir_inode(23))?;
        t.put_server(1, "nul\0byte")?;
        let read = t.get_inode(23);
        assert!(matches!(read, Err(MetaError::Store(_))), "the failed change fails the read it went with: {read:?}");
        Ok(())
    });
    assert!(matches!(r, Err(MetaError::Store(_))), "{r:?}");
    assert!(store.read(|t| t.get_inode(23)).unwrap().is_none(), "nothing of it is committed");
}

#[test]
fn the_store_works_from_async_tasks_and_the_blocking_pool() {
    let store = std::sync::Arc::new(PgStore::connect(&fresh_url()).unwrap());
    let multi = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
    let s = store.clone();
    multi.block_on(async move {
        // In place on a worker, as `MetaService::execute_in_place` runs point reads.
        s.write(|t| t.put_inode(&dir_inode(11))).unwrap();
        let s2 = s.clone();
        tokio::task::spawn_blocking(move || s2.read(|t| t.get_inode(11)).unwrap()).await.unwrap().unwrap();
        tokio::spawn(async move { s.read(|t| t.count_inodes()).unwrap() }).await.unwrap();
    });
    let current = tokio::runtime::Builder::new_current_thread().build().unwrap();
    current.block_on(async { assert_eq!(store.read(|t| t.count_inodes()).unwrap(), 1) });
    drop(multi);
    // Dropped on an async task: no runtime is dropped in a blocking-forbidden context.
    let current = tokio::runtime::Builder::new_current_thread().build().unwrap();
    current.block_on(async move { drop(std::sync::Arc::try_unwrap(store).unwrap()) });
}

#[test]
fn connections_the_server_ended_are_replaced() {
    let url = fresh_url();
    let store = PgStore::connect_with(&url, PgConfig::default().with_connections_max(1)).unwrap();
    store.write(|t| t.put_inode(&dir_inode(3))).unwrap();
    for _ in 0..3 {
        // The server ends every connection of the store (as a restart or an idle timeout would).
        execute(
            &url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        );
        store.write(|t| t.put_inode(&dir_inode(4))).unwrap();
        execute(
            &url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        );
        assert_eq!(store.read(|t| t.count_inodes()).unwrap(), 2);
    }
}

#[test]
fn changes_of_one_directory_from_two_services_wait_for_each_other_instead_of_conflicting() {
    const CHANGES: u32 = 40;
    let url = fresh_url();
    let (a, b) = (PgStore::connect(&url).unwrap(), PgStore::connect(&url).unwrap());
    a.write(|t| t.put_inode(&dir_inode(30))).unwrap();
    let before = a.read(|t| t.get_inode(30)).unwrap().unwrap().nlink;
    std::thread::scope(|s| {
        for (k, store) in [&a, &b].into_iter().enumerate() {
            s.spawn(move || {
                for n in 0..CHANGES {
                    store
                        .write(|t| {
                            t.serialize_dirs(&[30]);
                            // A create's shape: read the directory, add an entry, rewrite the directory.
                            let mut dir = t.get_inode(30)?.expect("the directory");
                            t.put_dirent(30, &format!("{k}.{n}"), 1000 + u64::from(n), FileKind::File)?;
                            dir.nlink += 1;
                            t.put_inode(&dir)
                        })
                        .unwrap();
                }
            });
        }
    });
    let after = a.read(|t| t.get_inode(30)).unwrap().unwrap().nlink;
    assert_eq!(after, before + 2 * CHANGES, "no change was lost");
    let retries = a.stats().retries.get() + b.stats().retries.get();
    assert_eq!(retries, 0, "changes of one directory ran one at a time: none conflicted");
}

/// Service `a` takes directory `dir`'s lock and stops inside its transaction; `while_stopped` runs, then service
/// `b` changes the directory, then `a` goes on. Returns how many times `a`'s change ran, once `b`'s change and
/// `a`'s are both in. Each change adds one to the directory's link count.
fn holder_stopped_while_another_changes(a: &PgStore, b: &PgStore, dir: u64, while_stopped: impl FnOnce()) -> u32 {
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let runs = AtomicU32::new(0);
    let bump = |t: &mut dyn MetaTxn| -> Result<(), MetaError> {
        let mut d = t.get_inode(dir)?.expect("the directory");
        d.nlink += 1;
        t.put_inode(&d)
    };
    std::thread::scope(|s| {
        let runs = &runs;
        let holder = s.spawn(move || {
            a.write(|t| {
                t.serialize_dirs(&[dir]);
                t.get_inode(dir)?; // the lock is taken with the transaction's first statement
                if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                    locked_tx.send(()).unwrap();
                    go_rx.recv().unwrap(); // stopped, holding the lock, until the other service got through
                }
                bump(t)
            })
        });
        locked_rx.recv().unwrap();
        while_stopped();
        b.write(|t| {
            t.serialize_dirs(&[dir]);
            bump(t)
        })
        .unwrap();
        go_tx.send(()).unwrap();
        holder.join().unwrap().unwrap();
    });
    runs.load(Ordering::SeqCst)
}

/// A service that dies holding a directory's lock (its database session ends: here terminated by the server, as
/// the kernel closing a killed process's socket ends it) holds up nobody: the other service's change of that
/// directory goes on, and the dead one's transaction, never committed, leaves nothing.
#[test]
fn a_directory_lock_goes_with_the_session_that_held_it() {
    let url = fresh_url();
    let (a, b) = (PgStore::connect(&url).unwrap(), PgStore::connect(&url).unwrap());
    a.write(|t| t.put_inode(&dir_inode(31))).unwrap();
    let runs = holder_stopped_while_another_changes(&a, &b, 31, || {
        execute(
            &url,
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND objid = 31 AND granted \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        )
    });
    assert_eq!(runs, 2, "the holder's change ran again on a new connection");
    assert_eq!(a.read(|t| t.get_inode(31)).unwrap().unwrap().nlink, 4, "each change applied once");
}

/// A service stopped while it holds a directory's lock (SIGSTOP, a hung thread: its socket stays open) holds up
/// the other services only until PostgreSQL ends its session for sitting idle in the transaction; the stopped
/// one's change, never committed, runs again when it resumes.
#[test]
fn a_stopped_holder_loses_its_directory_lock_after_the_idle_bound() {
    let url = fresh_url();
    let a = PgStore::connect_with(&url, PgConfig::default().with_idle_in_txn_timeout_ms(300)).unwrap();
    let b = PgStore::connect(&url).unwrap();
    a.write(|t| t.put_inode(&dir_inode(32))).unwrap();
    let runs = holder_stopped_while_another_changes(&a, &b, 32, || {});
    assert_eq!(runs, 2, "the stopped holder's change ran again on a new connection");
    assert_eq!(a.read(|t| t.get_inode(32)).unwrap().unwrap().nlink, 4, "each change applied once");
}

/// `prefetch_entry` answers the directory, its entry and the entry's inode as the reads themselves would, for
/// every combination of what exists, and nothing read ahead outlives the transaction's next change.
#[test]
fn a_prefetched_entry_reads_as_the_rows_do_until_a_change() {
    let store = PgStore::connect(&fresh_url()).unwrap();
    let file = Inode { ino: 8, kind: FileKind::File, nlink: 1, ..dir_inode(8) };
    store
        .write(|t| {
            t.put_inode(&dir_inode(7))?;
            t.put_inode(&file)?;
            t.put_dirent(7, "f", 8, FileKind::File)?;
            t.put_dirent(7, "dangling", 99, FileKind::File)
        })
        .unwrap();
    let direct = |t: &mut dyn MetaTxn, dir: u64, name: &str| -> Result<_, MetaError> {
        let entry = t.get_dirent(dir, name)?;
        let child = entry.map(|(ino, _)| t.get_inode(ino)).transpose()?;
        Ok((t.get_inode(dir)?, entry, child))
    };
    for (dir, name) in [(7, "f"), (7, "absent"), (7, "dangling"), (5, "f"), (u64::MAX, "f")] {
        let plain = store.read(|t| direct(t, dir, name)).unwrap();
        let ahead = store
            .read(|t| {
                t.prefetch_entry(dir, name)?;
                direct(t, dir, name)
            })
            .unwrap();
        assert_eq!(ahead, plain, "{dir}/{name}");
    }
    let (before, after) = store
        .write(|t| {
            t.prefetch_entry(7, "f")?;
            let before = t.get_inode(8)?;
            t.put_inode(&Inode { size: 4096, ..file.clone() })?;
            t.del_dirent(7, "f")?;
            Ok::<_, MetaError>((before, (t.get_inode(8)?, t.get_dirent(7, "f")?)))
        })
        .unwrap();
    assert_eq!(before, Some(file.clone()));
    assert_eq!(after, (Some(Inode { size: 4096, ..file }), None), "the transaction's own changes are read");
}

#[test]
fn a_prefetched_create_reads_as_the_rows_do_and_takes_the_next_number() {
    use crate::acl::DEFAULT_XATTR;
    let store = PgStore::connect(&fresh_url()).unwrap();
    store
        .write(|t| {
            t.put_inode(&dir_inode(7))?;
            t.put_xattr(7, DEFAULT_XATTR, b"acl")?;
            t.put_server(2, "b:1")?;
            t.put_server(1, "a:1")
        })
        .unwrap();
    let direct = |t: &mut dyn MetaTxn, dir: u64, name: &str| -> Result<_, MetaError> {
        let entry = (t.get_inode(dir)?, t.get_dirent(dir, name)?);
        let rest = (t.get_xattr(dir, DEFAULT_XATTR)?, t.get_xattr(dir, "user.other")?);
        Ok((entry, rest, t.list_servers()?))
    };
    for (dir, name) in [(7, "new"), (5, "new"), (u64::MAX, "new")] {
        let plain = store.read(|t| direct(t, dir, name)).unwrap();
        let (ahead, ino) = store
            .write(|t| {
                t.prefetch_create(dir, name, DEFAULT_XATTR)?;
                Ok::<_, MetaError>((direct(t, dir, name)?, t.next_ino()?))
            })
            .unwrap();
        assert_eq!(ahead, plain, "{dir}/{name}");
        // The number taken ahead is the sequence's next; the one after it comes from the sequence again.
        let (after, again) = store.write(|t| Ok::<_, MetaError>((t.next_ino()?, t.next_ino()?))).unwrap();
        assert!(ino > 0 && after > ino && again == after + 1, "{ino} then {after}, {again}");
    }
    let servers = store
        .write(|t| {
            t.prefetch_create(7, "new", DEFAULT_XATTR)?;
            t.put_server(3, "c:1")?;
            t.list_servers()
        })
        .unwrap();
    assert_eq!(servers.len(), 3, "the transaction's own changes are read");
    let read_only = store.read(|t| {
        t.prefetch_create(7, "new", DEFAULT_XATTR)?;
        t.get_xattr(7, DEFAULT_XATTR)
    });
    assert_eq!(read_only.unwrap(), Some(b"acl".to_vec()), "a read-only transaction prefetches what it may");
}

#[test]
fn an_xattr_read_apart_is_the_value_committed_before_the_transaction() {
    let store = PgStore::connect(&fresh_url()).unwrap();
    store.write(|t| t.put_xattr(0, "once", b"before")).unwrap();
    let (apart, own) = store
        .write(|t| {
            t.read_xattr_apart(0, "once");
            t.get_inode(1)?; // The first statement: the apart read goes with it.
            t.put_xattr(0, "once", b"mine")?;
            Ok::<_, MetaError>((t.xattr_apart(0, "once")?, t.get_xattr(0, "once")?))
        })
        .unwrap();
    assert_eq!(apart.as_deref(), Some(&b"before"[..]), "read before the transaction's own change");
    assert_eq!(own.as_deref(), Some(&b"mine"[..]));
    // Asked for with nothing sent yet: read with the question.
    let first = store
        .write(|t| {
            t.read_xattr_apart(0, "once");
            t.xattr_apart(0, "once")
        })
        .unwrap();
    assert_eq!(first.as_deref(), Some(&b"mine"[..]));
    // Asked for too late (after the first statement): read in the transaction, its own changes included.
    let late = store
        .write(|t| {
            t.get_inode(1)?;
            t.put_xattr(0, "once", b"late")?;
            t.read_xattr_apart(0, "once");
            t.xattr_apart(0, "once")
        })
        .unwrap();
    assert_eq!(late.as_deref(), Some(&b"late"[..]));
    assert_eq!(store.read(|t| t.xattr_apart(0, "absent")).unwrap(), None);
}
