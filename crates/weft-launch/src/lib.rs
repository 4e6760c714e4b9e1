//! A local cluster of real processes: one `weft meta` and N `weft data`, on loopback with ephemeral ports.
//!
//! Used by `weft up`, by `weft-bench` (one cluster per measured point) and by the integration tests. Each child
//! is given a TOML config under the cluster's directory and prints one line `WEFT-READY <addr>` on stdout once it
//! listens; its logs go to `DIR/logs/<role>.log`. The cluster is ready when the MDS reports every data server up.
//! Children are killed when the [`LocalCluster`] is dropped, so a failing test never leaves servers behind.
//!
//! Every cluster runs with a cluster key: `DIR/cluster.key` (mode 0600) is created unless present and named by
//! every config (`key_file`), the client's `cluster.toml` included; `LaunchOptions::auth = AuthMode::None` runs
//! without authentication instead. With keys, an empty clients keyring `DIR/clients.keyring` is created unless
//! present and named by every server's config (`clients_keyring`): `weft key add NAME --keyring DIR/clients.keyring`
//! issues per-client keys to the running cluster.
//!
//! With `LaunchOptions::tls` (on when `WEFT_TLS=1`, so a test run can put every cluster under TLS) the `tcp`
//! fabric runs under TLS 1.3: `DIR/tls/` gets a CA and a server certificate for the loopback names ([`tls`])
//! unless present, and every config names them.
//!
//! Tests can stop (SIGTERM), kill (SIGKILL) and restart the MDS and any single data server: a restarted process
//! gets its old address and directory back, so the rest of the cluster sees the same server return.
//!
//! With `LaunchOptions::cache = N` the cluster also runs N memcached daemons (the cache bank, issue 16), bound to
//! 127.0.0.1 only (memcached's text protocol has no authentication: see ARCHITECTURE.md), each on a port picked
//! free, without UDP, with `cache_mib` MiB of memory; `cluster.toml` and the MDS's config name them in their
//! `[cache]` tables (the daemons start first, so the MDS publishes to them from its first change). They can
//! be stopped, killed and restarted (empty, on the same port) one by one like the data servers.
//!
//! With `LaunchOptions::postgres` the metadata service keeps the namespace in PostgreSQL (`db`), in a server of
//! the cluster's own in `DIR/postgres` ([`postgres`]), started first and stopped last.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use weft_cache::CacheConfig;
use weft_client::{Client, ClusterConfig};
use weft_proto::{ServerInfo, ServerState};
use weft_rpc::AuthMode;

pub mod nfs;
pub mod postgres;
pub mod tls;

pub use nfs::{NfsGateway, NfsOptions};

