//! The bank: get, multi-get (one `get k1 k2 …` per daemon, daemons in parallel), set and delete over a ring of
//! memcached daemons.
//!
//! Nothing here is ever an error to the caller: a miss, a corrupt or foreign item, a daemon that is down, slow,
//! ejected or saturated all read as `None` (and a failed store as `false`), so the caller goes to the server that
//! owns the data. Every request holds one of `inflight_max` permits and has `request_timeout_ms` from the moment
//! it is asked for, permit wait included; a request whose deadline passes drops its connection (the client crate
//! closes a connection whose reply was not read whole), and the failure counts toward ejecting the daemon.
//! The protocol is `async-memcached`'s (memcached's text protocol over tokio).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_memcached::{AsciiProtocol, Client as McClient, Error as McError, Status};
use bytes::Bytes;
use tokio::sync::Semaphore;

use crate::config::{CacheConfig, ConfigError};
use crate::health::{Admit, Health, HealthState};
use crate::ring::Ring;
use crate::seal::BankKey;
use crate::value::{self, CacheKey, ItemKind, key_hash};

/// The largest reply one multi-get asks for: a read spanning more blocks is cut into batches of at most this
/// many value bytes each, so one reply never holds more than a few MiB in the client's buffer.
const BATCH_BYTES_MAX: usize = 4 << 20;

/// Counters of everything the bank did (monotonic, all daemons).
#[derive(Debug, Default)]
struct Counters {
    /// Failures and recoveries of any daemon ([`Bank::health_changes`]).
    health_changes: AtomicU64,
    gets: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    refused_items: AtomicU64,
    failures: AtomicU64,
    timeouts: AtomicU64,
    routed_around: AtomicU64,
    saturated: AtomicU64,
    stores: AtomicU64,
}

/// A snapshot of the bank's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BankStats {
    /// Multi-gets: each one round of requests (one per daemon asked, in parallel), the latency a caller pays.
    pub gets: u64,
    /// Keys answered with a checked value.
    pub hits: u64,
    /// Keys not answered with data, for any reason below or simply absent.
    pub misses: u64,
    /// Items present but refused by the value checks (corrupt, foreign, truncated).
    pub refused_items: u64,
    /// Requests that failed on a daemon (connect, I/O, protocol), timeouts excluded.
    pub failures: u64,
    /// Requests whose deadline passed.
    pub timeouts: u64,
    /// Keys with no usable daemon at all (every daemon ejected).
    pub routed_around: u64,
    /// Requests given up waiting for an in-flight permit.
    pub saturated: u64,
    /// Values stored.
    pub stores: u64,
}

struct Daemon {
    address: String,
    /// `tcp://host:port`: the client crate's DSN (a bare `ip:port` does not parse as one).
    dsn: String,
    health: Mutex<Health>,
    /// Idle connections, at most `connections_per_daemon`.
    idle: Mutex<Vec<McClient>>,
}

struct Inner {
    config: CacheConfig,
    seal: BankKey,
    ring: Ring,
    daemons: Vec<Daemon>,
    inflight: Semaphore,
    epoch: Instant,
    counters: Counters,
}

/// A handle on the bank; clones share daemons, connections and counters.
#[derive(Clone)]
pub struct Bank {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Bank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bank").field("servers", &self.inner.config.servers).finish_non_exhaustive()
    }
}

/// memcached's two stores: `set` replaces, `add` stores only into an empty key.
#[derive(Clone, Copy)]
enum Store {
    Set,
    Add,
}

/// How one request to one daemon ended.
enum Outcome<T> {
    Done(T),
    /// The daemon failed or timed out (counted, reported to its health).
    Failed,
    /// Not sent: no permit in time, or the daemon was no longer admissible.
    NotSent,
}

