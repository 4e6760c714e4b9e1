//! Fault injection for tests, compiled only with the `fault-injection` feature.
//!
//! `WEFT_FAULT=drop-after-execute:<op code>:<count>` makes the server close the connection instead of sending the
//! reply, after executing (and caching the reply of) the next `<count>` requests with that op. Tests use it to prove
//! that a retransmission is answered from the reply cache and not executed twice.
//!
//! `WEFT_FAULT=exit-after-execute:<op code>:<count>` makes the server process exit (status 137, as `kill -9` would
//! leave it) after executing the next `<count>` requests with that op, before replying: the worst moment for a
//! client, whose change is committed while its reply and session die with the process (the once-block tests).
//!
//! `WEFT_FAULT=skip-sidecar:<count>` makes a data server's next `<count>` object writes store their bytes but not
//! their checksums, as a crash between the two would (scrub's tests, docs/format.md §20).
//!
//! `WEFT_FAULT=fail-fsync:<count>` makes a data server's next `<count>` `Fsync` requests fail with `Io` before
//! syncing anything, as a disk that cannot flush would (the durable-at-close tests: the close fails and the size is
//! not committed).
//!
//! `WEFT_FAULT=delay-fsync:<ms>:<count>` makes a data server's next `<count>` `Fsync` requests wait `<ms>` before
//! syncing, as a slow disk would (a commit then waits there: the test that a truncate meanwhile is not undone).
//!
//! `WEFT_FAULT=gate-writes:<path>` makes a data server hold every write and truncate it receives, before anything
//! else is done with it, while `<path>` exists: a test closes the gate, lets one copy of a mirror write land, and
//! chooses when the other lands (the write fences' test, docs/format.md §32).
//!
//! `WEFT_FAULT=boot-id:<text>` makes a data server take `<text>` for its host's boot id when it derives its write
//! verifier (docs/format.md §33): restarted with another text, it is a server whose machine rebooted.
//!
//! `WEFT_FAULT=clock-ahead:<ms>` sets the process's wall clock (`capability::unix_now_ms`, what capabilities'
//! expiry is judged by) `<ms>` ahead, as a host whose clock runs ahead would.

#[cfg(feature = "fault-injection")]
mod imp {
    use std::sync::Mutex;

    static PLAN: Mutex<Option<(u16, u32)>> = Mutex::new(None);
    static EXIT_PLAN: Mutex<Option<(u16, u32)>> = Mutex::new(None);
    static SKIP_SIDECAR: Mutex<u32> = Mutex::new(0);
    static FAIL_FSYNC: Mutex<u32> = Mutex::new(0);
    static DELAY_FSYNC: Mutex<(u64, u32)> = Mutex::new((0, 0));
    static WRITE_GATE: Mutex<Option<std::path::PathBuf>> = Mutex::new(None);
    static BOOT_ID: Mutex<Option<String>> = Mutex::new(None);
    static CLOCK_AHEAD_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    static LOADED: std::sync::Once = std::sync::Once::new();

    fn load() {
        LOADED.call_once(|| {
            let Ok(spec) = std::env::var("WEFT_FAULT") else {
                return;
            };
            let parts: Vec<&str> = spec.split(':').collect();
            if let ["skip-sidecar", count] = parts.as_slice()
                && let Ok(count) = count.parse()
            {
                tracing::warn!(count, "fault injection armed: skip the checksum update after a data write");
                *SKIP_SIDECAR.lock().expect("fault plan") = count;
            }
            if let ["fail-fsync", count] = parts.as_slice()
                && let Ok(count) = count.parse()
            {
                tracing::warn!(count, "fault injection armed: fail the next fsyncs");
                *FAIL_FSYNC.lock().expect("fault plan") = count;
            }
            if let ["delay-fsync", ms, count] = parts.as_slice()
                && let (Ok(ms), Ok(count)) = (ms.parse(), count.parse())
            {
                tracing::warn!(ms, count, "fault injection armed: delay the next fsyncs");
                *DELAY_FSYNC.lock().expect("fault plan") = (ms, count);
            }
            if let ["gate-writes", path] = parts.as_slice() {
                tracing::warn!(path, "fault injection armed: writes wait while the gate file exists");
                *WRITE_GATE.lock().expect("fault plan") = Some(path.into());
            }
            if let ["boot-id", text] = parts.as_slice() {
                tracing::warn!(text, "fault injection armed: the write verifier comes from this boot id");
                *BOOT_ID.lock().expect("fault plan") = Some(text.to_string());
            }
            if let ["clock-ahead", ms] = parts.as_slice()
                && let Ok(ms) = ms.parse::<u64>()
            {
                tracing::warn!(ms, "fault injection armed: the wall clock runs ahead");
                CLOCK_AHEAD_MS.store(ms, std::sync::atomic::Ordering::Relaxed);
            }
            if let ["drop-after-execute", op, count] = parts.as_slice()
                && let (Ok(op), Ok(count)) = (op.parse(), count.parse())
            {
                tracing::warn!(op, count, "fault injection armed: drop connection after execute");
                *PLAN.lock().expect("fault plan") = Some((op, count));
            }
            if let ["exit-after-execute", op, count] = parts.as_slice()
                && let (Ok(op), Ok(count)) = (op.parse(), count.parse())
            {
                tracing::warn!(op, count, "fault injection armed: exit after execute, before the reply");
                *EXIT_PLAN.lock().expect("fault plan") = Some((op, count));
            }
        });
    }

