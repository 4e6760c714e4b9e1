//! Prometheus metrics, the one place every role shares: a [`Metrics`] registry per process, per-operation
//! counters and latency histograms resolved once per op ([`OpMetrics`]), refresh hooks for gauges read from other
//! structures at scrape time, and the HTTP endpoint (`GET /metrics`, text exposition) on `metrics_listen`.
//!
//! The hot path is atomics: an op's counters and histogram are looked up by index in a vector built at start
//! (no hashing, no allocation); a histogram observation takes that op's own short lock. Gauges that describe
//! other tables (sessions, pool buffers, registrations) are read only when someone scrapes.
//!
//! The endpoint is a minimal HTTP/1.0 responder on tokio: one request per connection, at most
//! [`HTTP_CONNECTIONS_MAX`] at once (more are closed at once: drop, not queue), each bounded in request size
//! ([`HTTP_REQUEST_BYTES_MAX`]) and time ([`HTTP_TIMEOUT_MS`]). It serves nothing but the metrics text, so it
//! needs no web framework.

use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The metrics library, for roles that register series of their own.
pub use prometheus_client;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Scrapes served at once; a connection beyond is closed without an answer.
pub const HTTP_CONNECTIONS_MAX: usize = 8;
/// The most bytes of a request (line and headers) read before it is refused.
pub const HTTP_REQUEST_BYTES_MAX: usize = 8 << 10;
/// A scrape connection must send its request and take the answer within this time.
pub const HTTP_TIMEOUT_MS: u64 = 10_000;

/// Label set of a per-op series: `op="Create"`.
pub type OpLabel = [(&'static str, &'static str); 1];
/// Label set of a bytes-moved series: `fabric="tcp", direction="in"`.
pub type FabricLabels = [(&'static str, &'static str); 2];

/// A hook run before each scrape, to set gauges from the structures they describe.
type Refresh = Box<dyn Fn() + Send + Sync>;

/// One process's metrics: the registry and the hooks that refresh its gauges.
pub struct Metrics {
    registry: Mutex<Registry>,
    refresh: Mutex<Vec<Refresh>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    /// An empty registry, with `weft_info{role}` set to 1 so a scrape names the role it came from.
    pub fn new(role: &'static str) -> Arc<Metrics> {
        let m = Arc::new(Metrics { registry: Mutex::new(Registry::default()), refresh: Mutex::new(Vec::new()) });
        let info = Family::<OpLabel, Gauge>::default();
        info.get_or_create(&[("role", role)]).set(1);
        m.register("weft_info", "The role this process plays (always 1)", info);
        m
    }

    /// Registers `metric` (a handle: counters, gauges and histograms share their state with their clones).
    pub fn register(&self, name: &str, help: &str, metric: impl Metric) {
        self.registry.lock().expect("metrics registry").register(name, help, metric);
    }

    /// A counter registered under `name` (exposed as `name_total`).
    pub fn counter(&self, name: &str, help: &str) -> Counter {
        let c = Counter::default();
        self.register(name, help, c.clone());
        c
    }

    /// A gauge registered under `name`.
    pub fn gauge(&self, name: &str, help: &str) -> Gauge {
        let g = Gauge::default();
        self.register(name, help, g.clone());
        g
    }

    /// A histogram of `name` with buckets from `start` growing by `factor`, `buckets` of them.
    pub fn histogram(&self, name: &str, help: &str, start: f64, factor: f64, buckets: u16) -> Histogram {
        let h = Histogram::new(exponential_buckets(start, factor, buckets));
        self.register(name, help, h.clone());
        h
    }

    /// Runs `f` before every scrape (to set gauges from tables that keep their own counts).
    pub fn on_scrape(&self, f: impl Fn() + Send + Sync + 'static) {
        self.refresh.lock().expect("metrics hooks").push(Box::new(f));
    }