impl Bank {
    /// A bank over `config.servers` (connections are made on first use), its values sealed under `seal`.
    pub fn new(config: CacheConfig, seal: BankKey) -> Result<Bank, ConfigError> {
        config.validate()?;
        let ring = Ring::new(&config.servers, config.points_per_daemon);
        let daemons = config
            .servers
            .iter()
            .map(|a| Daemon {
                address: a.clone(),
                dsn: format!("tcp://{a}"),
                health: Mutex::new(Health::new(config.errors_to_eject, config.eject_ms)),
                idle: Mutex::new(Vec::new()),
            })
            .collect();
        Ok(Bank {
            inner: Arc::new(Inner {
                inflight: Semaphore::new(config.inflight_max),
                config,
                seal,
                ring,
                daemons,
                epoch: Instant::now(),
                counters: Counters::default(),
            }),
        })
    }

    pub fn config(&self) -> &CacheConfig {
        &self.inner.config
    }

    /// The key of directory `parent`'s entry `name` (its name hashed under the bank key).
    pub fn lookup_key(&self, parent: u64, name: &str) -> CacheKey {
        CacheKey::lookup(parent, name, &self.inner.seal)
    }

    pub fn stats(&self) -> BankStats {
        let c = &self.inner.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        BankStats {
            gets: l(&c.gets),
            hits: l(&c.hits),
            misses: l(&c.misses),
            refused_items: l(&c.refused_items),
            failures: l(&c.failures),
            timeouts: l(&c.timeouts),
            routed_around: l(&c.routed_around),
            saturated: l(&c.saturated),
            stores: l(&c.stores),
        }
    }

    /// How many times a request failed on a daemon or a failing daemon answered again: when it moves, items
    /// may have been lost (a daemon restarted empty) or stored on another daemon than their owner (routed around
    /// an ejected one), so what a caller remembers about the bank's contents is no longer to be trusted.
    pub fn health_changes(&self) -> u64 {
        self.inner.counters.health_changes.load(Ordering::Relaxed)
    }

    /// Whether every daemon is up (none failing or ejected): a key then lives on its owner, where every client
    /// with the same view looks for it.
    pub fn all_up(&self) -> bool {
        self.inner.daemons.iter().all(|d| lock(&d.health).state() == HealthState::Up)
    }

    /// Daemon `i`'s health (for tests and status output).
    pub fn daemon_state(&self, i: usize) -> Option<HealthState> {
        self.inner.daemons.get(i).map(|d| lock(&d.health).state())
    }

    /// The daemon that owns `key` when every daemon is up.
    pub fn owner(&self, key: &CacheKey) -> Option<usize> {
        self.inner.ring.owner(self.inner.placement(key, &key.encode(self.inner.config.namespace)))
    }

    /// Opens a connection to every daemon that has none idle (in parallel, each under the usual permit and
    /// deadline), so a client's first requests do not pay a connect. A daemon that does not answer counts a
    /// failure, as any request would.
    pub async fn warm_up(&self) {
        let inner = &self.inner;
        let each = (0..inner.daemons.len()).map(|d| async move { inner.on_daemon(d, async |_| Ok(())).await });
        join_all(each.collect()).await;
    }

    /// The payload cached under `key`, or `None` (absent, refused, or no daemon answered in time).
    pub async fn get(&self, key: &CacheKey) -> Option<Bytes> {
        self.get_many(std::slice::from_ref(key)).await.pop().flatten()
    }

