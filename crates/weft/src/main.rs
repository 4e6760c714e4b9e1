//! `weft`: one binary for every role and every user command.
//!
//! - `weft meta --config F` / `weft data --config F`: run one server role from a TOML file (a real deployment).
//! - `weft up`: a whole local cluster (one MDS and N data servers as separate processes on loopback).
//! - `weft ls|stat|put|get|cat|rm|mkdir|rmdir|mv|ln|truncate|chmod|chown|setstripe|scrub|status|df|du`: use a cluster
//!   through the native client library (`--json` on every listing and status command).
//! - `weft bench ...`: benchmarks, by running the `weft-bench` binary beside this one.

mod bank_key;
mod commands;
mod human;
mod meta_cmds;
mod mode;
mod nfs;
mod owner;
mod scrape;
mod scrubber;
mod size;
mod top;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "weft", version, about = "Weft: a striped, clustered network file system", long_about = None)]
struct Cli {
    /// Log lines as `text` (default) or `json` (one object per line, for log shippers); servers started by
    /// `weft up` inherit it.
    #[arg(long, global = true, value_enum, env = "WEFT_LOG_FORMAT", default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    cmd: Cmd,
}

/// `--log-format text|json`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Where the cluster is: a cluster.toml written by `weft up`, a directory holding one, or the MDS's host:port.
#[derive(clap::Args, Clone)]
struct ClusterArg {
    #[arg(long, env = "WEFT_CLUSTER", value_name = "PATH|ADDR")]
    cluster: String,
    /// How to reach data servers: auto (shm to servers on this host, rdma to others that offer it when this host
    /// has an RDMA device, tcp to the rest), tcp, shm or rdma. Default: WEFT_FABRIC, else the cluster file's,
    /// else auto.
    #[arg(long, value_name = "auto|tcp|shm|rdma")]
    fabric: Option<weft_client::FabricChoice>,
}

impl ClusterArg {
    /// The cluster spec; records `--fabric` for every client this process opens.
    fn spec(&self) -> &str {
        if let Some(f) = self.fabric {
            let _ = commands::FABRIC.set(f);
        }
        &self.cluster
    }
}

