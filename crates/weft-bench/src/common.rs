//! What every workload shares: the clusters it measures (a fresh local cluster per `--servers` point, or a running
//! one given with `--cluster`), rounding of reported figures, and writing the JSON document with its chart.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::{Value, json};
use weft_client::{AuthMode, Client, ClusterConfig, FabricChoice};
use weft_launch::{LaunchOptions, LocalCluster};

/// The clusters one bench command measures.
pub struct Targets {
    base_dir: PathBuf,
    /// Remove `base_dir` itself at the end: it is the default one under /tmp. A `--dir` is never removed (it may
    /// hold the JSON output, or anything else of the caller's); only the per-point directories we made in it are.
    remove_base: bool,
    servers: Vec<u32>,
    spec: Option<String>,
    /// `--delay-us` and `--short-circuit` of [`SharedArgs`].
    delay_us: u64,
    short_circuit: Option<ShortCircuit>,
    /// `--tls`: clusters started here run `tcp` plain (false) and/or under TLS (true), every point once per mode.
    tls_modes: Vec<bool>,
    /// `--auth` of [`SharedArgs`]: every point is measured once per mode.
    auths: Vec<AuthMode>,
}

/// One cluster to measure: how many data servers (`None`: the `--cluster` given) and its security mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Point {
    pub servers: Option<u32>,
    pub auth: AuthMode,
    /// `tcp` under TLS.
    pub tls: bool,
}

/// Sandia's short circuits: a layer answers without doing its work, to show the ceiling of the layers above it.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShortCircuit {
    /// Data servers discard writes and serve zeros, never touching the disk.
    Server,
    /// The client stops at the wire: reads and writes are planned but never sent; reads return zeros.
    Network,
}

/// The fabric options of this run, recorded in every document's config by [`emit`].
static FABRIC_OPTIONS: std::sync::OnceLock<Value> = std::sync::OnceLock::new();

/// One cluster being measured: `servers` data servers, reachable with `cfg`.
pub struct Target {
    pub servers: u32,
    /// `key` (keys, sessions bound to them, capabilities) or `none`: recorded in every result.
    pub auth: &'static str,
    pub cfg: ClusterConfig,
    cluster: Option<LocalCluster>,
}

impl Targets {
    /// `servers` is the `--servers` list (ignored with `--cluster`), `dir` the `--dir` under which clusters start.
    pub fn new(servers: &str, cluster: Option<&str>, dir: Option<&Path>) -> Result<Targets> {
        let servers: Vec<u32> =
            crate::parse_list(servers, |x| x.parse().ok()).context("--servers wants a list like 1,2,4")?;
        if servers.contains(&0) {
            anyhow::bail!("--servers: a cluster needs at least one data server");
        }
        let (base_dir, remove_base) = match dir {
            Some(d) => (d.to_path_buf(), false),
            None => (std::env::temp_dir().join(format!("weft-bench-{}", std::process::id())), true),
        };
        Ok(Targets {
            base_dir,
            remove_base,
            servers,
            spec: cluster.map(str::to_string),
            delay_us: 0,
            short_circuit: None,
            auths: vec![AuthMode::Key],
            tls_modes: vec![false],
        })
    }

    /// Applies `--delay-us` and `--short-circuit` to every cluster measured.
    pub fn tuned(mut self, a: &SharedArgs) -> Result<Targets> {
        if a.short_circuit == Some(ShortCircuit::Server) && self.spec.is_some() {
            anyhow::bail!("--short-circuit server needs clusters the bench starts (not --cluster)");
        }
        self.delay_us = a.delay_us;
        self.short_circuit = a.short_circuit;
        self.auths = auth_choices(&a.auth)?;
        if self.spec.is_some() && self.auths != [AuthMode::Key] {
            anyhow::bail!("--auth needs clusters the bench starts (a --cluster runs as it was configured)");
        }
        // A `--cluster` file says `tls = true` itself; `--tls` is for the clusters started here.
        self.tls_modes = tls_choices(&a.tls)?;
        if self.spec.is_some() && self.tls_modes != [false] {
            anyhow::bail!("--tls needs clusters the bench starts (a --cluster file says `tls = true` itself)");
        }
        let name = a.short_circuit.map(|s| format!("{s:?}").to_lowercase());
        let _ = FABRIC_OPTIONS.set(json!({"delay_us": a.delay_us, "short_circuit": name, "tls": a.tls}));
        Ok(self)
    }