    /// The payloads cached under `keys`, in order: one multi-get per daemon (cut into batches of a few MiB),
    /// daemons asked in parallel.
    pub async fn get_many(&self, keys: &[CacheKey]) -> Vec<Option<Bytes>> {
        let inner = &self.inner;
        let mut results: Vec<Option<Bytes>> = vec![None; keys.len()];
        let now = inner.now_ms();
        // (daemon, encoded keys, their indices in `keys`)
        let mut batches: Vec<(usize, Vec<String>, Vec<usize>)> = Vec::new();
        let mut open_batch: HashMap<usize, usize> = HashMap::new();
        let per_batch = (BATCH_BYTES_MAX
            / (inner.config.block_bytes as usize + value::HEADER_BYTES + crate::seal::TAG_BYTES))
            .max(1);
        for (i, key) in keys.iter().enumerate() {
            let encoded = key.encode(inner.config.namespace);
            let Some(d) = inner.route(key.kind(), inner.placement(key, &encoded), now) else {
                inner.counters.routed_around.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let b = match open_batch.get(&d) {
                Some(&b) if batches[b].1.len() < per_batch => b,
                _ => {
                    batches.push((d, Vec::new(), Vec::new()));
                    open_batch.insert(d, batches.len() - 1);
                    batches.len() - 1
                }
            };
            batches[b].1.push(encoded);
            batches[b].2.push(i);
        }
        // Every daemon asked from this task, concurrently (no spawned task per daemon: a spawn costs two
        // cross-thread wake-ups, more than the round trip it overlaps on a loaded host).
        let asked = batches.iter().map(|(d, encoded, indices)| {
            let kinds: Vec<ItemKind> = indices.iter().map(|&i| keys[i].kind()).collect();
            async move { inner.multi_get(*d, encoded, &kinds).await }
        });
        let found = join_all(asked.collect()).await;
        for ((_, _, indices), found) in batches.iter().zip(found) {
            for (&i, value) in indices.iter().zip(found) {
                results[i] = value;
            }
        }
        let hits = results.iter().filter(|r| r.is_some()).count() as u64;
        inner.counters.gets.fetch_add(1, Ordering::Relaxed);
        inner.counters.hits.fetch_add(hits, Ordering::Relaxed);
        inner.counters.misses.fetch_add(keys.len() as u64 - hits, Ordering::Relaxed);
        results
    }

    /// Stores `payload` under `key`, kept until evicted; `false` when it was not stored (too large, or no daemon
    /// took it in time).
    pub async fn set(&self, key: &CacheKey, payload: &[u8]) -> bool {
        self.set_expiring(key, payload, None).await
    }

    /// [`Bank::set`] with memcached's expiry: the item is gone `expiry_s` seconds after the store (`None` or 0:
    /// never). Items that are overwritten in place (attributes, lookups) expire, so an invalidation lost with a
    /// dead daemon is bounded in time.
    pub async fn set_expiring(&self, key: &CacheKey, payload: &[u8], expiry_s: Option<u32>) -> bool {
        self.store(key, payload, expiry_s, Store::Set).await
    }

    /// [`Bank::set_expiring`] only if the key holds no item (memcached `add`): a fill that must not replace what
    /// is there. `false` also when an item was there.
    pub async fn add_expiring(&self, key: &CacheKey, payload: &[u8], expiry_s: Option<u32>) -> bool {
        self.store(key, payload, expiry_s, Store::Add).await
    }

    async fn store(&self, key: &CacheKey, payload: &[u8], expiry_s: Option<u32>, how: Store) -> bool {
        let inner = &self.inner;
        // memcached reads an expiry above 30 days as an absolute Unix time: cap it there.
        let ttl = expiry_s.filter(|&s| s > 0).map(|s| i64::from(s.min(30 * 24 * 3600)));
        let encoded = key.encode(inner.config.namespace);
        let item = match value::encode_value(encoded.as_bytes(), key.kind(), payload, &inner.seal) {
            Ok(item) => item,
            Err(e) => {
                tracing::debug!(key = %encoded, "cache value not stored: {e}");
                return false;
            }
        };
        let Some(d) = inner.route(key.kind(), inner.placement(key, &encoded), inner.now_ms()) else { return false };
        let stored = inner
            .on_daemon(d, async |c: &mut McClient| {
                let done = match how {
                    Store::Set => c.set(encoded.as_bytes(), item.as_slice(), ttl, None).await,
                    Store::Add => c.add(encoded.as_bytes(), item.as_slice(), ttl, None).await,
                };
                match done {
                    Ok(()) => Ok(true),
                    // The daemon answered (e.g. SERVER_ERROR out of memory): it works, the item is just not there.
                    Err(McError::Protocol(_)) => Ok(false),
                    Err(e) => Err(e),
                }
            })
            .await;
        let stored = matches!(stored, Outcome::Done(true));
        if stored {
            inner.counters.stores.fetch_add(1, Ordering::Relaxed);
        }
        stored
    }

    /// Removes `key` from the daemon that would serve it now; `false` if that daemon could not be asked (a
    /// caller that needs the item gone must not rely on this alone: see ARCHITECTURE.md on coherence).
    pub async fn delete(&self, key: &CacheKey) -> bool {
        let inner = &self.inner;
        let encoded = key.encode(inner.config.namespace);
        let Some(d) = inner.route(key.kind(), inner.placement(key, &encoded), inner.now_ms()) else { return false };
        let done = inner
            .on_daemon(d, async |c: &mut McClient| match c.delete(encoded.as_bytes()).await {
                Ok(()) | Err(McError::Protocol(Status::NotFound)) => Ok(()),
                Err(e) => Err(e),
            })
            .await;
        matches!(done, Outcome::Done(()))
    }
}

impl Inner {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Where `key` (whose memcached key is `encoded`) goes on the ring: its own key's hash, except that a
    /// directory entry goes with its directory's attributes, so the two items every lookup needs are asked for
    /// in one request to one daemon whatever the number of daemons (a directory's entries then share a daemon,
    /// as a Lustre directory's live on one MDT).
    fn placement(&self, key: &CacheKey, encoded: &str) -> u64 {
        match *key {
            CacheKey::Lookup { parent, .. } => {
                key_hash(CacheKey::Attrs { ino: parent }.encode(self.config.namespace).as_bytes())
            }
            _ => key_hash(encoded.as_bytes()),
        }
    }