/// `--json`: machine-readable output (one JSON document on stdout; field names stable, units in the names).
#[derive(clap::Args, Clone, Copy)]
struct JsonArg {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// Tunables of a FUSE mount.
#[derive(clap::Args, Clone, Debug)]
pub struct MountArgs {
    /// How long the kernel may cache attributes the metadata service has not leased to this mount (0: ask every
    /// time).
    #[arg(long, default_value_t = 1000)]
    pub attr_timeout_ms: u64,
    /// How long the kernel may cache name lookups not leased to this mount; a rename elsewhere is seen after at
    /// most this.
    #[arg(long, default_value_t = 1000)]
    pub entry_timeout_ms: u64,
    /// How long the kernel may cache attributes and lookups the metadata service leased to this mount: a change
    /// by anyone else is recalled from the kernel before it is answered, so this matters only if the mount cannot
    /// apply a recall. 0: no leases. (The MDS grants leases on its embedded store, not on a shared PostgreSQL.)
    #[arg(long, default_value_t = weft_fuse::DEFAULT_LEASE_TIMEOUT_MS)]
    pub lease_timeout_ms: u64,
    /// FUSE worker threads (each with its own /dev/fuse descriptor).
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Let other users use the mount (permissions are still checked against mode bits).
    #[arg(long)]
    pub allow_other: bool,
    /// Bypass the kernel page cache for every file, as if every open had O_DIRECT.
    #[arg(long)]
    pub direct_io: bool,
    /// Kernel readahead window of the mount, in KiB (set through sysfs; needs root).
    #[arg(long, default_value_t = 4096)]
    pub readahead_kib: u32,
    /// Let the kernel cache writes and send them in large batches (FUSE writeback cache). Faster small writes,
    /// but the kernel then trusts its own file sizes over the cluster's: a file grown by another client is not
    /// seen at its new size here until this mount forgets the inode. For one client per file set only.
    #[arg(long)]
    pub writeback_cache: bool,
    /// Honour set-user-ID and set-group-ID bits on the mount (default: mounted nosuid).
    #[arg(long)]
    pub suid: bool,
    /// Honour device nodes on the mount (default: mounted nodev).
    #[arg(long)]
    pub dev: bool,
    /// Mount read-only.
    #[arg(long)]
    pub ro: bool,
    /// Serve Prometheus metrics (FUSE requests by op with latency, RPC retries) at http://ADDR/metrics.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// Do not negotiate FUSE_HANDLE_KILLPRIV_V2: the kernel then drops set-ID bits itself, as kernels before
    /// 5.11 do (for tests of that path).
    #[arg(long, hide = true)]
    pub no_killpriv: bool,
}

impl MountArgs {
    pub fn options(&self) -> weft_fuse::MountOptions {
        weft_fuse::MountOptions {
            attr_timeout_ms: self.attr_timeout_ms,
            entry_timeout_ms: self.entry_timeout_ms,
            lease_timeout_ms: self.lease_timeout_ms,
            threads: self.threads,
            allow_other: self.allow_other,
            direct_io: self.direct_io,
            max_readahead_bytes: self.readahead_kib.saturating_mul(1024),
            writeback_cache: self.writeback_cache,
            suid: self.suid,
            dev: self.dev,
            read_only: self.ro,
            kill_priv_v2: !self.no_killpriv,
            ..weft_fuse::MountOptions::default()
        }
    }
}

/// `weft xattr …`.
#[derive(Subcommand)]
enum XattrCmd {
    /// Print the names of a path's attributes, one per line.
    List {
        #[command(flatten)]
        c: ClusterArg,
        path: String,
    },
    /// Print an attribute's value, raw (as `getfattr --only-values`).
    Get {
        #[command(flatten)]
        c: ClusterArg,
        path: String,
        name: String,
    },
    /// Set an attribute to VALUE (the argument's bytes).
    Set {
        #[command(flatten)]
        c: ClusterArg,
        path: String,
        name: String,
        value: String,
        /// Fail if the attribute exists (XATTR_CREATE).
        #[arg(long, conflicts_with = "replace")]
        create: bool,
        /// Fail if the attribute does not exist (XATTR_REPLACE).
        #[arg(long)]
        replace: bool,
    },
    /// Remove an attribute.
    Rm {
        #[command(flatten)]
        c: ClusterArg,
        path: String,
        name: String,
    },
}

// Parsed once per process and matched at once: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Cmd {
    /// Start a local cluster: one metadata service and N data servers as separate processes on loopback.
    Up {
        /// Where servers keep their data, logs and the client config (DATA_DIR/cluster.toml).
        #[arg(long, default_value = "weft-data")]
        data_dir: PathBuf,
        /// Number of data servers.
        #[arg(long, default_value_t = 4)]
        servers: u32,
        /// Also mount the cluster here (FUSE); unmounted before the cluster stops.
        #[arg(long, value_name = "DIR")]
        mount: Option<PathBuf>,
        /// `key` (default): every role proves the cluster key DATA_DIR/cluster.key (created 0600 unless present);
        /// `none`: no authentication at all, for loopback experiments (every role warns).
        #[arg(long, value_name = "key|none", default_value = "key")]
        auth: AuthArg,
        /// The options of `weft mount`, for the mount of --mount.
        #[command(flatten, next_help_heading = "Mount options (with --mount)")]
        mount_opts: MountArgs,
        /// Run `tcp` under TLS 1.3 (also with WEFT_TLS=1): a CA and a server certificate for 127.0.0.1, ::1,
        /// localhost and this host's name are made in DATA_DIR/tls/ unless present. Off by default: on loopback
        /// nothing is on the path, and same-host clients use `shm` anyway.
        #[arg(long)]
        tls: bool,
        /// Also start N memcached daemons (the cache bank) on 127.0.0.1, named in cluster.toml's [cache].
        #[arg(long, value_name = "N", default_value_t = 0)]
        cache: u32,
        /// Memory of each memcached daemon, MiB.
        #[arg(long, value_name = "M", default_value_t = 64)]
        cache_mib: u32,
        /// Serve no metrics (by default every role serves Prometheus metrics on a free loopback port, listed at
        /// start and in DATA_DIR/metrics.txt).
        #[arg(long)]
        no_metrics: bool,
        /// Also start an NFS gateway (`weft nfs`) on 127.0.0.1:PORT (default 2049) and print the mount command.
        #[arg(long, value_name = "PORT", num_args = 0..=1, default_missing_value = "2049")]
        nfs: Option<u16>,
        /// The MDS's `rebuild_after_ms`: a data server silent this long is failed and spares take its slots in
        /// ec/mirror layouts (default: the MDS's, five minutes).
        #[arg(long, value_name = "MS")]
        rebuild_after_ms: Option<u64>,
        /// Where the metadata service keeps the namespace: `redb` (default), the embedded store in
        /// DATA_DIR/meta; `postgres`, a PostgreSQL server of the cluster's own (Debian's `postgresql`, which
        /// `make deps` installs): `initdb` in DATA_DIR/postgres on first start, listening only on a Unix socket
        /// there, stopped with the cluster. To serve an existing database, run `weft meta --db URL` instead.
        #[arg(long, value_name = "redb|postgres", default_value = "redb")]
        meta: MetaArg,
        /// Metadata services to start on the one database (with `--meta postgres`): all answer clients, data
        /// servers heartbeat to each, clients fail over between them, one at a time holds the duties (membership,
        /// drains, orphan collection, healing) under a lease in the database.
        #[arg(long, value_name = "N", default_value_t = 1)]
        meta_services: u32,
        /// Every data server also serves pNFS (NFSv4.1 data server, docs/format.md §23) on a free loopback port;
        /// the addresses are printed.
        #[arg(long)]
        ds_nfs: bool,
    },
    /// Live rates of a cluster from its metrics endpoints (DATA_DIR/metrics.txt of `weft up`, or ROLE=ADDR
    /// pairs): requests per second by role and op, errors, bytes moved, journal commits.
    Top {
        /// A metrics.txt, the directory holding one, or endpoints as ROLE=HOST:PORT (comma-separated).
        #[arg(long, default_value = "weft-data")]
        from: String,
        /// Seconds between samples.
        #[arg(long, default_value_t = 2)]
        interval_s: u64,
        /// Samples to print before exiting (0: until Ctrl-C).
        #[arg(long, default_value_t = 0)]
        count: u32,
    },
    /// TLS certificates for a multi-machine cluster: `weft tls ca --out DIR`, then `weft tls cert` per server.
    Tls {
        #[command(subcommand)]
        cmd: TlsCmd,
    },
    /// Keys: `weft key new FILE` makes a cluster key file (mode 0600) for a multi-machine cluster; `weft key
    /// add|list|remove` manage per-client keys in the clients keyring.
    Key {
        #[command(subcommand)]
        cmd: KeyCmd,
    },
    /// Mount a cluster as a POSIX file system (FUSE) and serve it until Ctrl-C, SIGTERM or `umount DIR`.
    Mount {
        #[command(flatten)]
        c: ClusterArg,
        /// The (existing, empty) directory to mount on.
        dir: PathBuf,
        #[command(flatten)]
        opts: MountArgs,
        /// Detach: return once the file system is mounted; the daemon logs to `.NAME.weft-mount.log` beside DIR
        /// unless --log is given. Stop it with `umount DIR` (or `fusermount3 -u DIR`).
        #[arg(long)]
        daemon: bool,
        /// Log file of the daemon (with --daemon).
        #[arg(long)]
        log: Option<PathBuf>,
    },
    /// Serve a cluster to NFS clients: NFSv3, MOUNT v3 and NFSv4.1 on one port, each request run as the caller's
    /// AUTH_SYS identity through the native client. Needs the cluster key (or a `trusted` client key) in the cluster file.
    #[command(after_help = "Mount from Linux (no rpcbind: give both ports):\n  \
        mount -t nfs -o vers=3,proto=tcp,port=2049,mountport=2049,nolock 127.0.0.1:/ /mnt\n  \
        mount -t nfs -o vers=4.1,proto=tcp,port=2049 127.0.0.1:/ /mnt\n\
        With libnfs: nfs-ls 'nfs://127.0.0.1/?version=3&nfsport=2049&mountport=2049'")]
    Nfs {
        #[command(flatten)]
        c: ClusterArg,
        #[command(flatten)]
        args: nfs::NfsArgs,
    },
    /// Run the metadata service from a TOML config file.
    #[command(after_help = "Config keys (TOML):\n  \
        listen = \"0.0.0.0:7000\"          address to listen on (port 0: any free port)\n  \
        key_file = \"/etc/weft/cluster.key\" the cluster key (`weft key new`); every peer must prove it\n  \
        auth = \"key\"                     key | none (no authentication; loopback experiments only)\n  \
        tls = true                       run tcp under TLS 1.3 (default false)\n  \
        tls_cert_file = \"server.pem\"     this server's certificate (`weft tls cert`)\n  \
        tls_key_file = \"server.key\"      its private key\n  \
        tls_ca_file = \"ca.pem\"           the cluster CA that servers' certificates chain to\n  \
        clients_keyring = \"/etc/weft/clients.keyring\" per-client keys (`weft key add`), re-read on change\n  \
        data_dir = \"/var/lib/weft/meta\"   where the embedded store (meta.redb) lives\n  \
        db = \"postgres://weft@db/weft\"    keep the namespace in PostgreSQL instead (shareable; --db also)\n  \
        db_connections_max = 8           most connections to db this service holds\n  \
        db_failover_timeout_ms = 30000   how long a change waits for a writable db (a standby being promoted)\n  \
        liveness_ms = 5000               a data server silent this long is shown down\n  \
        slots_max = 64                   most slots (requests in flight) granted per client session\n  \
        sessions_max = 4096              most client sessions held at once\n  \
        gc_interval_ms = 1000            how often removed files' objects are collected\n  \
        rebuild_after_ms = 300000        a data server silent this long is failed: spares take its slots\n  \
        membership_interval_ms = 1000    how often membership advances (spare scan, drain batches)\n  \
        duty_lease_ms = 15000            services sharing a db: duties (membership, gc, heal) move when unrenewed this long\n  \
        locks_orphan_ms = 150000         services sharing a db: locks of sessions at a service silent this long are released\n  \
        journal_segment_bytes = 16777216 size each metadata journal segment is preallocated to\n  \
        journal_bytes_max = 268435456    journal not yet checkpointed above which writers wait\n  \
        checkpoint_bytes = 33554432      journal growth that triggers a checkpoint into meta.redb\n  \
        checkpoint_interval_ms = 2000    longest a journaled change waits for a checkpoint\n  \
        heal = true                      run the healer (catch-up of stale ranges) beside the MDS\n  \
        rebuild_mib_per_s = 200          most MiB/s the healer writes (0: unthrottled)\n  \
        heal_interval_ms = 10000         how often an idle healer looks for work (`weft heal --now`: at once)\n  \
        stale_ranges_per_slot_max = 64   stale ranges kept per file and server before the whole slot is stale\n  \
        stale_entries_max = 1048576      most (file, server) stale entries; a degraded write past it fails\n  \
        metrics_listen = \"127.0.0.1:9100\" serve Prometheus metrics at http://ADDR/metrics (default off)\n\n\
        On start it prints `WEFT-READY <addr>` on stdout; logs go to stderr (RUST_LOG filters them).")]
    #[command(args_conflicts_with_subcommands = true)]
    Meta {
        #[command(subcommand)]
        cmd: Option<MetaCmd>,
        /// The TOML file describing this metadata service (required to serve).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Serve the namespace from this PostgreSQL database (`postgres://user@host/db`, no TLS) instead of the
        /// embedded store in `data_dir`; overrides the config's `db` (docs/format.md §26).
        #[arg(long)]
        db: Option<String>,
    },
    /// Run a data server from a TOML config file.
    #[command(after_help = "Config keys (TOML):\n  \
        id = 1                           stable id; layouts refer to it\n  \
        listen = \"0.0.0.0:7100\"          address to listen on (port 0: any free port)\n  \
        advertise = \"10.0.0.11:7100\"     address clients use (default: the listening one)\n  \
        root = \"/srv/weft/data\"          directory holding the objects\n  \
        mds = \"10.0.0.1:7000\"            the metadata service to register with\n  \
        key_file = \"/etc/weft/cluster.key\" the cluster key (`weft key new`); every peer must prove it\n  \
        auth = \"key\"                     key | none (no authentication; loopback experiments only)\n  \
        tls = true                       run tcp under TLS 1.3 (default false)\n  \
        tls_cert_file = \"server.pem\"     this server's certificate (`weft tls cert`)\n  \
        tls_key_file = \"server.key\"      its private key\n  \
        tls_ca_file = \"ca.pem\"           the cluster CA that servers' certificates chain to\n  \
        clients_keyring = \"/etc/weft/clients.keyring\" per-client keys (`weft key add`), re-read on change\n  \
        heartbeat_ms = 1000              registration/heartbeat period\n  \
        transfer_unit_bytes = 2097152    largest payload of one request\n  \
        pool_buffers = 32                buffers of transfer_unit_bytes in the pool (its largest class)\n  \
        pool_classes = [{ buf_bytes = 65536, buffers = 64 }, ...]\n                                   \
        smaller classes (default 64 KiB x 64, 256 KiB x 32, 1 MiB x 16);\n                                   \
        each class is one zone, pre-faulted at start\n  \
        pipeline_piece_bytes = 1048576   one-sided transfers move in pieces of this size, disk and\n                                   \
        fabric overlapping (a multiple of 4096)\n  \
        rdma_pipeline_piece_bytes = 262144  the same over rdma, where the NIC moves the bytes\n  \
        slots_max = 64                   most slots granted per client session\n  \
        sessions_max = 1024              most client sessions held at once\n  \
        shm = true                       also serve same-host clients over shm (ROOT/weft-data.sock)\n  \
        rdma = true                      also serve rdma clients when this host has an RDMA device\n  \
        rdma_port = 0                    the rdma side channel's TCP port (0: any free port)\n  \
        metrics_listen = \"127.0.0.1:9101\" serve Prometheus metrics at http://ADDR/metrics (default off)\n\n\
        On start it prints `WEFT-READY <addr>` on stdout; logs go to stderr (RUST_LOG filters them).")]
    Data {
        /// The TOML file describing this data server.
        #[arg(long)]
        config: PathBuf,
    },
    /// List a directory.
    Ls {
        #[command(flatten)]
        c: ClusterArg,
        #[arg(default_value = "/")]
        path: String,
        /// Long format: kind, mode, links, owner, size, mtime, inode.
        #[arg(short, long)]
        long: bool,
        /// Also list "." and "..".
        #[arg(short, long)]
        all: bool,
        #[command(flatten)]
        out: JsonArg,
    },
    /// Show attributes and layout; times in ISO 8601 (UTC, nanoseconds).
    Stat {
        #[command(flatten)]
        c: ClusterArg,
        path: String,
        /// Times as raw nanoseconds since the epoch.
        #[arg(long)]
        raw: bool,
        #[command(flatten)]
        out: JsonArg,
    },
    /// Change permission bits: octal (0755) or symbolic as chmod(1) (u+x,go-w, a=rX, g=u); without u/g/o/a a
    /// clause applies to all (the umask is not consulted).
    Chmod {
        #[command(flatten)]
        c: ClusterArg,
        mode: String,
        path: String,
        /// Also every entry below a directory (symlinks are not followed, nor changed).
        #[arg(short = 'R', long)]
        recursive: bool,
    },
    /// Change owner and/or group: USER, USER:GROUP, USER: (the user's login group) or :GROUP; names from the local
    /// user database, or numbers. Root only (a file's owner may change its group to one of its own groups).
    Chown {
        #[command(flatten)]
        c: ClusterArg,
        owner: String,
        path: String,
        /// Also every entry below a directory (symlinks themselves are changed, never followed).
        #[arg(short = 'R', long)]
        recursive: bool,
    },
    /// Pending heal work: the rows of redundant files that servers missed (stale ranges), per file, slot and
    /// server, and the healer's progress; `--now` wakes the healer (root or the cluster key).
    Heal {
        #[command(flatten)]
        c: ClusterArg,
        /// Wake the healer now instead of at its next interval.
        #[arg(long)]
        now: bool,
        #[command(flatten)]
        out: JsonArg,
    },
    /// The cluster's size, used and available space, each file system counted once (as df -h).
    Df {
        #[command(flatten)]
        c: ClusterArg,
        #[command(flatten)]
        out: JsonArg,
    },
    /// Space used by a tree: the sum of its files' sizes (apparent sizes; a hard-linked file counts once).
    #[command(disable_help_flag = true)]
    Du {
        #[command(flatten)]
        c: ClusterArg,
        #[arg(default_value = "/")]
        path: String,
        /// Only the total of PATH (default: every directory's total, deepest first, as du).
        #[arg(short, long)]
        summarize: bool,
        /// Sizes in K, M, G (powers of 1024).
        #[arg(short = 'h', long = "human-readable")]
        human: bool,
        #[command(flatten)]
        out: JsonArg,
        /// Print help (-h is --human-readable here, as in du).
        #[arg(long, action = clap::ArgAction::Help)]
        help: Option<bool>,
    },
    /// Copy a local file into the cluster.
    Put {
        #[command(flatten)]
        c: ClusterArg,
        local: PathBuf,
        remote: String,
    },
    /// Copy a file out of the cluster.
    Get {
        #[command(flatten)]
        c: ClusterArg,
        remote: String,
        local: PathBuf,
    },
    /// Write a file's bytes to stdout.
    Cat {
        #[command(flatten)]
        c: ClusterArg,
        path: String,
    },
    /// Remove a file or symlink (or, with -r, a directory tree).
    Rm {
        #[command(flatten)]
        c: ClusterArg,
        path: String,
        #[arg(short, long)]
        recursive: bool,
    },
    /// Create a directory.
    Mkdir {
        #[command(flatten)]
        c: ClusterArg,
        path: String,
        /// Create missing parents; no error if it exists.
        #[arg(short, long)]
        parents: bool,
    },
    /// Remove an empty directory.
    Rmdir {
        #[command(flatten)]
        c: ClusterArg,
        path: String,
    },
    /// Rename; an existing target is replaced (as rename(2)).
    Mv {
        #[command(flatten)]
        c: ClusterArg,
        src: String,
        dst: String,
        /// Fail if the target exists.
        #[arg(short = 'n', long)]
        no_clobber: bool,
    },
    /// Make a hard link (or, with -s, a symbolic link).
    Ln {
        #[command(flatten)]
        c: ClusterArg,
        target: String,
        link: String,
        #[arg(short, long)]
        symbolic: bool,
    },
    /// Set a file's size.
    Truncate {
        #[command(flatten)]
        c: ClusterArg,
        path: String,
        /// New size (suffixes K, M, G).
        #[arg(short, long)]
        size: String,
    },
    /// Extended attributes of a file or directory (`user.*`, `trusted.*`, `security.*`, and POSIX ACLs as
    /// `system.posix_acl_access`/`_default` in the Linux value format).
    #[command(subcommand)]
    Xattr(XattrCmd),
    /// Set the layout new files in a directory inherit.
    Setstripe {
        #[command(flatten)]
        c: ClusterArg,
        /// Stripe unit (suffixes K, M, G; a multiple of 4K).
        #[arg(long, default_value = "1M")]
        unit: String,
        /// Data servers per file (0: all). Ignored with --ec or --mirror (their width decides).
        #[arg(long, default_value_t = 0)]
        count: u32,
        /// Erasure coding: K data + M parity chunks per stripe row on K+M distinct servers (e.g. 4+2).
        #[arg(long, value_name = "K+M")]
        ec: Option<String>,
        /// Mirroring: every byte on N distinct servers.
        #[arg(long, value_name = "N")]
        mirror: Option<u8>,
        dir: String,
    },
    /// Verify every chunk's checksums on its data server, every ec stripe row's parity and that mirror copies
    /// agree, for the files under PATH; repair what can be repaired from redundancy and report the rest (exit
    /// status 1 when anything is unrepairable).
    Scrub {
        #[command(flatten)]
        c: ClusterArg,
        /// Where to start (a directory or a file).
        #[arg(default_value = "/")]
        path: String,
        /// Rewrite what can be repaired (the default).
        #[arg(long, conflicts_with = "dry_run")]
        repair: bool,
        /// Only report: rewrite nothing.
        #[arg(long)]
        dry_run: bool,
        /// Most MiB per second verified and read (0: no limit).
        #[arg(long, default_value_t = 0)]
        rate_mib_s: u64,
    },
    /// Show every data server, its state, its space and which servers share a file system; the cluster's space
    /// counted once per file system and the space usable under each redundancy policy.
    Status {
        #[command(flatten)]
        c: ClusterArg,
        #[command(flatten)]
        out: JsonArg,
    },
    /// Benchmarks: runs `weft-bench ARGS`, the benchmark binary installed beside this one (`weft bench --help`
    /// lists its workloads).
    #[command(disable_help_flag = true)]
    Bench {
        /// The arguments `weft-bench` gets.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
}