/// The line a server prints on stdout when it listens.
pub const READY_PREFIX: &str = "WEFT-READY ";

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchError {
    #[error("cannot prepare {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("cannot start {role}: {source}")]
    Spawn { role: String, source: std::io::Error },
    #[error("{role} exited before it was ready; see {log}")]
    Died { role: String, log: PathBuf },
    #[error("cluster not ready after {waited_ms} ms: {detail}")]
    NotReady { waited_ms: u64, detail: String },
    #[error("{0}")]
    Key(weft_rpc::KeyError),
    #[error("{0}")]
    Keyring(weft_rpc::KeyringError),
    #[error("TLS certificates: {0}")]
    Cert(#[from] tls::CertError),
    #[error("PostgreSQL: {0}")]
    Postgres(String),
}

/// The clients keyring's file name in the cluster directory.
pub const CLIENTS_KEYRING: &str = "clients.keyring";

#[derive(Debug, Clone)]
pub struct LaunchOptions {
    /// The `weft` binary to run for each role.
    pub weft_bin: PathBuf,
    pub dir: PathBuf,
    pub servers: u32,
    /// `RUST_LOG` for the children.
    pub log_filter: String,
    /// Extra environment for the children (e.g. fault injection in tests).
    pub env: Vec<(String, String)>,
    /// Extra TOML lines appended to each data server's config.
    pub data_extra_toml: String,
    /// Extra TOML lines appended to the MDS's config (e.g. `capability_ttl_ms`).
    pub meta_extra_toml: String,
    /// How long to wait for the cluster to come up.
    pub ready_timeout_ms: u64,
    /// `Key` (default): every role proves `DIR/cluster.key`; `None`: no authentication.
    pub auth: AuthMode,
    /// memcached daemons of the cache bank (0: no bank).
    pub cache: u32,
    /// Memory of each memcached daemon (`-m`), MiB.
    pub cache_mib: u32,
    /// The bank's data block size, written into `cluster.toml`.
    pub cache_block_bytes: u32,
    /// Cache attributes and lookups (`attrs` in the `[cache]` tables of `cluster.toml` and the MDS's config).
    pub cache_attrs: bool,
    /// The bank's request and connect deadline (`request_timeout_ms`, `connect_timeout_ms`), for every role.
    pub cache_timeout_ms: u64,
    /// Run `tcp` under TLS with certificates in `DIR/tls/` (default: `WEFT_TLS=1` in the environment).
    pub tls: bool,
    /// Give every server a Prometheus endpoint on a free loopback port (`metrics_listen`), listed by
    /// [`LocalCluster::metrics_addrs`] and in `DIR/metrics.txt`. Off by default.
    pub metrics: bool,
    /// The MDS's `rebuild_after_ms` (a silent data server's slots move to spares after it; docs/format.md §19), with
    /// a `membership_interval_ms` of a tenth of it (at most 1 s) so tests see the change promptly. `None`: the
    /// MDS's defaults (five minutes).
    pub rebuild_after_ms: Option<u64>,
    /// Every data server also serves pNFS (docs/format.md §23) on an ephemeral loopback port (`nfs_listen =
    /// ["127.0.0.1:0"]`); [`LocalCluster::pnfs_devices`] lists the addresses. Off by default.
    pub ds_nfs: bool,
    /// Keep the namespace in PostgreSQL: a server of the cluster's own in `DIR/postgres` ([`postgres`]), named by
    /// the MDS's `db`, instead of the embedded store in `DIR/meta`. Default: `WEFT_META=postgres` in the
    /// environment (so a test run can put every cluster's namespace there), else off.
    pub postgres: bool,
    /// Metadata services on the one database (with `postgres`; the embedded store serves one): each listens on a
    /// port of its own, data servers heartbeat to all, clients fail over between them (docs/format.md §28).
    /// Default 1.
    pub meta_services: u32,
}

/// Whether `WEFT_META` asks for PostgreSQL (`postgres`): the default of [`LaunchOptions::postgres`].
pub fn postgres_from_env() -> bool {
    std::env::var("WEFT_META").is_ok_and(|v| v.trim() == "postgres")
}

/// Whether `WEFT_TLS` asks for TLS (`1`, `true`, `on` or `yes`): the default of [`LaunchOptions::tls`], as
/// `WEFT_FABRIC` is of the client's fabric.
pub fn tls_from_env() -> bool {
    std::env::var("WEFT_TLS").is_ok_and(|v| matches!(v.trim(), "1" | "true" | "on" | "yes"))
}

impl LaunchOptions {
    pub fn new(weft_bin: impl Into<PathBuf>, dir: impl Into<PathBuf>, servers: u32) -> LaunchOptions {
        LaunchOptions {
            weft_bin: weft_bin.into(),
            dir: dir.into(),
            servers,
            log_filter: "info".into(),
            env: Vec::new(),
            data_extra_toml: String::new(),
            meta_extra_toml: String::new(),
            ready_timeout_ms: 60_000,
            rebuild_after_ms: None,
            ds_nfs: false,
            postgres: postgres_from_env(),
            meta_services: 1,
            auth: AuthMode::Key,
            tls: tls_from_env(),
            cache: 0,
            cache_mib: 64,
            cache_block_bytes: CacheConfig::default().block_bytes,
            cache_attrs: true,
            cache_timeout_ms: CacheConfig::default().request_timeout_ms,
            metrics: false,
        }
    }
}

struct Proc {
    role: String,
    config: PathBuf,
    child: Child,
    addr: String,
    /// Its metrics endpoint (`host:port`), if it serves one.
    metrics: Option<String>,
}

pub struct LocalCluster {
    opts: LaunchOptions,
    /// The namespace's PostgreSQL server (`LaunchOptions::postgres`; `config` is its directory, `addr` its URL).
    postgres: Option<Proc>,
    /// The metadata services, the first one first (`LaunchOptions::meta_services`).
    mds: Vec<Proc>,
    data: Vec<Proc>,
    /// memcached daemons (`config` unused).
    cache: Vec<Proc>,
    /// The bank's key namespace for this cluster (random, so clusters sharing daemons never collide; 63 bits, as
    /// TOML integers are signed).
    cache_namespace: u64,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> LaunchError + '_ {
    move |source| LaunchError::Io { path: path.to_path_buf(), source }
}

impl LocalCluster {
    /// Starts the MDS, then the data servers, and waits until the MDS sees them all.
    pub async fn start(opts: LaunchOptions) -> Result<LocalCluster, LaunchError> {
        for sub in ["logs", "meta", "config"] {
            let p = opts.dir.join(sub);
            std::fs::create_dir_all(&p).map_err(io_err(&p))?;
        }
        let auth_toml = match opts.auth {
            AuthMode::Key => {
                let key = opts.dir.join("cluster.key");
                weft_rpc::Key::load_or_create(&key).map_err(LaunchError::Key)?;
                let keyring = opts.dir.join(CLIENTS_KEYRING);
                if !keyring.exists() {
                    weft_rpc::ClientKeys::default().save(&keyring).map_err(LaunchError::Keyring)?;
                }
                format!("key_file = {key:?}\nclients_keyring = {keyring:?}\n")
            }
            AuthMode::None => "auth = \"none\"\n".to_string(),
        };
        let auth_toml = if opts.tls {
            let files = tls::ensure_local(&opts.dir.join("tls"))?;
            let path = |p: Option<PathBuf>| p.unwrap_or_default();
            format!(
                "{auth_toml}tls = true\ntls_cert_file = {:?}\ntls_key_file = {:?}\ntls_ca_file = {:?}\n",
                path(files.cert_file),
                path(files.key_file),
                path(files.ca_file)
            )
        } else {
            auth_toml
        };
        let mut cluster = LocalCluster {
            postgres: None,
            mds: Vec::new(),
            data: Vec::new(),
            cache: Vec::new(),
            cache_namespace: random_u64() >> 1,
            opts,
        };
        let db_toml = if cluster.opts.postgres {
            let dir = cluster.opts.dir.join("postgres");
            let log = cluster.opts.dir.join("logs/postgres.log");
            let child = postgres::start(&dir, &log, cluster.opts.ready_timeout_ms).await?;
            let url = postgres::url(&dir);
            let db_toml = format!("db = {url:?}\n");
            cluster.postgres = Some(Proc { role: "postgres".into(), config: dir, child, addr: url, metrics: None });
            db_toml
        } else {
            String::new()
        };
        // The bank first: the MDS and the data servers publish to it from their first change on.
        for i in 0..cluster.opts.cache {
            let p = cluster.spawn_cache(i, None).await?;
            cluster.cache.push(p);
        }
        let cache_toml = match cluster.cache_config() {
            Some(c) => format!("\n[cache]\n{}", toml::to_string(&c).expect("a cache config always serialises")),
            None => String::new(),
        };
        let services = cluster.opts.meta_services.max(1);
        if services > 1 && !cluster.opts.postgres {
            return Err(LaunchError::NotReady {
                waited_ms: 0,
                detail: "several metadata services need the namespace in PostgreSQL (--meta postgres): the \
                         embedded store serves one"
                    .into(),
            });
        }
        let membership_toml = match cluster.opts.rebuild_after_ms {
            Some(ms) => format!("rebuild_after_ms = {ms}\nmembership_interval_ms = {}\n", (ms / 10).clamp(10, 1000)),
            None => String::new(),
        };
        for i in 0..services {
            let (role, file) = if i == 0 {
                ("meta".to_string(), "meta.toml".to_string())
            } else {
                (format!("meta{i}"), format!("meta{i}.toml"))
            };
            let meta_cfg = cluster.opts.dir.join("config").join(file);
            let text = format!(
                "listen = \"127.0.0.1:0\"\ndata_dir = {:?}\n{db_toml}{auth_toml}{membership_toml}{}{}\n{cache_toml}",
                cluster.opts.dir.join("meta"),
                metrics_toml(cluster.opts.metrics).map_err(io_err(&meta_cfg))?,
                cluster.opts.meta_extra_toml
            );
            std::fs::write(&meta_cfg, text).map_err(io_err(&meta_cfg))?;
            let mds = cluster.spawn(&role, "meta", &meta_cfg).await?;
            cluster.mds.push(mds);
        }
        let mds_addr = cluster.mds_addrs().join(",");
        for i in 0..cluster.opts.servers {
            let root = cluster.opts.dir.join(format!("data{i}"));
            std::fs::create_dir_all(&root).map_err(io_err(&root))?;
            let cfg = cluster.opts.dir.join(format!("config/data{i}.toml"));
            let nfs_toml = if cluster.opts.ds_nfs { "nfs_listen = [\"127.0.0.1:0\"]\n" } else { "" };
            let text = format!(
                "id = {i}\nlisten = \"127.0.0.1:0\"\nroot = {root:?}\nmds = \"{mds_addr}\"\n{auth_toml}{nfs_toml}{}{}\n{cache_toml}",
                metrics_toml(cluster.opts.metrics).map_err(io_err(&cfg))?,
                cluster.opts.data_extra_toml
            );
            std::fs::write(&cfg, text).map_err(io_err(&cfg))?;
            let p = cluster.spawn(&format!("data{i}"), "data", &cfg).await?;
            cluster.data.push(p);
        }
        cluster.wait_ready().await?;
        if cluster.opts.ds_nfs {
            cluster.wait_for_pnfs().await?;
        }
        let cfg_path = cluster.cluster_file();
        std::fs::write(&cfg_path, cluster.cluster_config().to_toml()).map_err(io_err(&cfg_path))?;
        if cluster.opts.metrics {
            let list = cluster.metrics_file();
            let text: String = cluster.metrics_addrs().iter().map(|(role, addr)| format!("{role} {addr}\n")).collect();
            std::fs::write(&list, text).map_err(io_err(&list))?;
        }
        Ok(cluster)
    }

    /// Starts `weft SUBCOMMAND --config CONFIG` and waits for its address. A metrics port found free a moment
    /// before may have been taken meanwhile by another process (there is no way to have it report an ephemeral
    /// one yet): a process that died of that is started again on another port, a few times.
    async fn spawn(&self, role: &str, subcommand: &str, config: &Path) -> Result<Proc, LaunchError> {
        let log = self.opts.dir.join(format!("logs/{role}.log"));
        for _ in 0..METRICS_PORT_TRIES {
            let logged = std::fs::metadata(&log).map_or(0, |m| m.len());
            match self.spawn_once(role, subcommand, config).await {
                Err(LaunchError::Died { .. }) if metrics_port_taken(&log, logged, config) => {
                    let text = std::fs::read_to_string(config).map_err(io_err(config))?;
                    let taken = config_metrics_listen(config).unwrap_or_default();
                    let fresh = format!("127.0.0.1:{}", free_port().map_err(io_err(config))?);
                    std::fs::write(config, text.replace(&taken, &fresh)).map_err(io_err(config))?;
                }
                r => return r,
            }
        }
        self.spawn_once(role, subcommand, config).await
    }

    async fn spawn_once(&self, role: &str, subcommand: &str, config: &Path) -> Result<Proc, LaunchError> {
        let log = self.opts.dir.join(format!("logs/{role}.log"));
        let log_file = std::fs::OpenOptions::new().create(true).append(true).open(&log).map_err(io_err(&log))?;
        let mut cmd = Command::new(&self.opts.weft_bin);
        cmd.arg(subcommand)
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", &self.opts.log_filter)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log_file))
            .kill_on_drop(true);
        for (k, v) in &self.opts.env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().map_err(|source| LaunchError::Spawn { role: role.into(), source })?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut lines = BufReader::new(stdout).lines();
        let wait = Duration::from_millis(self.opts.ready_timeout_ms);
        let addr = match tokio::time::timeout(wait, lines.next_line()).await {
            Ok(Ok(Some(line))) if line.starts_with(READY_PREFIX) => line[READY_PREFIX.len()..].trim().to_string(),
            Ok(_) => {
                return Err(LaunchError::Died { role: role.into(), log });
            }
            Err(_) => {
                return Err(LaunchError::NotReady {
                    waited_ms: self.opts.ready_timeout_ms,
                    detail: format!("{role} did not report its address; see {}", log.display()),
                });
            }
        };
        // Keep draining stdout so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let metrics = config_metrics_listen(config);
        Ok(Proc { role: role.into(), config: config.to_path_buf(), child, addr, metrics })
    }

    /// Starts memcached daemon `i` on `port`, or on a free port (tried again on another if it was taken meanwhile),
    /// and waits until it answers `version`.
    async fn spawn_cache(&self, i: u32, port: Option<u16>) -> Result<Proc, LaunchError> {
        let role = format!("cache{i}");
        let log = self.opts.dir.join(format!("logs/{role}.log"));
        let attempts = if port.is_some() { 1 } else { 5 };
        for _ in 0..attempts {
            let port = match port {
                Some(p) => p,
                None => free_port().map_err(io_err(&log))?,
            };
            let log_file = std::fs::OpenOptions::new().create(true).append(true).open(&log).map_err(io_err(&log))?;
            let err_file = log_file.try_clone().map_err(io_err(&log))?;
            let mut cmd = Command::new("memcached");
            // `-u nobody`: memcached refuses to run as root without -u and ignores it otherwise.
            cmd.args(["-l", "127.0.0.1", "-U", "0", "-u", "nobody"])
                .arg("-p")
                .arg(port.to_string())
                .arg("-m")
                .arg(self.opts.cache_mib.max(1).to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::from(log_file))
                .stderr(Stdio::from(err_file))
                .kill_on_drop(true);
            let child = cmd.spawn().map_err(|source| LaunchError::Spawn {
                role: format!("{role} (memcached; `make deps` installs it)"),
                source,
            })?;
            let mut p = Proc {
                role: role.clone(),
                config: PathBuf::new(),
                child,
                addr: format!("127.0.0.1:{port}"),
                metrics: None,
            };
            if wait_memcached(&mut p, self.opts.ready_timeout_ms).await? {
                return Ok(p);
            }
            // It exited: most likely another process took the port between our probe and its bind.
        }
        Err(LaunchError::Died { role, log })
    }

    async fn wait_ready(&self) -> Result<(), LaunchError> {
        self.wait_up(self.opts.servers).await
    }

    /// Polls the MDS until `servers` data servers are reported up.
    async fn wait_up(&self, servers: u32) -> Result<(), LaunchError> {
        self.wait_for_servers(|list| {
            let up = list.iter().filter(|s| s.state == ServerState::Up).count();
            (up as u32 >= servers).then_some(()).ok_or_else(|| format!("{up} of {servers} data servers registered"))
        })
        .await
    }

    /// Polls the MDS's server list until `check` accepts it; `check`'s complaint is the detail of a timeout.
    async fn wait_for_servers(&self, check: impl Fn(&[ServerInfo]) -> Result<(), String>) -> Result<(), LaunchError> {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(self.opts.ready_timeout_ms);
        let mut detail = String::from("no answer from the MDS");
        let cfg = self.cluster_config();
        while tokio::time::Instant::now() < deadline {
            if let Ok(c) = Client::connect(&cfg).await {
                match c.cluster_info().await {
                    Ok(list) => match check(&list) {
                        Ok(()) => {
                            c.close().await;
                            return Ok(());
                        }
                        Err(why) => detail = why,
                    },
                    Err(e) => detail = e.to_string(),
                }
                c.close().await;
            }
            // Polling readiness of freshly started processes; not a timing assumption.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(LaunchError::NotReady { waited_ms: self.opts.ready_timeout_ms, detail })
    }

    /// Polls the MDS until every data server announced its pNFS addresses (op 140 follows each registration).
    async fn wait_for_pnfs(&self) -> Result<(), LaunchError> {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(self.opts.ready_timeout_ms);
        let mut detail = String::from("no answer from the MDS");
        while tokio::time::Instant::now() < deadline {
            match self.pnfs_devices().await {
                Ok(list) if list.len() as u32 >= self.opts.servers => return Ok(()),
                Ok(list) => {
                    detail = format!("{} of {} data servers announced pNFS addresses", list.len(), self.opts.servers)
                }
                Err(e) => detail = e,
            }
            // Polling readiness of freshly started processes; not a timing assumption.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(LaunchError::NotReady { waited_ms: self.opts.ready_timeout_ms, detail })
    }

    /// The data servers' pNFS addresses as the MDS lists them (`PnfsDevices`, op 138), with [`LaunchOptions::ds_nfs`].
    pub async fn pnfs_devices(&self) -> Result<Vec<weft_client::PnfsDevice>, String> {
        let c = Client::connect(&self.cluster_config()).await.map_err(|e| e.to_string())?;
        let r = c.pnfs_devices().await.map_err(|e| e.to_string());
        c.close().await;
        r
    }

    pub fn mds_addr(&self) -> &str {
        self.mds.first().map(|p| p.addr.as_str()).unwrap_or("")
    }

    /// Every metadata service's address, the first one first (`LaunchOptions::meta_services`).
    pub fn mds_addrs(&self) -> Vec<String> {
        self.mds.iter().map(|p| p.addr.clone()).collect()
    }

    pub fn data_addrs(&self) -> Vec<String> {
        self.data.iter().map(|p| p.addr.clone()).collect()
    }

    /// Every server's metrics endpoint as (role, `127.0.0.1:PORT`): `meta`, then `data0`, `data1`, ... (with
    /// [`LaunchOptions::metrics`]; empty otherwise). Scrape `http://ADDR/metrics`.
    pub fn metrics_addrs(&self) -> Vec<(String, String)> {
        self.mds.iter().chain(&self.data).filter_map(|p| Some((p.role.clone(), p.metrics.clone()?))).collect()
    }

    /// `DIR/metrics.txt`: one line `ROLE ADDR` per metrics endpoint (what `weft top` reads).
    pub fn metrics_file(&self) -> PathBuf {
        self.opts.dir.join(METRICS_FILE)
    }

    /// The process ids of the running MDS, data servers, cache daemons and PostgreSQL server (its postmaster), in
    /// that order (for benches that read the servers' CPU time from /proc).
    pub fn pids(&self) -> Vec<u32> {
        self.mds
            .iter()
            .chain(&self.data)
            .chain(&self.cache)
            .chain(&self.postgres)
            .filter_map(|p| p.child.id())
            .collect()
    }

    /// The memcached daemons' addresses (`127.0.0.1:PORT`), in bank order.
    pub fn cache_addrs(&self) -> Vec<String> {
        self.cache.iter().map(|p| p.addr.clone()).collect()
    }

    /// The bank as `cluster.toml` names it, or `None` without daemons.
    pub fn cache_config(&self) -> Option<CacheConfig> {
        (!self.cache.is_empty()).then(|| CacheConfig {
            servers: self.cache_addrs(),
            namespace: self.cache_namespace,
            block_bytes: self.opts.cache_block_bytes,
            attrs: self.opts.cache_attrs,
            request_timeout_ms: self.opts.cache_timeout_ms,
            connect_timeout_ms: self.opts.cache_timeout_ms,
            ..CacheConfig::default()
        })
    }

    /// The key the bank's items are sealed under, as every role of this cluster derives it (the public key with
    /// authentication off): for tests and tools that read or plant items themselves.
    pub fn bank_key(&self) -> weft_cache::BankKey {
        let generation = self.cache_config().map_or(0, |c| c.key_generation);
        match self.opts.auth {
            AuthMode::Key => {
                let key = weft_rpc::Key::load(&self.key_file()).expect("the cluster's key file loads");
                weft_cache::BankKey::for_cluster(|parts| key.sign(parts), generation)
            }
            AuthMode::None => weft_cache::BankKey::public(),
        }
    }

    /// Root directory of data server `i`'s objects.
    pub fn data_root(&self, i: u32) -> PathBuf {
        self.opts.dir.join(format!("data{i}"))
    }

    pub fn dir(&self) -> &Path {
        &self.opts.dir
    }

    pub fn cluster_file(&self) -> PathBuf {
        self.opts.dir.join("cluster.toml")
    }

    /// The key file every role of this cluster proves (with authentication on).
    pub fn key_file(&self) -> PathBuf {
        self.opts.dir.join("cluster.key")
    }

    /// The clients keyring every server of this cluster reads (`weft key add --keyring`), with authentication on.
    pub fn clients_keyring(&self) -> PathBuf {
        self.opts.dir.join(CLIENTS_KEYRING)
    }

    /// The client's view of the cluster: the MDS address and the key (or `auth = "none"`).
    pub fn cluster_config(&self) -> ClusterConfig {
        let mut cfg = ClusterConfig::new(&self.mds_addrs().join(","));
        cfg.auth = self.opts.auth;
        if self.opts.auth == AuthMode::Key {
            cfg.key_file = Some(self.key_file());
        }
        if self.opts.tls {
            cfg.tls = true;
            cfg.tls_ca_file = Some(self.tls_ca_file());
        }
        cfg.cache = self.cache_config();
        cfg
    }

    /// Whether this cluster runs `tcp` under TLS.
    pub fn tls(&self) -> bool {
        self.opts.tls
    }

    /// The CA certificate the cluster's servers chain to (with TLS on).
    pub fn tls_ca_file(&self) -> PathBuf {
        self.opts.dir.join("tls").join(tls::CA_CERT_FILE)
    }

    /// A tcp fabric set up as this cluster's clients are (under TLS when the cluster has it), for tests and tools
    /// that talk to one server directly.
    pub fn tcp_fabric(&self) -> weft_fabric::TcpFabric {
        let tls = self.cluster_config().tls_config().expect("the cluster's own CA file loads");
        weft_fabric::TcpFabric::default().with_tls(tls)
    }

    /// An RPC client config carrying this cluster's key, for tests and tools that talk to one server directly.
    pub fn rpc_config(&self) -> weft_rpc::ClientConfig {
        let credential = match self.opts.auth {
            AuthMode::Key => weft_rpc::Key::load(&self.key_file()).ok().map(weft_rpc::Credential::cluster),
            AuthMode::None => None,
        };
        weft_rpc::ClientConfig { credential, ..weft_rpc::ClientConfig::default() }
    }

    /// A capability for `ino` with `rights`, valid for `ttl_ms`, sealed as the MDS seals them for a connection
    /// proving the cluster key (the empty one with authentication off): for tests and tools that talk to one data
    /// server directly with [`LocalCluster::rpc_config`].
    pub fn capability(&self, ino: u64, rights: weft_proto::Rights, ttl_ms: u64) -> weft_proto::Capability {
        let key = match self.opts.auth {
            AuthMode::Key => weft_rpc::Key::load(&self.key_file()).ok(),
            AuthMode::None => None,
        };
        let Some(key) = key else { return weft_proto::Capability::none() };
        let expiry_ms = weft_rpc::capability::unix_now_ms().saturating_add(ttl_ms);
        weft_rpc::CapabilityKey::derive(&key)
            .seal(ino, rights, expiry_ms, weft_rpc::auth::CLUSTER_KEY_ID, 0, 0)
            .unwrap_or_else(|_| weft_proto::Capability::none())
    }

    pub async fn client(&self) -> Result<Client, weft_client::ClientError> {
        Client::connect(&self.cluster_config()).await
    }

    /// Kills the (first) MDS with SIGKILL (no chance to clean up) and waits for it to die.
    pub async fn kill_mds(&mut self) {
        self.kill_meta_service(0).await
    }

    /// Kills metadata service `i` (0: the first) with SIGKILL and waits for it to die.
    pub async fn kill_meta_service(&mut self, i: usize) {
        if let Some(p) = self.mds.get_mut(i) {
            let _ = p.child.kill().await;
        }
    }

    /// Waits for the (first) MDS to exit on its own (a fault plan that ends it); returns its exit code.
    pub async fn wait_mds_exit(&mut self) -> Option<i32> {
        let p = self.mds.first_mut()?;
        p.child.wait().await.ok().and_then(|s| s.code())
    }

    /// Asks the (first) MDS to stop (SIGTERM) and waits for it to exit (SIGKILL if it takes over 10 s).
    pub async fn stop_mds(&mut self) {
        if let Some(p) = self.mds.first_mut() {
            stop_all(std::slice::from_mut(p)).await;
        }
    }

    /// Starts the (first) MDS again on the address it had, from the same store, and waits until every data server
    /// process still running is reported up (a stopped one is not waited for).
    pub async fn restart_mds(&mut self) -> Result<(), LaunchError> {
        self.restart_meta_service(0).await
    }

    /// [`LocalCluster::restart_mds`] of metadata service `i`.
    pub async fn restart_meta_service(&mut self, i: usize) -> Result<(), LaunchError> {
        assert!(i < self.mds.len(), "the cluster has no metadata service {i}");
        let p = self.respawn(&self.mds[i], "meta").await?;
        self.mds[i] = p;
        let running = self.data.iter_mut().map(|d| d.child.try_wait()).filter(|w| matches!(w, Ok(None))).count();
        self.wait_up(running as u32).await
    }

    /// Asks data server `i` to stop (SIGTERM) and waits for it to exit (SIGKILL if it takes over 10 s). The MDS
    /// reports it down once its liveness window passes without a heartbeat.
    /// Replaces the extra environment of the processes started from now on (e.g. fault injection in one restarted
    /// data server).
    pub fn set_env(&mut self, env: Vec<(String, String)>) {
        self.opts.env = env;
    }

    /// The process id of data server `i` while it runs (tests that kill it at a chosen moment from a hook).
    pub fn data_pid(&self, i: u32) -> Option<u32> {
        self.data.get(i as usize).and_then(|p| p.child.id())
    }

    pub async fn stop_data_server(&mut self, i: u32) {
        stop_all(std::slice::from_mut(self.data_proc(i))).await;
    }

    /// Kills data server `i` with SIGKILL (no chance to clean up) and waits for it to die.
    pub async fn kill_data_server(&mut self, i: u32) {
        let _ = self.data_proc(i).child.kill().await;
    }

    /// Starts data server `i` again, on the address it had and over the same root directory (stopping it first
    /// if it still runs), and waits until the MDS has heard the new process's heartbeat and reports it up.
    pub async fn restart_data_server(&mut self, i: u32) -> Result<(), LaunchError> {
        self.stop_data_server(i).await;
        let started = tokio::time::Instant::now();
        let old = &self.data[i as usize];
        let p = self.respawn(old, "data").await?;
        self.data[i as usize] = p;
        // A heartbeat younger than the time since the respawn began came from the new process: the old one was
        // dead by then. (Until the liveness window passes, the MDS still reports a killed server up.)
        self.wait_for_servers(|list| {
            let since_ms = started.elapsed().as_millis() as u64;
            match list.iter().find(|s| s.id == i) {
                Some(s) if (s.state.is_up() || s.state == ServerState::Draining) && s.heartbeat_age_ms < since_ms => {
                    Ok(())
                }
                Some(s) => Err(format!(
                    "data server {i} is {:?}, last heard {} ms ago, restarted {since_ms} ms ago",
                    s.state, s.heartbeat_age_ms
                )),
                None => Err(format!("the MDS does not know data server {i}")),
            }
        })
        .await
    }

    /// Asks memcached daemon `i` to stop (SIGTERM) and waits for it to exit.
    pub async fn stop_cache(&mut self, i: u32) {
        stop_all(std::slice::from_mut(self.cache_proc(i))).await;
    }

    /// Kills memcached daemon `i` with SIGKILL and waits for it to die.
    pub async fn kill_cache(&mut self, i: u32) {
        let _ = self.cache_proc(i).child.kill().await;
    }

    /// Starts memcached daemon `i` again, empty, on the port it had (stopping it first if it still runs), and
    /// waits until it answers.
    pub async fn restart_cache(&mut self, i: u32) -> Result<(), LaunchError> {
        self.stop_cache(i).await;
        let port = self.cache[i as usize].addr.rsplit_once(':').and_then(|(_, p)| p.parse().ok());
        let p = self.spawn_cache(i, port).await?;
        self.cache[i as usize] = p;
        Ok(())
    }

    fn cache_proc(&mut self, i: u32) -> &mut Proc {
        let n = self.cache.len();
        self.cache.get_mut(i as usize).unwrap_or_else(|| panic!("no cache daemon {i}: the cluster has {n}"))
    }

    fn data_proc(&mut self, i: u32) -> &mut Proc {
        let n = self.data.len();
        self.data.get_mut(i as usize).unwrap_or_else(|| panic!("no data server {i}: the cluster has {n}"))
    }

    /// Starts `old`'s role again with its config, pinned to the address it had (its config asked for port 0).
    async fn respawn(&self, old: &Proc, subcommand: &str) -> Result<Proc, LaunchError> {
        let text = std::fs::read_to_string(&old.config).map_err(io_err(&old.config))?;
        let text = text.replace("127.0.0.1:0", &old.addr);
        std::fs::write(&old.config, text).map_err(io_err(&old.config))?;
        self.spawn(&old.role, subcommand, &old.config).await
    }

    /// Asks every process to stop (SIGTERM) and waits for them.
    pub async fn stop(&mut self) {
        let mut all: Vec<Proc> = self.data.drain(..).collect();
        all.append(&mut self.mds);
        all.append(&mut self.cache);
        stop_all(&mut all).await;
        // The database last: it shuts down once the MDS's connections are gone.
        stop_all(&mut Vec::from_iter(self.postgres.take())).await;
    }

    /// The directory of the cluster's own PostgreSQL (its data and its socket), if it runs one.
    pub fn postgres_dir(&self) -> Option<&Path> {
        self.postgres.as_ref().map(|p| p.config.as_path())
    }

    /// The namespace's database (`LaunchOptions::postgres`), as the MDS's `db` names it.
    pub fn postgres_url(&self) -> Option<&str> {
        self.postgres.as_ref().map(|p| p.addr.as_str())
    }
}

/// A port on 127.0.0.1 that was free a moment ago (memcached cannot report an ephemeral port it bound without
/// writing a file, which it cannot do after dropping root).
/// The list of metrics endpoints in the cluster directory.
pub const METRICS_FILE: &str = "metrics.txt";

/// The `metrics_listen` line of a server's config: a free loopback port (fixed, so a restart keeps it), or none.
fn metrics_toml(on: bool) -> std::io::Result<String> {
    Ok(if on { format!("metrics_listen = \"127.0.0.1:{}\"\n", free_port()?) } else { String::new() })
}

/// The `metrics_listen` address a config file written by [`metrics_toml`] names.
fn config_metrics_listen(config: &Path) -> Option<String> {
    let text = std::fs::read_to_string(config).ok()?;
    let line = text.lines().find_map(|l| l.strip_prefix("metrics_listen = "))?;
    Some(line.trim().trim_matches('"').to_string())
}

/// Starts of a process whose metrics port was taken under it (see `LocalCluster::spawn`).
const METRICS_PORT_TRIES: usize = 3;

/// Whether the process that logged to `log` from byte `from` on died because its `metrics_listen` address (in
/// `config`) was in use.
fn metrics_port_taken(log: &Path, from: u64, config: &Path) -> bool {
    let Some(metrics) = config_metrics_listen(config) else { return false };
    let text = std::fs::read(log).unwrap_or_default();
    let tail = String::from_utf8_lossy(text.get(from as usize..).unwrap_or_default());
    tail.contains(&format!("listening on {metrics}")) && tail.contains("Address already in use")
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Polls memcached `p` until it answers `version` (`Ok(true)`), exits (`Ok(false)`), or the wait runs out.
async fn wait_memcached(p: &mut Proc, ready_timeout_ms: u64) -> Result<bool, LaunchError> {
    use tokio::io::AsyncWriteExt;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(ready_timeout_ms);
    while tokio::time::Instant::now() < deadline {
        if let Ok(Some(_)) = p.child.try_wait() {
            return Ok(false);
        }
        let probe = async {
            let mut s = tokio::net::TcpStream::connect(&p.addr).await?;
            s.write_all(b"version\r\n").await?;
            let mut line = String::new();
            BufReader::new(s).read_line(&mut line).await?;
            Ok::<bool, std::io::Error>(line.starts_with("VERSION "))
        };
        if let Ok(Ok(true)) = tokio::time::timeout(Duration::from_secs(1), probe).await {
            return Ok(true);
        }
        // Polling readiness of a freshly started process; not a timing assumption.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(LaunchError::NotReady {
        waited_ms: ready_timeout_ms,
        detail: format!("{} (memcached on {}) did not answer", p.role, p.addr),
    })
}

/// 64 random bits from the standard library's per-process hash keys (no dependency needed for a namespace).
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    h.finish()
}

/// Sends SIGTERM to every process still running, then waits for each (SIGKILL after 10 s). Processes already
/// waited for are left alone.
async fn stop_all(procs: &mut [Proc]) {
    for p in procs.iter() {
        if let Some(pid) = p.child.id() {
            terminate(pid);
        }
    }
    for p in procs.iter_mut() {
        match tokio::time::timeout(Duration::from_secs(10), p.child.wait()).await {
            Ok(_) => {}
            Err(_) => {
                tracing::warn!(role = %p.role, "did not stop within 10 s of SIGTERM; killing it");
                let _ = p.child.kill().await;
            }
        }
    }
}

/// Parses a size on a command line: `4096`, `4K`, `1M`, `2G`, `1T` (binary multiples).
pub fn parse_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.chars().last()?.to_ascii_uppercase() {
        'K' => (&s[..s.len() - 1], 1u64 << 10),
        'M' => (&s[..s.len() - 1], 1 << 20),
        'G' => (&s[..s.len() - 1], 1 << 30),
        'T' => (&s[..s.len() - 1], 1 << 40),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

mod signal {
    //! SIGTERM for children: the only FFI here.
    #![allow(unsafe_code)]

    pub fn terminate(pid: u32) {
        // SAFETY: kill(2) with a pid we spawned and still hold; a stale pid only yields ESRCH.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGTERM);
        }
    }
}
use signal::terminate;

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a death of this start, of its metrics address being in use, counts (not an older start's in the log).
    #[test]
    fn a_taken_metrics_port_is_recognised_in_this_starts_log_only() {
        let dir = std::env::temp_dir().join(format!("weft-launch-metrics-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (config, log) = (dir.join("data0.toml"), dir.join("data0.log"));
        std::fs::write(&config, "listen = \"127.0.0.1:0\"\nmetrics_listen = \"127.0.0.1:42071\"\n").unwrap();
        let died =
            "Error: data server failed\n    0: listening on 127.0.0.1:42071: Address already in use (os error 98)\n";
        std::fs::write(&log, died).unwrap();
        assert!(metrics_port_taken(&log, 0, &config));
        assert!(!metrics_port_taken(&log, died.len() as u64, &config), "an earlier start's death");
        std::fs::write(&log, "    0: listening on 127.0.0.1:7100: Address already in use (os error 98)\n").unwrap();
        assert!(!metrics_port_taken(&log, 0, &config), "another address taken is not the metrics port");
        std::fs::write(&config, "listen = \"127.0.0.1:0\"\n").unwrap();
        std::fs::write(&log, died).unwrap();
        assert!(!metrics_port_taken(&log, 0, &config), "no metrics port configured");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
