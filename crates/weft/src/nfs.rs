//! `weft nfs`: runs an NFS gateway (crate `weft-nfs`) in this process until Ctrl-C or SIGTERM.

use anyhow::{Context, Result};

/// The options of `weft nfs`.
#[derive(clap::Args, Clone, Debug)]
pub struct NfsArgs {
    /// Address to serve NFSv3, MOUNT and NFSv4.1 on, all on this one port (port 0: any free port, reported at start).
    /// Clients are told the port: `mount -o port=P,mountport=P`; rpcbind is not used.
    #[arg(long, default_value = "127.0.0.1:2049")]
    pub listen: String,
    /// The Weft directory to export (`/`: the whole namespace). Clients mount it as `HOST:/` or by its path.
    #[arg(long, default_value = "/")]
    pub export: String,
    /// Client addresses served (comma-separated CIDRs); others are refused (MNT3ERR_ACCES, AUTH_ERROR).
    #[arg(long, value_name = "CIDRS", default_value = "127.0.0.0/8,::1/128")]
    pub allow: String,
    /// Map uid 0 and gid 0 of callers to nobody (65534), as knfsd's root_squash (the default).
    #[arg(long, overrides_with = "no_root_squash")]
    pub root_squash: bool,
    /// Serve root as root: only for trusted client machines.
    #[arg(long, overrides_with = "root_squash")]
    pub no_root_squash: bool,
    /// As knfsd's `secure`: AUTH_SYS calls only from privileged source ports (below 1024, which only root binds),
    /// so an unprivileged process on an allowed host cannot assert another user's uid. The default is on when
    /// `--allow` names any address outside loopback, off for loopback only.
    #[arg(long, overrides_with = "insecure")]
    pub secure: bool,
    /// AUTH_SYS from any source port (knfsd's `insecure`): for clients that cannot bind a privileged port.
    #[arg(long, overrides_with = "secure")]
    pub insecure: bool,
    /// A connection with nothing to read for this long is closed (the client reconnects on its next call).
    #[arg(long, default_value_t = 360_000)]
    pub idle_timeout_ms: u64,
    /// A record begun must arrive whole within this, or the connection is closed.
    #[arg(long, default_value_t = 30_000)]
    pub frame_timeout_ms: u64,
    /// A reply the client does not read within this closes the connection.
    #[arg(long, default_value_t = 30_000)]
    pub send_timeout_ms: u64,
    /// Open files kept between READs and WRITEs (each costs one MDS open when first used).
    #[arg(long, default_value_t = 1024)]
    pub open_files_max: usize,
    /// An open file unused this long is synced and closed.
    #[arg(long, default_value_t = 5000)]
    pub open_idle_ms: u64,
    /// Files (per user) whose sequential reader gets its next ranges read ahead (0: no read-ahead); each holds at
    /// most `--read-ahead-depth` ranges of one READ's size (≤ 1 MiB).
    #[arg(long, default_value_t = 16)]
    pub read_ahead_files_max: usize,
    /// Ranges read ahead per file (0: no read-ahead).
    #[arg(long, default_value_t = 2)]
    pub read_ahead_depth: usize,
    /// Connections served at once; more wait.
    #[arg(long, default_value_t = 256)]
    pub connections_max: usize,
    /// Requests of one connection run at once; the connection is read no further until one finishes.
    #[arg(long, default_value_t = 32)]
    pub requests_in_flight_max: usize,
    /// NFSv4.1 lease: a client silent this long loses its opens and locks.
    #[arg(long, default_value_t = 90_000)]
    pub nfs4_lease_ms: u64,
    /// NFSv4.1 grace period after every start: only reclaims of opens and locks (clients of the previous run)
    /// are served for this long; new opens and locks get NFS4ERR_GRACE and are retried by the client.
    #[arg(long, default_value_t = 90_000)]
    pub nfs4_grace_ms: u64,
    /// pNFS: a layout recalled (CB_LAYOUTRECALL, when its file is truncated, removed or its access changes) and
    /// not returned this long after is revoked; a client that leaves the callback unanswered this long loses its
    /// back channel until it binds one again.
    #[arg(long, default_value_t = 10_000)]
    pub nfs4_recall_ms: u64,
    /// NFSv4.1 clients alive at once from one IP address; past it a new client owner from that address is
    /// NFS4ERR_RESOURCE, logged with the address (a Linux host makes one client per server and network namespace).
    #[arg(long, default_value_t = 64)]
    pub nfs4_clients_per_address: usize,
    /// NFSv4.1 sessions one client holds at once; past it its CREATE_SESSION is NFS4ERR_RESOURCE, logged.
    #[arg(long, default_value_t = 16)]
    pub nfs4_sessions_per_client: usize,
    /// NFSv4.1 open and lock stateids one client holds at once; past it its OPEN and a new lock-owner's LOCK are
    /// NFS4ERR_RESOURCE, logged with the client's owner string.
    #[arg(long, default_value_t = 16_384)]
    pub nfs4_stateids_per_client: usize,
    /// A directory this gateway alone keeps its restart state in (its MDS session, docs/format.md §22): a gateway
    /// restarted on it (after `kill -9` too) takes over the old process's locks and holds them through the grace
    /// period for their clients to reclaim. Without it, a restarted gateway's clients find their old locks held
    /// until the MDS releases them (`locks_grace_ms`). `weft up --nfs` uses DATA_DIR/nfs-state.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<std::path::PathBuf>,
    /// Also serve NFS over RDMA (RPC-over-RDMA v1, RFC 8166) on this address with RDMA CM, e.g. `0.0.0.0:20049`
    /// (clients: `mount -o proto=rdma,port=20049`). Off by default; with no RDMA device the gateway says so and
    /// serves TCP only.
    #[arg(long, value_name = "ADDR")]
    pub rdma_listen: Option<std::net::SocketAddr>,
    /// Credits granted to each RDMA client (RFC 8166 §3.3.1): receive buffers posted per connection.
    #[arg(long, default_value_t = 32)]
    pub rdma_credits: u32,
    /// pNFS for NFSv4.1 clients (`mount -o vers=4.1`): the gateway hands out file layouts and clients read and
    /// write plain files on the data servers directly, in parallel. `auto` (the default): on if the data servers
    /// advertised NFS addresses (their `nfs_listen`) when the gateway started; `on`; `off`: every byte through the
    /// gateway. Erasure-coded and mirrored files are always served through the gateway.
    #[arg(long, value_name = "auto|on|off", default_value = "auto")]
    pub pnfs: weft_nfs::PnfsMode,
    /// pNFS: how often (ms) the files with layouts out are checked for changes made elsewhere (a native client's
    /// truncate or chmod, a removal, a rebuild moving a stripe), one getattr each; a change recalls the file's
    /// layouts. 0: never (changes through the gateway still recall).
    #[arg(long, default_value_t = 3_000)]
    pub layout_check_ms: u64,
    /// Hold no metadata leases: every GETATTR and LOOKUP asks the MDS (or the cache bank). By default the gateway
    /// holds leases, answers them from its cache while the MDS holds the leases, and the MDS recalls a lease
    /// before another client's change of that inode or directory completes (docs/format.md §31).
    #[arg(long)]
    pub no_metadata_leases: bool,
}