    /// The text exposition of every metric (OpenMetrics text, which Prometheus reads).
    pub fn encode(&self) -> String {
        for f in self.refresh.lock().expect("metrics hooks").iter() {
            f();
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        encode(&mut out, &self.registry.lock().expect("metrics registry")).expect("encoding metrics");
        out
    }

    /// Listens on `addr` (`host:port`, port 0 for any) and serves `GET /metrics` there in a task; returns the
    /// bound address.
    pub async fn listen(self: &Arc<Self>, addr: &str) -> std::io::Result<std::net::SocketAddr> {
        let listener = TcpListener::bind(addr).await?;
        let bound = listener.local_addr()?;
        tracing::info!(metrics = %bound, "metrics served at http://{bound}/metrics");
        tokio::spawn(self.clone().serve(listener));
        Ok(bound)
    }

    /// Serves scrapes on `listener` until it fails.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        let permits = Arc::new(Semaphore::new(HTTP_CONNECTIONS_MAX));
        loop {
            let (mut sock, peer) = match listener.accept().await {
                Ok(x) => x,
                Err(e) => {
                    tracing::debug!("metrics accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            let Ok(permit) = permits.clone().try_acquire_owned() else {
                tracing::debug!(%peer, "too many metrics scrapes at once, closing one");
                continue;
            };
            let me = self.clone();
            tokio::spawn(async move {
                let answer = tokio::time::timeout(Duration::from_millis(HTTP_TIMEOUT_MS), me.answer(&mut sock)).await;
                if !matches!(answer, Ok(Ok(()))) {
                    tracing::debug!(%peer, "metrics scrape failed or timed out");
                }
                drop(permit);
            });
        }
    }

    /// Reads one request and answers it.
    async fn answer(&self, sock: &mut tokio::net::TcpStream) -> std::io::Result<()> {
        let mut buf = Vec::with_capacity(1024);
        let mut chunk = [0u8; 1024];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") && !buf.windows(2).any(|w| w == b"\n\n") {
            let n = sock.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
            if buf.len() > HTTP_REQUEST_BYTES_MAX {
                return respond(sock, "431 Request Header Fields Too Large", "text/plain", "request too large\n").await;
            }
        }
        let line = buf.split(|&b| b == b'\n').next().unwrap_or_default();
        let mut words = line.split(|&b| b == b' ');
        let (method, path) = (words.next().unwrap_or_default(), words.next().unwrap_or_default());
        match (method, path) {
            (b"GET", b"/metrics") => {
                let body = self.encode();
                respond(sock, "200 OK", "application/openmetrics-text; version=1.0.0; charset=utf-8", &body).await
            }
            (b"GET", _) => respond(sock, "404 Not Found", "text/plain", "only /metrics is served here\n").await,
            _ => respond(sock, "405 Method Not Allowed", "text/plain", "only GET /metrics\n").await,
        }
    }
}

async fn respond(
    sock: &mut tokio::net::TcpStream,
    status: &str,
    content_type: &str,
    body: &str,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.0 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    sock.write_all(head.as_bytes()).await?;
    sock.write_all(body.as_bytes()).await?;
    sock.shutdown().await
}

/// One op's series, resolved once.
#[derive(Clone)]
struct OpSeries {
    calls: Counter,
    errors: Counter,
    seconds: Histogram,
}

/// Calls, errors and latency by operation, each op's series resolved at start: recording is an index, two atomic
/// adds and one histogram observation.
#[derive(Clone)]
pub struct OpMetrics {
    by_index: Arc<Vec<Option<OpSeries>>>,
}

/// Latency buckets: 10 µs × 4ⁱ, i < 11 (up to ~10 s).
const LATENCY_START_S: f64 = 1e-5;
const LATENCY_FACTOR: f64 = 4.0;
const LATENCY_BUCKETS: u16 = 11;

impl OpMetrics {
    /// Registers `{prefix}_total`, `{prefix}_errors_total` and `{prefix}_seconds` by `op`, for the ops `ops`
    /// (index, name); [`OpMetrics::record`] takes the index.
    pub fn new(metrics: &Metrics, prefix: &str, what: &str, ops: &[(usize, &'static str)]) -> OpMetrics {
        let calls = Family::<OpLabel, Counter>::default();
        let errors = Family::<OpLabel, Counter>::default();
        let seconds = Family::<OpLabel, Histogram>::new_with_constructor(latency_histogram as fn() -> Histogram);
        let len = ops.iter().map(|(i, _)| i + 1).max().unwrap_or(0);
        let mut by_index = vec![None; len];
        for &(i, name) in ops {
            let l = [("op", name)];
            by_index[i] = Some(OpSeries {
                calls: calls.get_or_create_owned(&l),
                errors: errors.get_or_create_owned(&l),
                seconds: seconds.get_or_create_owned(&l),
            });
        }
        metrics.register(prefix, &format!("{what} by operation"), calls);
        metrics.register(&format!("{prefix}_errors"), &format!("{what} that failed, by operation"), errors);
        metrics.register(&format!("{prefix}_seconds"), &format!("Latency of {what} by operation"), seconds);
        OpMetrics { by_index: Arc::new(by_index) }
    }

    /// Records one op (`index` as given to `new`; others are ignored) that took `elapsed`.
    pub fn record(&self, index: usize, ok: bool, elapsed: Duration) {
        if let Some(Some(s)) = self.by_index.get(index) {
            s.calls.inc();
            if !ok {
                s.errors.inc();
            }
            s.seconds.observe(elapsed.as_secs_f64());
        }
    }
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(LATENCY_START_S, LATENCY_FACTOR, LATENCY_BUCKETS))
}

/// Fabric names as they appear in the `fabric` label.
pub const FABRICS: [&str; 3] = ["tcp", "shm", "rdma"];

/// Bytes moved, by fabric and direction, resolved at start.
#[derive(Clone)]
pub struct FabricBytes {
    /// `[fabric][0 = in, 1 = out]`, fabrics in [`FABRICS`] order. (Series are resolved with `get_or_create_owned`:
    /// two guards of one family alive in one expression would deadlock its lock.)
    series: Arc<[[Counter; 2]; 3]>,
}

impl FabricBytes {
    pub fn new(metrics: &Metrics, name: &str, help: &str) -> FabricBytes {
        let family = Family::<FabricLabels, Counter>::default();
        let series = FABRICS.map(|f| {
            [
                family.get_or_create_owned(&[("fabric", f), ("direction", "in")]),
                family.get_or_create_owned(&[("fabric", f), ("direction", "out")]),
            ]
        });
        metrics.register(name, help, family);
        FabricBytes { series: Arc::new(series) }
    }