    /// The daemon to ask for a key of `kind` at `now_ms`: its owner, or for a data block the next admissible
    /// daemon on the ring. Attributes and lookups are overwritten in place, so a copy left on a fallback daemon
    /// while the owner was out could be served stale by a client that still routes around it: they live on
    /// their owner only, and are a miss while it is out.
    fn route(&self, kind: ItemKind, hash: u64, now_ms: u64) -> Option<usize> {
        let admissible = |d: usize| lock(&self.daemons[d].health).admissible(now_ms);
        match kind {
            ItemKind::Block => self.ring.route(hash, admissible),
            ItemKind::Attrs | ItemKind::Lookup => self.ring.owner(hash).filter(|&d| admissible(d)),
        }
    }

    /// One `get` of `keys` on daemon `d`; each found item checked against its key and kind.
    async fn multi_get(&self, d: usize, keys: &[String], kinds: &[ItemKind]) -> Vec<Option<Bytes>> {
        let found = self
            .on_daemon(d, async |c: &mut McClient| match c.get_multi(keys).await {
                Ok(values) => Ok(values),
                Err(McError::Protocol(Status::NotFound)) => Ok(Vec::new()),
                Err(e) => Err(e),
            })
            .await;
        let mut out: Vec<Option<Bytes>> = vec![None; keys.len()];
        let Outcome::Done(values) = found else { return out };
        // The reply holds each found key once, in any order; a key asked twice gets the same item at each place.
        // Each item is opened once, in its own buffer (no copy).
        let asked: HashMap<&[u8], usize> = keys.iter().enumerate().map(|(i, k)| (k.as_bytes(), i)).collect();
        let mut items: HashMap<Vec<u8>, Option<Bytes>> = HashMap::with_capacity(values.len());
        for v in values {
            let Some(data) = v.data else { continue };
            // A key the daemon answered but nobody asked for is not opened (the kind comes from the asking).
            let Some(&i) = asked.get(v.key.as_slice()) else { continue };
            match value::open_value(data, kinds[i], &v.key, &self.seal) {
                Ok(payload) => {
                    items.insert(v.key, Some(payload));
                }
                Err(e) => {
                    self.counters.refused_items.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(daemon = %self.daemons[d].address, key = %keys[i], "cache item refused: {e}");
                    items.insert(v.key, None);
                }
            }
        }
        for (i, key) in keys.iter().enumerate() {
            if let Some(Some(payload)) = items.get(key.as_bytes()) {
                out[i] = Some(payload.clone());
            }
        }
        out
    }