/// Runs the gateway; `ready` is told the bound address (the launcher's readiness line).
pub async fn run(cluster_spec: &str, args: &NfsArgs, ready: fn(&str)) -> Result<()> {
    let cluster = weft_client::ClusterConfig::from_spec(cluster_spec).map_err(anyhow::Error::msg)?;
    let allow = weft_nfs::parse_allow(&args.allow).map_err(anyhow::Error::msg).context("--allow")?;
    let secure = match (args.secure, args.insecure) {
        (true, _) => true,
        (_, true) => false,
        _ => !allow.iter().all(|c| c.is_loopback()),
    };
    let cfg = weft_nfs::GatewayConfig {
        export: args.export.clone(),
        allow,
        secure,
        deadlines: weft_nfs::conn::ConnDeadlines {
            idle_ms: args.idle_timeout_ms.max(1),
            frame_ms: args.frame_timeout_ms.max(1),
            send_ms: args.send_timeout_ms.max(1),
        },
        root_squash: !args.no_root_squash,
        connections_max: args.connections_max,
        requests_in_flight_max: args.requests_in_flight_max,
        open_files_max: args.open_files_max,
        open_idle_ms: args.open_idle_ms,
        read_ahead_files_max: args.read_ahead_files_max,
        read_ahead_depth: args.read_ahead_depth,
        nfs4: weft_nfs::nfs4::state::StateConfig {
            lease_ms: args.nfs4_lease_ms.max(1000),
            grace_ms: args.nfs4_grace_ms,
            recall_ms: args.nfs4_recall_ms.max(1),
            clients_per_address_max: args.nfs4_clients_per_address.max(1),
            sessions_per_client_max: args.nfs4_sessions_per_client.max(1),
            stateids_per_client_max: args.nfs4_stateids_per_client.max(1),
            ..Default::default()
        },
        state_dir: args.state_dir.clone(),
        pnfs: args.pnfs,
        layout_check_ms: args.layout_check_ms,
        metadata_leases: !args.no_metadata_leases,
        ..weft_nfs::GatewayConfig::default()
    };
    let listener =
        tokio::net::TcpListener::bind(&args.listen).await.with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr()?;
    let gw = weft_nfs::Gateway::new(&cluster, cfg).await?;
    tracing::info!(
        %addr,
        export = gw.export_path(),
        allow = %args.allow,
        root_squash = !args.no_root_squash,
        secure,
        pnfs = gw.pnfs(),
        metadata_leases = !args.no_metadata_leases,
        "NFS gateway serving NFSv3, MOUNT v3 and NFSv4.1; mount with: mount -t nfs -o vers=3,proto=tcp,port={p},mountport={p},nolock {h}:/ /mnt or mount -t nfs -o vers=4.1,port={p} {h}:/ /mnt",
        p = addr.port(),
        h = addr.ip(),
    );
    if let Some(rdma_addr) = args.rdma_listen {
        let rcfg = weft_nfs::rdma::transport::RdmaConfig {
            listen: rdma_addr,
            credits: args.rdma_credits.clamp(1, 1024),
            ..Default::default()
        };
        if let Err(e) = weft_nfs::rdma::transport::serve(gw.clone(), rcfg, tokio::runtime::Handle::current()) {
            tracing::warn!(%rdma_addr, error = %e, "NFS over RDMA not served");
        }
    }
    ready(&addr.to_string());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = gw.clone().serve(listener) => {}
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("stopping: syncing open files");
    gw.shutdown().await;
    Ok(())
}

/// The mount command for a gateway on `port` of this host.
pub fn mount_hint(port: u16) -> String {
    format!("mount -t nfs -o vers=3,proto=tcp,port={port},mountport={port},nolock 127.0.0.1:/ /mnt")
}
