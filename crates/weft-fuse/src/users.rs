//! Who made a FUSE request: the kernel gives the caller's uid, gid and pid; the supplementary groups come from
//! `/proc/PID/status` ("Groups:"). A [`Client`] acting as that user is cached briefly per (pid, uid, gid), so a
//! burst of requests from one process reads /proc once.
//!
//! The cache is bounded ([`USERS_MAX`], cleared when full) and entries live [`USER_TTL_MS`]: a process whose
//! groups change (or a pid reused by another process with the same uid and gid) is seen with its new groups
//! within that time. The kernel's `default_permissions` check, made with the caller's real groups, runs first on
//! every request anyway; the groups sent to the MDS are its own check.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::warn;
use weft_client::Client;
use weft_proto::{USER_GROUPS_MAX, UserCred};

/// Most cached users.
pub const USERS_MAX: usize = 1024;
/// How long a cached user is trusted.
pub const USER_TTL_MS: u64 = 1000;
/// Bytes of /proc/PID/status read: "Groups:" is in its first lines.
const STATUS_BYTES_MAX: u64 = 16 << 10;

/// A request's (pid, uid, gid).
type Caller = (u32, u32, u32);

#[derive(Default)]
pub(crate) struct Users {
    /// When each caller's client was made, and the client.
    cache: Mutex<HashMap<Caller, (Instant, Client)>>,
}

impl Users {
    /// A client acting as the user of a request (uid, gid, pid), sharing `base`'s sessions.
    pub(crate) fn client_for(&self, base: &Client, uid: u32, gid: u32, pid: u32) -> Client {
        let key = (pid, uid, gid);
        let now = Instant::now();
        let ttl = Duration::from_millis(USER_TTL_MS);
        if let Some((at, c)) = self.cache.lock().expect("users").get(&key)
            && now.duration_since(*at) < ttl
        {
            return c.clone();
        }
        let client = base.with_user(user_of(uid, gid, pid));
        let mut cache = self.cache.lock().expect("users");
        if cache.len() >= USERS_MAX {
            cache.clear();
        }
        cache.insert(key, (now, client.clone()));
        client
    }
}

/// The credential of a request: its uid and gid, and the process's supplementary groups (none if the process is
/// gone or pid is 0, as for requests the kernel makes itself). More than [`USER_GROUPS_MAX`] groups are cut to
/// that many, with a warning: a missing group can only refuse access, never grant it.
fn user_of(uid: u32, gid: u32, pid: u32) -> UserCred {
    let mut groups = if pid == 0 { Vec::new() } else { proc_groups(pid).unwrap_or_default() };
    groups.retain(|&g| g != gid);
    groups.sort_unstable();
    groups.dedup();
    if groups.len() > USER_GROUPS_MAX {
        warn!(
            uid,
            pid,
            groups = groups.len(),
            "caller is in more than {USER_GROUPS_MAX} groups; sending the first {USER_GROUPS_MAX}"
        );
        groups.truncate(USER_GROUPS_MAX);
    }
    UserCred { uid, gid, groups }
}

/// The "Groups:" line of /proc/PID/status.
fn proc_groups(pid: u32) -> Option<Vec<u32>> {
    use std::io::Read;
    let f = std::fs::File::open(format!("/proc/{pid}/status")).ok()?;
    let mut text = String::new();
    f.take(STATUS_BYTES_MAX).read_to_string(&mut text).ok()?;
    parse_groups(&text)
}

fn parse_groups(status: &str) -> Option<Vec<u32>> {
    let line = status.lines().find_map(|l| l.strip_prefix("Groups:"))?;
    Some(line.split_whitespace().filter_map(|g| g.parse().ok()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_come_from_the_status_line() {
        let status =
            "Name:\tbash\nUid:\t1000\t1000\t1000\t1000\nGid:\t100\t100\t100\t100\nGroups:\t4 24 100 \nVmPeak:\t1 kB\n";
        assert_eq!(parse_groups(status), Some(vec![4, 24, 100]));
        assert_eq!(parse_groups("Groups:\t\n"), Some(vec![]));
        assert_eq!(parse_groups("Name:\tx\n"), None);
        let me = user_of(1, 100, std::process::id());
        assert!(me.groups.len() <= USER_GROUPS_MAX && !me.groups.contains(&100));
        assert_eq!(user_of(5, 6, 0), UserCred { uid: 5, gid: 6, groups: vec![] });
    }
}
