//! Connection admission: the server's table of open connections, with a global cap and a per-peer cap, and the
//! eviction that keeps the accept loop serving when the global cap is reached.
//!
//! Why evict rather than wait: a server that stops accepting at its cap (as it once did) is locked out by anyone
//! who can open that many sockets, its registered data servers' heartbeats and every honest client included.
//! Instead, at the global cap the oldest connection that is not yet "proven" is closed to make room. A connection
//! is proven once it has proved a key (or authentication is off) and completed a request other than `Null` (a
//! client with a session, a heartbeat); a proven connection is never evicted by a newcomer. Only when every open
//! connection is proven is the newcomer refused. An unauthenticated peer that only pings stays evictable, so
//! connections that do nothing but `Null` cannot lock clients and restarted servers out.
//!
//! Per peer: a tcp (or rdma side-channel) peer is keyed by its IP address and may hold at most
//! `connections_per_peer_max` connections; further ones are closed at once. `shm` peers are not keyed: the fabric
//! reports the peer's pid, not its uid, and a local process can reach only the local socket anyway.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weft_fabric::Killer;

/// Why a new connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    #[error("the peer already holds {0} connections (connections_per_peer_max)")]
    PeerFull(u32),
    #[error("{0} connections open, all proven (connections_max)")]
    ServerFull(usize),
}

/// The open connections of one server (all its listeners together).
pub(crate) struct ConnTable {
    connections_max: usize,
    per_peer_max: u32,
    inner: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    next_id: u64,
    /// By id, which is also the order of admission (oldest first).
    conns: BTreeMap<u64, Entry>,
    /// Ids of connections not proven yet (see the module doc): the candidates for eviction, oldest first.
    unproven: BTreeSet<u64>,
    per_peer: HashMap<IpAddr, u32>,
}

struct Entry {
    peer_ip: Option<IpAddr>,
    killer: Arc<dyn Killer>,
}

/// A connection's place in the table; dropping it (when the connection's reader ends) frees the place.
pub(crate) struct ConnTicket {
    table: Arc<ConnTable>,
    id: u64,
}

/// The outcome of an admission: the ticket, and the connection evicted to make room (already closed), if any.
pub(crate) struct Admitted {
    pub ticket: ConnTicket,
    pub evicted: Option<u64>,
}

impl ConnTable {
    pub fn new(connections_max: usize, per_peer_max: u32) -> Arc<ConnTable> {
        Arc::new(ConnTable {
            connections_max: connections_max.max(1),
            per_peer_max: per_peer_max.max(1),
            inner: Mutex::new(Open::default()),
        })
    }

    /// Admits a connection from `peer` (the fabric's peer string), or says why not. Never waits: the lock is held
    /// only for map updates, and the evicted connection is shut down after it is released.
    pub fn admit(self: &Arc<Self>, peer: &str, killer: Arc<dyn Killer>) -> Result<Admitted, Refusal> {
        let peer_ip = peer_ip(peer);
        let (ticket, evicted) = {
            let mut t = self.inner.lock().expect("connection table");
            if let Some(ip) = peer_ip
                && t.per_peer.get(&ip).copied().unwrap_or(0) >= self.per_peer_max
            {
                return Err(Refusal::PeerFull(self.per_peer_max));
            }
            let mut evicted = None;
            if t.conns.len() >= self.connections_max {
                let Some(oldest) = t.unproven.first().copied() else {
                    return Err(Refusal::ServerFull(t.conns.len()));
                };
                evicted = t.remove(oldest).map(|e| (oldest, e.killer));
            }
            t.next_id += 1;
            let id = t.next_id;
            if let Some(ip) = peer_ip {
                *t.per_peer.entry(ip).or_default() += 1;
            }
            t.conns.insert(id, Entry { peer_ip, killer });
            t.unproven.insert(id);
            (ConnTicket { table: self.clone(), id }, evicted)
        };
        let evicted = evicted.map(|(id, killer)| {
            killer.kill();
            id
        });
        Ok(Admitted { ticket, evicted })
    }

    /// Closes the oldest unproven connection, if there is one (to free a descriptor when accept fails for lack of
    /// them). Returns whether one was closed.
    pub fn evict_oldest_unproven(&self) -> bool {
        let evicted = {
            let mut t = self.inner.lock().expect("connection table");
            let oldest = t.unproven.first().copied();
            oldest.and_then(|id| t.remove(id))
        };
        evicted.map(|e| e.killer.kill()).is_some()
    }

    /// Connections in the table.
    pub fn len(&self) -> usize {
        self.inner.lock().expect("connection table").conns.len()
    }
}

impl Open {
    fn remove(&mut self, id: u64) -> Option<Entry> {
        let e = self.conns.remove(&id)?;
        self.unproven.remove(&id);
        if let Some(ip) = e.peer_ip
            && let Some(n) = self.per_peer.get_mut(&ip)
        {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(&ip);
            }
        }
        Some(e)
    }
}

impl ConnTicket {
    /// The connection completed a frame: it is no longer a candidate for eviction.
    pub fn mark_proven(&self) {
        self.table.inner.lock().expect("connection table").unproven.remove(&self.id);
    }