    /// The points to measure: one per `--servers` value and `--auth` mode, or the one `--cluster`.
    pub fn points(&self) -> Vec<Point> {
        if self.spec.is_some() {
            return vec![Point { servers: None, auth: AuthMode::Key, tls: false }];
        }
        let mut points = Vec::new();
        for &n in &self.servers {
            for &auth in &self.auths {
                for &tls in &self.tls_modes {
                    points.push(Point { servers: Some(n), auth, tls });
                }
            }
        }
        points
    }

    /// Starts the cluster of one point (or connects to the given one to count its data servers).
    pub async fn start(&self, point: Point) -> Result<Target> {
        self.start_with(point, "", |_| ()).await
    }

    /// [`Targets::start`], with `tune` adjusting the launch options of a cluster started here (e.g. its cache
    /// bank) and `tag` added to its directory's name.
    pub async fn start_with(&self, point: Point, tag: &str, tune: impl FnOnce(&mut LaunchOptions)) -> Result<Target> {
        match (point.servers, &self.spec) {
            (Some(n), _) => {
                let auth = auth_name(point.auth);
                let tls = if point.tls { "-tls" } else { "" };
                let dir = self.base_dir.join(format!("servers-{n}-auth-{auth}{tls}{tag}"));
                let _ = std::fs::remove_dir_all(&dir);
                let mut opts = LaunchOptions::new(crate::weft_exe()?, &dir, n);
                opts.log_filter = "warn".into();
                opts.auth = point.auth;
                opts.tls = point.tls;
                if self.short_circuit == Some(ShortCircuit::Server) {
                    opts.data_extra_toml.push_str("short_circuit = true\n");
                }
                tune(&mut opts);
                eprintln!("starting a cluster with {n} data servers, auth {auth}, in {}", dir.display());
                let cl = LocalCluster::start(opts).await?;
                let cfg = self.tune(cl.cluster_config());
                Ok(Target { servers: n, auth, cfg, cluster: Some(cl) })
            }
            (None, Some(spec)) => {
                let cfg = self.tune(ClusterConfig::from_spec(spec).map_err(anyhow::Error::msg)?);
                let c = Client::connect(&cfg).await?;
                let n = c.cluster_info().await?.len() as u32;
                c.close().await;
                let auth = auth_name(cfg.auth);
                Ok(Target { servers: n, auth, cfg, cluster: None })
            }
            (None, None) => unreachable!("a point without --cluster always has a server count"),
        }
    }

    fn tune(&self, mut cfg: ClusterConfig) -> ClusterConfig {
        cfg.client.send_delay_us = self.delay_us;
        cfg.client.short_circuit_network = self.short_circuit == Some(ShortCircuit::Network);
        cfg
    }

    /// Removes the default `base_dir`. A `--dir` is left in place: `Target::stop` already removed the per-point
    /// directories in it.
    pub fn finish(self) {
        if self.remove_base {
            let _ = std::fs::remove_dir_all(&self.base_dir);
        }
    }
}

impl Target {
    /// The `cluster.toml` of a cluster started here (what `weft mount --cluster` takes).
    pub fn cluster_file(&self) -> Option<PathBuf> {
        self.cluster.as_ref().map(LocalCluster::cluster_file)
    }

    /// The cluster we started (`None` for a `--cluster`).
    pub fn cluster(&self) -> Option<&LocalCluster> {
        self.cluster.as_ref()
    }

    /// The cluster we started, to stop, kill or restart one of its servers (`None` for a `--cluster`).
    pub fn cluster_mut(&mut self) -> Option<&mut LocalCluster> {
        self.cluster.as_mut()
    }

    /// Stops a cluster we started and removes its directory.
    pub async fn stop(self) {
        if let Some(mut cl) = self.cluster {
            cl.stop().await;
            let _ = std::fs::remove_dir_all(cl.dir());
        }
    }
}