    pub fn skip_sidecar_update() -> bool {
        load();
        let mut n = SKIP_SIDECAR.lock().expect("fault plan");
        if *n > 0 {
            *n -= 1;
            return true;
        }
        false
    }

    pub fn fail_fsync() -> bool {
        load();
        let mut n = FAIL_FSYNC.lock().expect("fault plan");
        if *n > 0 {
            *n -= 1;
            return true;
        }
        false
    }

    pub fn fsync_delay_ms() -> u64 {
        load();
        let mut plan = DELAY_FSYNC.lock().expect("fault plan");
        if plan.1 > 0 {
            plan.1 -= 1;
            return plan.0;
        }
        0
    }

    pub fn drop_after_execute(op: u16) -> bool {
        load();
        take(&PLAN, op)
    }

    pub fn write_gate() -> Option<std::path::PathBuf> {
        load();
        WRITE_GATE.lock().expect("fault plan").clone()
    }

    pub fn boot_id() -> Option<String> {
        load();
        BOOT_ID.lock().expect("fault plan").clone()
    }

    pub fn clock_ahead_ms() -> u64 {
        load();
        CLOCK_AHEAD_MS.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn exit_after_execute(op: u16) -> bool {
        load();
        take(&EXIT_PLAN, op)
    }

    /// Whether `plan` says to act on this `op`, spending one of its count if so.
    fn take(plan: &Mutex<Option<(u16, u32)>>, op: u16) -> bool {
        let mut plan = plan.lock().expect("fault plan");
        match plan.as_mut() {
            Some((o, n)) if *o == op && *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        }
    }
}

/// True when the test plan says to drop the connection instead of replying to this op.
#[cfg(feature = "fault-injection")]
pub fn drop_after_execute(op: u16) -> bool {
    imp::drop_after_execute(op)
}

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn drop_after_execute(_op: u16) -> bool {
    false
}

/// True when the test plan says the process must exit instead of replying to this op (`exit-after-execute`).
#[cfg(feature = "fault-injection")]
pub fn exit_after_execute(op: u16) -> bool {
    imp::exit_after_execute(op)
}

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn exit_after_execute(_op: u16) -> bool {
    false
}

/// True when the test plan says this data write must skip its checksum update (`skip-sidecar:<count>`).
#[cfg(feature = "fault-injection")]
pub fn skip_sidecar_update() -> bool {
    imp::skip_sidecar_update()
}

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn skip_sidecar_update() -> bool {
    false
}

/// True when the test plan says this `Fsync` must fail (`fail-fsync:<count>`).
#[cfg(feature = "fault-injection")]
pub fn fail_fsync() -> bool {
    imp::fail_fsync()
}

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn fail_fsync() -> bool {
    false
}

/// How long this `Fsync` must wait before syncing, by the test plan (`delay-fsync:<ms>:<count>`); 0: not at all.
#[cfg(feature = "fault-injection")]
pub fn fsync_delay_ms() -> u64 {
    imp::fsync_delay_ms()
}

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn fsync_delay_ms() -> u64 {
    0
}

/// The gate file a data server's writes wait on while it exists (`gate-writes:<path>`); `None`: no gate.
#[cfg(feature = "fault-injection")]
pub fn write_gate() -> Option<std::path::PathBuf> {
    imp::write_gate()
}

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn write_gate() -> Option<std::path::PathBuf> {
    None
}

/// How far the test plan sets this process's wall clock ahead (`clock-ahead:<ms>`); 0: not at all.
#[cfg(feature = "fault-injection")]
pub fn clock_ahead_ms() -> u64 {
    imp::clock_ahead_ms()
}

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn clock_ahead_ms() -> u64 {
    0
}

/// The boot id a test plan gives this process in place of the host's (`boot-id:<text>`).
#[cfg(feature = "fault-injection")]
pub fn boot_id() -> Option<String> {
    imp::boot_id()
}

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn boot_id() -> Option<String> {
    None
}