/// `weft meta backup | restore | migrate | check`: moving, keeping and checking a namespace (docs/format.md §29).
#[derive(Subcommand)]
enum MetaCmd {
    /// Online, consistent backup into a new embedded store at DIR on the metadata service's host.
    ///
    /// The running metadata service copies its namespace (one snapshot, taken while clients go on) into a new
    /// embedded store at DIR on its own host. DIR must be absent or empty; the backup
    /// is a `data_dir` that `weft meta restore` (or a `weft meta --config` naming it) serves again. Needs the
    /// cluster key. For PostgreSQL, this gives a portable embedded copy; pg_dump or a base backup also work.
    Backup {
        #[command(flatten)]
        c: ClusterArg,
        /// Where the backup goes, on the metadata service's host (made absolute here).
        dir: PathBuf,
        #[command(flatten)]
        out: JsonArg,
    },
    /// Restores a backup into an empty store (offline).
    ///
    /// No service may have the target open while it runs: the copy is read
    /// back and compared with the backup before this reports success.
    Restore {
        /// The backup's directory (what `weft meta backup` wrote).
        backup: PathBuf,
        /// The store to fill: redb:DIR (a new metadata service's data_dir) or postgres://user@host/db.
        #[arg(long, value_name = "redb:DIR|postgres://…")]
        to: String,
        #[command(flatten)]
        out: JsonArg,
    },
    /// Copies a namespace between stores, redb to PostgreSQL and back (offline).
    ///
    /// Stop the services of both stores first. The target must be empty; the copy is read back and compared before this succeeds.
    Migrate {
        #[arg(long, value_name = "redb:DIR|postgres://…")]
        from: String,
        #[arg(long, value_name = "redb:DIR|postgres://…")]
        to: String,
        #[command(flatten)]
        out: JsonArg,
    },
    /// Checks a namespace's tree (an fsck of its records, read-only).
    ///
    /// Reads every inode and entry in one snapshot and checks that the directories form a tree from the root (one
    /// name each, each recording the directory that holds it), that every entry names an inode of its kind, that
    /// every link count is what the tree gives, and that every inode is reachable. Exits 1 naming the first record
    /// that breaks one. It changes no record (opening an embedded store replays its journal, as a service would).
    /// An embedded store must not be open in a running service (stop it, or check a backup); a PostgreSQL
    /// database may be checked while its services run.
    Check {
        /// The store to check: redb:DIR (a metadata service's data_dir, or a backup) or postgres://user@host/db.
        #[arg(long, value_name = "redb:DIR|postgres://…")]
        store: String,
        #[command(flatten)]
        out: JsonArg,
    },
}