/// Prints the Markdown table, then writes the JSON document (built by [`crate::doc::Document`]) and, beside it,
/// its SVG chart. The fabric options of this run, if any, go into the document's config.
pub fn emit(doc: &Value, table: &str, json: Option<&Path>, svg: impl FnOnce(&Value) -> String) -> Result<()> {
    let mut doc = doc.clone();
    if let (Some(f), Some(c)) = (FABRIC_OPTIONS.get(), doc.get_mut("config").and_then(Value::as_object_mut)) {
        c.insert("fabric_options".into(), f.clone());
    }
    let doc = &doc;
    println!("{table}");
    if let Some(path) = json {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(path, serde_json::to_string_pretty(doc)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
        let svg_path = path.with_extension("svg");
        std::fs::write(&svg_path, svg(doc)).with_context(|| format!("writing {}", svg_path.display()))?;
        eprintln!("wrote {} and {}", path.display(), svg_path.display());
    }
    Ok(())
}

/// Parses `--tls`: a comma-separated list of `off` and `on` (also `0`/`1`, `false`/`true`, as `WEFT_TLS` says).
pub fn tls_choices(list: &str) -> Result<Vec<bool>> {
    crate::parse_list(list, |x| match x {
        "off" | "0" | "false" | "no" | "" => Some(false),
        "on" | "1" | "true" | "yes" => Some(true),
        _ => None,
    })
    .context("--tls wants a list like off,on")
}

/// Parses `--auth`: a comma-separated list of `key` and `none`.
pub fn auth_choices(list: &str) -> Result<Vec<AuthMode>> {
    crate::parse_list(list, |x| match x {
        "key" => Some(AuthMode::Key),
        "none" => Some(AuthMode::None),
        _ => None,
    })
    .context("--auth wants a list like key,none")
}

/// The name of a security mode in results and logs.
pub fn auth_name(auth: AuthMode) -> &'static str {
    match auth {
        AuthMode::Key => "key",
        AuthMode::None => "none",
    }
}

/// Parses `--fabric`: a comma-separated list of `auto`, `tcp`, `shm`, `rdma`.
pub fn fabric_choices(list: &str) -> Result<Vec<FabricChoice>> {
    list.split(',')
        .map(|f| f.trim().parse().map_err(anyhow::Error::msg))
        .collect::<Result<_>>()
        .context("--fabric wants a list like tcp,shm")
}

/// The fabric `client` actually used to reach the data servers: the name of every fabric its open data-server
/// sessions use (`tcp`, `tls` for tcp under TLS, `shm`, `rdma`), several joined by `+`. A client that opened no data-server session only
/// spoke to the MDS, over TCP: `tcp`.
pub async fn fabric_used(client: &Client) -> String {
    merge_fabrics(client.fabrics().await.iter().map(|(_, name)| *name))
}

/// One fabric name for several clients' (or sessions') fabric names, each maybe already joined by `+`: the distinct
/// names, sorted, joined by `+`; `tcp` for none.
pub fn merge_fabrics<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let mut v: Vec<&str> = names.into_iter().flat_map(|n| n.split('+')).filter(|n| !n.is_empty()).collect();
    v.sort_unstable();
    v.dedup();
    if v.is_empty() { "tcp".to_string() } else { v.join("+") }
}

/// The command line as run.
pub fn command_line() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

/// The command line as run, word by word.
pub fn argv() -> Vec<String> {
    std::env::args().collect()
}

/// The 1-minute load average before and after each run of a point (`uptime`'s first figure), so a run taken
/// while the shared machine was busy shows in its result.
#[derive(Debug, Default, Clone)]
pub struct Loads {
    pub before: Vec<f64>,
    pub after: Vec<f64>,
}

impl Loads {
    /// Call just before a run, and [`Loads::end`] just after it.
    pub fn start(&mut self) {
        self.before.push(crate::ceilings::load1());
    }
    pub fn end(&mut self) {
        self.after.push(crate::ceilings::load1());
    }
    /// Adds `load_1min_before` and `load_1min_after` (one figure per run) to a result object.
    pub fn annotate(&self, r: &mut Value) {
        if let Some(o) = r.as_object_mut() {
            o.insert("load_1min_before".into(), json!(self.before));
            o.insert("load_1min_after".into(), json!(self.after));
        }
    }
    /// The largest load seen.
    pub fn max(&self) -> f64 {
        self.before.iter().chain(&self.after).copied().fold(0.0, f64::max)
    }
}

/// A progress bar on stderr counting `len` steps; drawn only when stderr is a terminal, so tests and CI logs stay
/// clean.
pub fn progress(len: u64, what: &str) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(len);
    let style = indicatif::ProgressStyle::with_template("{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}")
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    pb.set_style(style);
    pb.set_prefix(what.to_string());
    pb
}