    /// This connection's id: unique for the life of the server (never reused), so sessions can be bound to it.
    pub fn id(&self) -> u64 {
        self.id
    }
}

impl Drop for ConnTicket {
    fn drop(&mut self) {
        // Already gone if it was evicted.
        self.table.inner.lock().expect("connection table").remove(self.id);
    }
}

/// The per-peer key of a fabric's peer string: the IP of `ip:port` (tcp) or `rdma:ip:port`; none for `shm`.
fn peer_ip(peer: &str) -> Option<IpAddr> {
    let addr = peer.strip_prefix("rdma:").unwrap_or(peer);
    addr.parse::<SocketAddr>().ok().map(|a| a.ip().to_canonical())
}

/// Lets one log line through per interval and counts the ones held back, so a flood of refusals or expiries
/// cannot flood the log.
pub(crate) struct RateLimitedLog {
    interval_ms: u64,
    start: Instant,
    /// Milliseconds since `start` of the last line let through, plus one (0 = none yet).
    last_ms: AtomicU64,
    suppressed: AtomicU64,
}

impl RateLimitedLog {
    pub fn new(interval: Duration) -> RateLimitedLog {
        RateLimitedLog {
            interval_ms: interval.as_millis() as u64,
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(n)`: log now, mentioning the `n` lines held back since the last one; `None`: stay silent.
    pub fn allow(&self) -> Option<u64> {
        let now = self.start.elapsed().as_millis() as u64 + 1;
        let last = self.last_ms.load(Ordering::Relaxed);
        if (last == 0 || now >= last + self.interval_ms)
            && self.last_ms.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            return Some(self.suppressed.swap(0, Ordering::Relaxed));
        }
        self.suppressed.fetch_add(1, Ordering::Relaxed);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[derive(Default)]
    struct Flag(AtomicBool);
    impl Killer for Flag {
        fn kill(&self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    fn killer() -> Arc<Flag> {
        Arc::new(Flag::default())
    }

    #[test]
    fn peers_are_keyed_by_ip_and_shm_is_not_keyed() {
        assert_eq!(peer_ip("127.0.0.1:5000"), Some("127.0.0.1".parse().unwrap()));
        assert_eq!(peer_ip("rdma:10.0.0.7:18515"), Some("10.0.0.7".parse().unwrap()));
        assert_eq!(peer_ip("[::ffff:10.0.0.7]:1"), Some("10.0.0.7".parse().unwrap()));
        assert_eq!(peer_ip("shm:pid42"), None);
    }

    #[test]
    fn a_peer_over_its_limit_is_refused_and_others_are_not() {
        let t = ConnTable::new(100, 2);
        let a = t.admit("10.0.0.1:1", killer()).unwrap();
        let _b = t.admit("10.0.0.1:2", killer()).unwrap();
        assert_eq!(t.admit("10.0.0.1:3", killer()).err(), Some(Refusal::PeerFull(2)));
        assert!(t.admit("10.0.0.2:1", killer()).is_ok());
        // Unkeyed peers are limited only by the global cap.
        let shm: Vec<_> = (0..5).map(|_| t.admit("shm:pid1", killer()).unwrap()).collect();
        assert_eq!(shm.len(), 5);
        drop(a.ticket);
        assert!(t.admit("10.0.0.1:4", killer()).is_ok(), "a closed connection frees its peer's place");
    }

    #[test]
    fn at_the_cap_the_oldest_unproven_connection_is_evicted_and_proven_ones_never_are() {
        let t = ConnTable::new(3, 100);
        let k1 = killer();
        let first = t.admit("10.0.0.1:1", k1.clone()).unwrap();
        first.ticket.mark_proven();
        let k2 = killer();
        let second = t.admit("10.0.0.1:2", k2.clone()).unwrap();
        let _third = t.admit("10.0.0.1:3", killer()).unwrap();
        let fourth = t.admit("10.0.0.2:1", killer()).unwrap();
        assert_eq!(fourth.evicted, Some(second.ticket.id()));
        assert!(k2.0.load(Ordering::SeqCst), "the evicted connection is shut down");
        assert!(!k1.0.load(Ordering::SeqCst), "a proven connection is never evicted");
        assert_eq!(t.len(), 3);
        // The evicted connection's reader ends later and drops its ticket: nothing else is removed.
        drop(second);
        assert_eq!(t.len(), 3);
        fourth.ticket.mark_proven();
        let fifth = t.admit("10.0.0.3:1", killer()).unwrap();
        fifth.ticket.mark_proven();
        assert_eq!(t.admit("10.0.0.4:1", killer()).err(), Some(Refusal::ServerFull(3)));
        assert!(!t.evict_oldest_unproven());
    }

    #[test]
    fn the_rate_limited_log_lets_one_line_through_and_counts_the_rest() {
        let log = RateLimitedLog::new(Duration::from_secs(3600));
        assert_eq!(log.allow(), Some(0));
        assert_eq!(log.allow(), None);
        assert_eq!(log.allow(), None);
        assert_eq!(log.suppressed.load(Ordering::Relaxed), 2);
    }
}