#[derive(Subcommand)]
enum KeyCmd {
    /// Create a key file holding a new random 256-bit key, mode 0600 (never overwrites). Copy it to every machine
    /// of the cluster and name it as `key_file` in every config.
    New { file: PathBuf },
    /// Issue a per-client key: writes a new key file for the client (mode 0600) and adds it to the clients keyring,
    /// which the servers re-read when it changes. The client names the key file as `key_file` and NAME as
    /// `key_id` in its cluster.toml. Without --squash-root or --uid/--gid the client is a trusted host: it acts
    /// as any user it asserts, root included (as a cluster-key host, but it cannot register data servers).
    Add {
        /// The client's name (its key id): 1-64 letters, digits, '.', '_' or '-'.
        name: String,
        /// The client acts as any user it asserts, but root (uid 0, gid 0) becomes nobody (65534), as NFS's
        /// root_squash.
        #[arg(long, conflicts_with_all = ["uid", "gid"])]
        squash_root: bool,
        /// The client always acts as this uid, whatever it asserts (with --gid).
        #[arg(long, requires = "gid")]
        uid: Option<u32>,
        /// The group of --uid.
        #[arg(long, requires = "uid")]
        gid: Option<u32>,
        /// The clients keyring (created 0600 if missing).
        #[arg(long, env = "WEFT_KEYRING", default_value = "weft-data/clients.keyring")]
        keyring: PathBuf,
        /// Where to write the client's key file (default: NAME.key); never overwritten.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// List the clients in a keyring and their policies (never the keys).
    List {
        #[arg(long, env = "WEFT_KEYRING", default_value = "weft-data/clients.keyring")]
        keyring: PathBuf,
        #[command(flatten)]
        out: JsonArg,
    },
    /// Rotate the cache bank's key: raises `key_generation` in the [cache] table of every config named (one new
    /// number for all), so each role seals and opens bank items under a new key once restarted. Items sealed
    /// under the old key become misses (a cold bank for a while, never a wrong byte). Name every config with a
    /// [cache] table: cluster.toml (clients, gateways), meta.toml, each dataN.toml; then restart those roles.
    Rotate {
        /// Rotate the bank key (the only key rotated here: a new cluster key is `weft key new` on every machine).
        #[arg(long, required = true)]
        bank: bool,
        /// The configs to edit (each must have a [cache] table; none is written unless all are valid).
        #[arg(required = true)]
        configs: Vec<PathBuf>,
    },
    /// Remove a client's key: new connections with it are refused (open ones keep working until they close).
    Remove {
        name: String,
        #[arg(long, env = "WEFT_KEYRING", default_value = "weft-data/clients.keyring")]
        keyring: PathBuf,
    },
}

#[derive(Subcommand)]
enum TlsCmd {
    /// Make a cluster CA: DIR/ca.pem (give it to every machine, `tls_ca_file`) and DIR/ca.key (mode 0600; keep
    /// it where certificates are made, never on a server). Never overwrites.
    Ca {
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Make a server certificate signed by the CA in `--ca`: DIR/server.pem (`tls_cert_file`) and DIR/server.key
    /// (mode 0600, `tls_key_file`). Never overwrites.
    Cert {
        /// The CA directory made by `weft tls ca`.
        #[arg(long, value_name = "DIR")]
        ca: PathBuf,
        /// The names clients reach this server by: DNS names and/or IP addresses, comma-separated.
        #[arg(long, value_name = "HOST[,IP...]", value_delimiter = ',', required = true)]
        name: Vec<String>,
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

/// `weft up --meta redb|postgres`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum MetaArg {
    Redb,
    Postgres,
}

/// `--auth key|none`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum AuthArg {
    Key,
    None,
}

impl From<AuthArg> for weft_rpc::AuthMode {
    fn from(a: AuthArg) -> Self {
        match a {
            AuthArg::Key => weft_rpc::AuthMode::Key,
            AuthArg::None => weft_rpc::AuthMode::None,
        }
    }
}

fn init_logging(default: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let fmt = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        // One JSON object per line, fields flattened beside the message, for log shippers.
        LogFormat::Json => fmt.json().flatten_event(true).with_current_span(false).init(),
        LogFormat::Text => {
            // Colours only on a terminal: servers usually log to files, where escape codes get in the way of grep.
            let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
            fmt.with_ansi(ansi).init()
        }
    }
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let server_role =
        matches!(cli.cmd, Cmd::Meta { .. } | Cmd::Data { .. } | Cmd::Up { .. } | Cmd::Mount { .. } | Cmd::Nfs { .. });
    init_logging(if server_role { "info" } else { "warn" }, cli.log_format);
    // Children (`weft up`'s servers, `weft mount --daemon`) log the same way.
    let _ = commands::LOG_JSON.set(cli.log_format == LogFormat::Json);
    // Servers hold thousands of connections (their caps are 4096 by default), more than the usual soft limit of
    // 1024 descriptors: take the hard limit, as every process of this binary may serve or open many.
    match weft_fabric::raise_open_files_limit() {
        Ok(n) if server_role => tracing::info!(open_files_max = n, "raised the open files limit (RLIMIT_NOFILE)"),
        Ok(_) => {}
        Err(e) => tracing::warn!("could not raise the open files limit (RLIMIT_NOFILE): {e}"),
    }
    if let Cmd::Bench { args } = cli.cmd {
        return commands::bench(&args);
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    rt.block_on(run(cli.cmd))
}

async fn run(cmd: Cmd) -> Result<()> {
    use commands as c;
    match cmd {
        Cmd::Up {
            data_dir,
            servers,
            mount,
            auth,
            mount_opts: mount_args,
            tls,
            cache,
            cache_mib,
            no_metrics,
            nfs,
            rebuild_after_ms,
            meta,
            meta_services,
            ds_nfs,
        } => {
            let cache = c::CacheArgs { daemons: cache, mib: cache_mib };
            let nfs = c::NfsArgs { port: nfs, ds_nfs };
            let meta = c::MetaArgs { postgres: meta == MetaArg::Postgres, rebuild_after_ms, services: meta_services };
            c::up(data_dir, servers, mount, auth.into(), mount_args, tls, cache, !no_metrics, nfs, meta).await
        }
        Cmd::Nfs { c, args } => nfs::run(c.spec(), &args, ready).await,
        Cmd::Top { from, interval_s, count } => top::top(&from, interval_s, count).await,
        Cmd::Tls { cmd: TlsCmd::Ca { out } } => {
            weft_launch::tls::make_ca(&out)?;
            println!(
                "wrote {} (every machine's tls_ca_file) and {} (mode 0600; keep it off the servers)",
                out.join(weft_launch::tls::CA_CERT_FILE).display(),
                out.join(weft_launch::tls::CA_KEY_FILE).display()
            );
            Ok(())
        }
        Cmd::Tls { cmd: TlsCmd::Cert { ca, name, out } } => {
            weft_launch::tls::make_server_cert(&ca, &name, &out)?;
            println!(
                "wrote {} (tls_cert_file) and {} (tls_key_file, mode 0600) for {}",
                out.join(weft_launch::tls::SERVER_CERT_FILE).display(),
                out.join(weft_launch::tls::SERVER_KEY_FILE).display(),
                name.join(", ")
            );
            Ok(())
        }
        Cmd::Key { cmd: KeyCmd::New { file } } => {
            weft_rpc::Key::create_file(&file)?;
            println!("wrote a new cluster key to {} (mode 0600); name it as key_file in every config", file.display());
            Ok(())
        }
        Cmd::Key { cmd: KeyCmd::Add { name, squash_root, uid, gid, keyring, out } } => {
            let policy = match (squash_root, uid, gid) {
                (true, _, _) => weft_rpc::KeyPolicy::SquashRoot,
                (false, Some(uid), Some(gid)) => weft_rpc::KeyPolicy::Fixed { uid, gid },
                _ => weft_rpc::KeyPolicy::Trusted,
            };
            let out = out.unwrap_or_else(|| PathBuf::from(format!("{name}.key")));
            c::key_add(&name, policy, &keyring, &out)
        }
        Cmd::Key { cmd: KeyCmd::List { keyring, out } } => c::key_list(&keyring, out.json),
        Cmd::Key { cmd: KeyCmd::Remove { name, keyring } } => c::key_remove(&name, &keyring),
        Cmd::Key { cmd: KeyCmd::Rotate { bank: _, configs } } => {
            let generation = bank_key::rotate(&configs)?;
            let names: Vec<String> = configs.iter().map(|p| p.display().to_string()).collect();
            println!(
                "bank key generation {generation} written to {}; restart those roles: until then each seals under its \
                 old generation, and items of another generation are misses",
                names.join(", ")
            );
            Ok(())
        }
        Cmd::Mount { c, dir, opts, daemon, log } => {
            if daemon {
                c::mount_daemon(c.spec(), &dir, &opts, log).await
            } else {
                c::mount(c.spec(), &dir, &opts).await
            }
        }
        Cmd::Meta { cmd: Some(cmd), .. } => match cmd {
            MetaCmd::Backup { c, dir, out } => meta_cmds::backup(c.spec(), &dir, out.json).await,
            MetaCmd::Restore { backup, to, out } => meta_cmds::restore(&backup, &to, out.json).await,
            MetaCmd::Migrate { from, to, out } => meta_cmds::migrate(&from, &to, out.json).await,
            MetaCmd::Check { store, out } => meta_cmds::check(&store, out.json).await,
        },
        Cmd::Meta { cmd: None, config, db } => {
            let config = config.context("weft meta needs --config FILE to serve (or: backup, restore, migrate)")?;
            let text = std::fs::read_to_string(&config).with_context(|| format!("reading {}", config.display()))?;
            let mut cfg: weft_meta::MetaConfig =
                toml::from_str(&text).with_context(|| format!("{} is not a valid meta config", config.display()))?;
            cfg.db = db.or(cfg.db);
            let heal = cfg.heal.then(weft_heal::HealState::new);
            let hooks = heal.clone().map(|h| {
                let p = h.clone();
                weft_meta::HealHooks { nudge: Arc::new(move || h.nudge()), progress: Arc::new(move || p.progress()) }
            });
            let heal_cfg = heal.map(|state| (state, commands::healer_config(&cfg)));
            let scrub = scrubber::Scrubber::from_meta(&cfg);
            // The healer and the scrubber run only while this service holds the duty lease (format §28).
            let duty = weft_meta::DutyFlag::default();
            let (heal_duty, scrub_duty) = (duty.clone(), duty.clone());
            weft_meta::run_with(
                cfg,
                hooks,
                duty,
                move |addr| {
                    ready(addr);
                    if let Some((state, (cluster, hc))) = heal_cfg {
                        commands::spawn_healer(cluster, addr, hc, state, heal_duty);
                    }
                },
                |m, addr| scrub.spawn(m, addr, scrub_duty),
            )
            .await
            .context("metadata service failed")
        }
        Cmd::Data { config } => {
            let text = std::fs::read_to_string(&config).with_context(|| format!("reading {}", config.display()))?;
            let cfg: weft_data::DataConfig =
                toml::from_str(&text).with_context(|| format!("{} is not a valid data config", config.display()))?;
            // The pNFS data server lives in weft-nfs, above weft-data: handed in here.
            weft_data::run_with_nfs(cfg, ready, Some(weft_nfs::ds::starter())).await.context("data server failed")
        }
        Cmd::Ls { c, path, long, all, out } => c::ls(c.spec(), &path, long, all, out.json).await,
        Cmd::Stat { c, path, raw, out } => c::stat(c.spec(), &path, raw, out.json).await,
        Cmd::Chmod { c, mode, path, recursive } => c::chmod(c.spec(), &mode, &path, recursive).await,
        Cmd::Chown { c, owner, path, recursive } => {
            let (uid, gid) = owner::parse(&owner)?;
            c::chown(c.spec(), uid, gid, &path, recursive).await
        }
        Cmd::Df { c, out } => c::df(c.spec(), out.json).await,
        Cmd::Heal { c, now, out } => c::heal(c.spec(), now, out.json).await,
        Cmd::Du { c, path, summarize, human, out, .. } => c::du(c.spec(), &path, summarize, human, out.json).await,
        Cmd::Put { c, local, remote } => c::put(c.spec(), &local, &remote).await,
        Cmd::Get { c, remote, local } => c::get(c.spec(), &remote, &local).await,
        Cmd::Cat { c, path } => c::cat(c.spec(), &path).await,
        Cmd::Rm { c, path, recursive } => c::rm(c.spec(), &path, recursive).await,
        Cmd::Mkdir { c, path, parents } => c::mkdir(c.spec(), &path, parents).await,
        Cmd::Rmdir { c, path } => c::rmdir(c.spec(), &path).await,
        Cmd::Mv { c, src, dst, no_clobber } => c::mv(c.spec(), &src, &dst, no_clobber).await,
        Cmd::Ln { c, target, link, symbolic } => c::ln(c.spec(), &target, &link, symbolic).await,
        Cmd::Truncate { c, path, size } => c::truncate(c.spec(), &path, size::parse(&size)?).await,
        Cmd::Setstripe { c, unit, count, ec, mirror, dir } => {
            let unit = size::parse(&unit)?;
            let unit = u32::try_from(unit).context("stripe unit must be below 4 GiB")?;
            let redundancy = c::parse_redundancy(ec.as_deref(), mirror)?;
            c::setstripe(c.spec(), &dir, unit, count, redundancy).await
        }
        Cmd::Xattr(x) => match x {
            XattrCmd::List { c, path } => c::xattr_list(c.spec(), &path).await,
            XattrCmd::Get { c, path, name } => c::xattr_get(c.spec(), &path, &name).await,
            XattrCmd::Set { c, path, name, value, create, replace } => {
                let flags = if create {
                    weft_proto::msg::XATTR_CREATE
                } else if replace {
                    weft_proto::msg::XATTR_REPLACE
                } else {
                    0
                };
                c::xattr_set(c.spec(), &path, &name, value.as_bytes(), flags).await
            }
            XattrCmd::Rm { c, path, name } => c::xattr_rm(c.spec(), &path, &name).await,
        },
        Cmd::Status { c, out } => c::status(c.spec(), out.json).await,
        Cmd::Scrub { c, path, repair: _, dry_run, rate_mib_s } => {
            let opts = weft_client::scrub::ScrubOptions { repair: !dry_run, rate_mib_per_s: rate_mib_s };
            c::scrub(c.spec(), &path, opts).await
        }
        Cmd::Bench { .. } => unreachable!("`weft bench` runs weft-bench before the runtime starts"),
    }
}

/// Tells a launcher (`weft up`, tests) that a server listens, on the one stdout line it reads.
fn ready(addr: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}{addr}", weft_launch::READY_PREFIX);
    let _ = out.flush();
}