pub fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Microseconds since `t`.
pub fn micros_since(t: std::time::Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e6
}

/// Which figure of a result is its headline: the one whose min and max over the runs are reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Headline {
    OpsPerS,
    P50,
}

/// One op's measurements over the runs of one point.
#[derive(Debug, Default, Clone)]
pub struct OpRuns {
    /// Operations per run (the same every run).
    pub ops: u64,
    pub ops_per_s: Vec<f64>,
    pub mib_per_s: Vec<f64>,
    pub cpu_us_per_op: Vec<f64>,
    pub mean_us: Vec<f64>,
    pub p50_us: Vec<f64>,
    pub p99_us: Vec<f64>,
    /// The 1-minute load average around each run.
    pub loads: Loads,
}

impl OpRuns {
    /// Records the load average of one run: `before` as read when it started, and now as its end.
    pub fn push_load(&mut self, before: f64) {
        self.loads.before.push(before);
        self.loads.end();
    }

    /// Records one run: `ops` operations moving `bytes` in `secs`, the client using `cpu_s`; `lat_us` holds the
    /// per-call latencies (may be empty: no percentiles then).
    pub fn push(&mut self, ops: u64, bytes: u64, secs: f64, cpu_s: f64, lat_us: &mut [f64]) -> Result<()> {
        if ops == 0 || secs <= 0.0 {
            anyhow::bail!("a run did no operations");
        }
        self.ops = ops;
        self.ops_per_s.push(ops as f64 / secs);
        if bytes > 0 {
            self.mib_per_s.push(bytes as f64 / (1u64 << 20) as f64 / secs);
        }
        self.cpu_us_per_op.push(cpu_s * 1e6 / ops as f64);
        if let Some(l) = crate::stats::latency(lat_us) {
            self.mean_us.push(l.mean);
            self.p50_us.push(l.p50);
            self.p99_us.push(l.p99);
        }
        Ok(())
    }

    /// Adds `op`, the medians over the runs, `runs`, and `min`/`max` of the headline to the object `base`.
    pub fn result(&self, base: &Value, op: &str, headline: Headline) -> Value {
        let med = |v: &[f64]| crate::stats::summarize(v).map(|s| round1(s.median));
        let mut r = base.clone();
        let o = r.as_object_mut().expect("a result is an object");
        o.insert("op".into(), op.into());
        o.insert("ops".into(), self.ops.into());
        o.insert("ops_per_s".into(), med(&self.ops_per_s).into());
        if !self.mib_per_s.is_empty() {
            o.insert("mib_per_s".into(), med(&self.mib_per_s).into());
        }
        o.insert("client_cpu_us_per_op".into(), med(&self.cpu_us_per_op).into());
        if !self.p50_us.is_empty() {
            o.insert("mean_us".into(), med(&self.mean_us).into());
            o.insert("p50_us".into(), med(&self.p50_us).into());
            o.insert("p99_us".into(), med(&self.p99_us).into());
        }
        let head = match headline {
            Headline::OpsPerS => &self.ops_per_s,
            Headline::P50 => &self.p50_us,
        };
        let s = crate::stats::summarize(head);
        o.insert("runs".into(), s.map_or(0, |s| s.runs).into());
        o.insert("min".into(), s.map(|s| round1(s.min)).into());
        o.insert("max".into(), s.map(|s| round1(s.max)).into());
        if !self.loads.before.is_empty() {
            self.loads.annotate(&mut r);
        }
        r
    }
}