    /// Counts `bytes` received (`inbound`) or sent over `fabric` (an index into [`FABRICS`]).
    pub fn add(&self, fabric: usize, inbound: bool, bytes: u64) {
        if bytes > 0
            && let Some(f) = self.series.get(fabric)
        {
            f[usize::from(!inbound)].inc_by(bytes);
        }
    }
}

/// The index into [`FABRICS`] of a listener or connection address (`unix:`/`shm:` → shm, `rdma:` → rdma, else
/// tcp).
pub fn fabric_index(addr: &str) -> usize {
    if addr.starts_with("rdma:") {
        2
    } else if addr.starts_with("unix:") || addr.starts_with("shm:") {
        1
    } else {
        0
    }
}

/// The index into [`FABRICS`] of a fabric name (`CallCtx::fabric`); tcp for any other.
pub fn fabric_index_of(name: &str) -> usize {
    FABRICS.iter().position(|f| *f == name).unwrap_or(0)
}

/// Counters of the client side of RPC in this process (every `RpcClient`): process-wide because clients are made
/// deep inside libraries that know nothing of a registry; [`register_client`] exports them.
pub struct ClientCounters {
    /// Attempts resent (same slot and seq) after a timeout or a lost connection.
    pub retries: Counter,
    /// Calls that failed for good (after their retries, or not retryable).
    pub calls_failed: Counter,
}

/// This process's client-side RPC counters.
pub static CLIENT: std::sync::LazyLock<ClientCounters> =
    std::sync::LazyLock::new(|| ClientCounters { retries: Counter::default(), calls_failed: Counter::default() });

/// Exports [`CLIENT`] and the pin-down registration caches' occupancy into `metrics`.
pub fn register_client(metrics: &Metrics) {
    metrics.register(
        "weft_rpc_client_retries",
        "RPC attempts resent after a timeout or a lost connection",
        CLIENT.retries.clone(),
    );
    metrics.register(
        "weft_rpc_client_calls_failed",
        "RPC calls that ended in an error (an error reply, or no reply after their retries)",
        CLIENT.calls_failed.clone(),
    );
    let registrations = metrics.gauge(
        "weft_rpc_client_registrations",
        "Memory registrations held in the pin-down caches of this process's connections",
    );
    metrics.on_scrape(move || {
        registrations.set(crate::pin::registrations_held() as i64);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_series_count_and_encode_by_name() {
        let m = Metrics::new("test");
        let ops = OpMetrics::new(&m, "t_calls", "calls", &[(3, "Three"), (7, "Seven")]);
        ops.record(3, true, Duration::from_micros(5));
        ops.record(7, false, Duration::from_millis(2));
        ops.record(7, true, Duration::from_millis(2));
        ops.record(5, true, Duration::ZERO); // not registered: ignored
        ops.record(1000, true, Duration::ZERO);
        let text = m.encode();
        assert!(text.contains("t_calls_total{op=\"Three\"} 1\n"), "{text}");
        assert!(text.contains("t_calls_total{op=\"Seven\"} 2\n"), "{text}");
        assert!(text.contains("t_calls_errors_total{op=\"Seven\"} 1\n"), "{text}");
        assert!(text.contains("t_calls_seconds_count{op=\"Seven\"} 2\n"), "{text}");
        assert!(text.contains("weft_info{role=\"test\"} 1\n"), "{text}");
    }

    #[test]
    fn fabric_bytes_by_fabric_and_direction() {
        let m = Metrics::new("test");
        let b = FabricBytes::new(&m, "t_bytes", "bytes");
        b.add(fabric_index("unix:/x"), true, 10);
        b.add(fabric_index("127.0.0.1:1"), false, 7);
        b.add(9, false, 7);
        let text = m.encode();
        assert!(text.contains("t_bytes_total{fabric=\"shm\",direction=\"in\"} 10\n"), "{text}");
        assert!(text.contains("t_bytes_total{fabric=\"tcp\",direction=\"out\"} 7\n"), "{text}");
    }

    #[tokio::test]
    async fn the_endpoint_answers_get_metrics_and_refuses_the_rest() {
        let m = Metrics::new("test");
        let c = m.counter("t_hits", "hits");
        c.inc_by(42);
        let addr = m.listen("127.0.0.1:0").await.unwrap();
        let get = |req: &'static str| async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(req.as_bytes()).await.unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        let ok = get("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.0 200 OK\r\n"), "{ok}");
        assert!(ok.contains("t_hits_total 42\n"), "{ok}");
        assert!(get("GET / HTTP/1.1\r\n\r\n").await.starts_with("HTTP/1.0 404"));
        assert!(get("POST /metrics HTTP/1.1\r\n\r\n").await.starts_with("HTTP/1.0 405"));
    }
}