    /// Runs `op` on a connection to daemon `d` under a permit and the request deadline, and reports the outcome
    /// to the daemon's health.
    async fn on_daemon<T>(&self, d: usize, op: impl AsyncFnOnce(&mut McClient) -> Result<T, McError>) -> Outcome<T> {
        let deadline = Instant::now() + Duration::from_millis(self.config.request_timeout_ms);
        let Ok(Ok(_permit)) = tokio::time::timeout_at(deadline.into(), self.inflight.acquire()).await else {
            self.counters.saturated.fetch_add(1, Ordering::Relaxed);
            return Outcome::NotSent;
        };
        let daemon = &self.daemons[d];
        if lock(&daemon.health).admit(self.now_ms()) == Admit::No {
            return Outcome::NotSent;
        }
        let idle = lock(&daemon.idle).pop();
        let attempt = async {
            let mut client = match idle {
                Some(c) => c,
                None => {
                    let connect = Duration::from_millis(self.config.connect_timeout_ms);
                    match tokio::time::timeout(connect, McClient::new(daemon.dsn.as_str())).await {
                        Ok(Ok(c)) => c,
                        Ok(Err(e)) => return Err(Some(e)),
                        Err(_) => return Err(None),
                    }
                }
            };
            let result = op(&mut client).await.map_err(Some)?;
            Ok((client, result))
        };
        match tokio::time::timeout_at(deadline.into(), attempt).await {
            Ok(Ok((client, result))) => {
                let mut health = lock(&daemon.health);
                if health.state() != crate::HealthState::Up {
                    self.counters.health_changes.fetch_add(1, Ordering::Relaxed);
                }
                health.success();
                drop(health);
                let mut idle = lock(&daemon.idle);
                if !client.is_closed() && idle.len() < self.config.connections_per_daemon {
                    idle.push(client);
                }
                Outcome::Done(result)
            }
            Ok(Err(error)) => {
                match error {
                    Some(e) => {
                        self.counters.failures.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(daemon = %daemon.address, "cache request failed: {e}");
                    }
                    None => {
                        self.counters.timeouts.fetch_add(1, Ordering::Relaxed);
                    }
                }
                self.fail(d);
                Outcome::Failed
            }
            Err(_) => {
                self.counters.timeouts.fetch_add(1, Ordering::Relaxed);
                self.fail(d);
                Outcome::Failed
            }
        }
    }

    /// A failure on daemon `d`: count it toward ejection and forget its idle connections, which likely share
    /// the fate of the one that failed.
    fn fail(&self, d: usize) {
        let daemon = &self.daemons[d];
        let now = self.now_ms();
        self.counters.health_changes.fetch_add(1, Ordering::Relaxed);
        let mut health = lock(&daemon.health);
        let was_ejected = health.is_ejected();
        health.failure(now);
        if health.is_ejected() && !was_ejected {
            tracing::info!(daemon = %daemon.address, "cache daemon ejected for {} ms", self.config.eject_ms);
        }
        drop(health);
        lock(&daemon.idle).clear();
    }
}

/// Runs every future of `futs` concurrently on the calling task and returns their outputs in order.
async fn join_all<F: Future>(futs: Vec<F>) -> Vec<F::Output> {
    let mut futs: Vec<std::pin::Pin<Box<F>>> = futs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in futs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *o = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending { std::task::Poll::Pending } else { std::task::Poll::Ready(()) }
    })
    .await;
    out.into_iter().map(|o| o.expect("every future finished")).collect()
}

/// A poisoned lock only means another task panicked while holding plain data; the data is still usable.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_lives_with_its_directorys_attributes() {
        let servers: Vec<String> = (0..4).map(|i| format!("127.0.0.1:{}", 11211 + i)).collect();
        let bank = Bank::new(CacheConfig { servers, ..CacheConfig::default() }, BankKey::public()).unwrap();
        let mut dir_owners = std::collections::HashSet::new();
        let mut child_owners = std::collections::HashSet::new();
        for dir in 1..64u64 {
            let home = bank.owner(&CacheKey::Attrs { ino: dir }).unwrap();
            dir_owners.insert(home);
            for i in 0..16 {
                let name = format!("f{i}");
                assert_eq!(bank.owner(&bank.lookup_key(dir, &name)), Some(home), "dir {dir} name {name}");
                child_owners.insert(bank.owner(&CacheKey::Attrs { ino: dir * 100 + i }).unwrap());
            }
        }
        // Directories (and every other key) still spread over the daemons.
        assert_eq!(dir_owners.len(), 4, "{dir_owners:?}");
        assert_eq!(child_owners.len(), 4, "{child_owners:?}");
    }
}