/// Flags every workload that runs against a cluster shares: repetitions, where the cluster is, where results go.
#[derive(clap::Args, Clone, Debug)]
pub struct SharedArgs {
    /// Repetitions per point (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Use this running cluster instead of starting one per point.
    #[arg(long, value_name = "PATH|ADDR")]
    pub cluster: Option<String>,
    /// Where to start clusters, each in a subdirectory removed when done (default: a fresh directory under /tmp).
    #[arg(long)]
    pub dir: Option<std::path::PathBuf>,
    /// Write results here (an SVG chart is written beside it).
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Fabrics to measure, every point once per fabric, e.g. `tcp,shm` (auto: shm to same-host servers, rdma to
    /// others that offer it). Every result records the fabric the client actually used.
    #[arg(long, env = "WEFT_FABRIC", default_value = "tcp")]
    pub fabric: String,
    /// Delay every request this many µs before it is sent (a one-way WAN delay; netem is not available here).
    #[arg(long, default_value_t = 0)]
    pub delay_us: u64,
    /// Short-circuit a layer (Sandia): `server` discards writes and serves zeros, `network` skips the wire.
    #[arg(long, value_enum)]
    pub short_circuit: Option<ShortCircuit>,
    /// Security of the clusters the bench starts, every point once per mode: `key` (cluster key, authenticated
    /// sessions, capabilities: the default) and/or `none` (no authentication), e.g. `key,none`.
    #[arg(long, default_value = "key")]
    pub auth: String,
    /// `tcp` of the clusters the bench starts, every point once per mode: `off` (plain, the default) and/or `on`
    /// (TLS 1.3, certificates made in each cluster's directory), e.g. `off,on`. Results over TLS record the fabric
    /// `tls`. `WEFT_TLS=1` means `on`.
    #[arg(long, env = "WEFT_TLS", default_value = "off")]
    pub tls: String,
}

/// Runs the future `make` returns on a current-thread runtime of a thread of its own, and waits for it: a client
/// that makes one call at a time then waits for each reply on the thread that polls its sockets (one wake-up per
/// reply), not on a caller blocked while a runtime worker polls for it (two). Every client the future makes
/// lives and dies inside it. Blocks the calling thread meanwhile.
pub fn on_one_thread<T, F>(make: impl FnOnce() -> F + Send) -> Result<T>
where
    T: Send,
    F: std::future::Future<Output = Result<T>>,
{
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                rt.block_on(make())
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// The metadata addresses `mds` (comma-separated) in the order a client tries them, starting at service
/// `k` mod their number and going on with the others in order.
pub(crate) fn starting_at(mds: &str, k: usize) -> String {
    let addrs: Vec<&str> = mds.split(',').map(str::trim).filter(|a| !a.is_empty()).collect();
    let k = k % addrs.len().max(1);
    addrs[k..].iter().chain(&addrs[..k]).copied().collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_runs_report_medians_and_the_headline_range() {
        let mut o = OpRuns::default();
        o.push(100, 100 << 20, 1.0, 0.001, &mut [3.0, 1.0, 2.0]).unwrap();
        o.push(100, 100 << 20, 2.0, 0.002, &mut [5.0, 5.0, 5.0]).unwrap();
        o.push(100, 100 << 20, 4.0, 0.004, &mut [9.0, 8.0, 7.0]).unwrap();
        assert!(o.push(0, 0, 1.0, 0.0, &mut []).is_err());
        let base = serde_json::json!({"servers": 4});
        let r = o.result(&base, "read", Headline::OpsPerS);
        assert_eq!(r["servers"], 4);
        assert_eq!(r["op"], "read");
        assert_eq!(r["ops"], 100);
        assert_eq!(r["ops_per_s"], 50.0);
        assert_eq!(r["mib_per_s"], 50.0);
        assert_eq!(r["client_cpu_us_per_op"], 20.0);
        assert_eq!(r["p50_us"], 5.0);
        assert_eq!(r["p99_us"], 5.0);
        assert_eq!(r["runs"], 3);
        assert_eq!((r["min"].as_f64(), r["max"].as_f64()), (Some(25.0), Some(100.0)));
        let r = o.result(&base, "read", Headline::P50);
        assert_eq!((r["min"].as_f64(), r["max"].as_f64()), (Some(2.0), Some(8.0)));
    }

    #[test]
    fn fabric_names_merge_distinct_and_sorted() {
        assert_eq!(merge_fabrics([]), "tcp");
        assert_eq!(merge_fabrics(["shm", "shm"]), "shm");
        assert_eq!(merge_fabrics(["tcp", "shm", "tcp"]), "shm+tcp");
        assert_eq!(merge_fabrics(["shm+tcp", "rdma"]), "rdma+shm+tcp");
        assert_eq!(fabric_choices("tcp, shm").unwrap(), [FabricChoice::Tcp, FabricChoice::Shm]);
        assert!(fabric_choices("tcp,ib").is_err());
        assert_eq!(auth_choices("key,none").unwrap(), [AuthMode::Key, AuthMode::None]);
        assert!(auth_choices("key,off").is_err());
        assert_eq!(tls_choices("off,on").unwrap(), [false, true]);
        assert_eq!(tls_choices("1").unwrap(), [true]);
        assert!(tls_choices("maybe").is_err());
    }
}
