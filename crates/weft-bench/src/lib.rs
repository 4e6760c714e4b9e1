//! Benchmarks: each `weft bench` subcommand starts its own local cluster per measured point (or uses one given
//! with `--cluster`), measures ceilings of this machine in the same run, repeats every measurement, and writes
//! JSON in the shared contract (see `docs/bench.md`) plus an SVG chart beside it.
//!
//! Hygiene: buffers are pre-faulted before timing (first touch of memory is slow here), every point has a
//! warm-up, figures are medians of `--runs` repetitions with min and max, and the load average is recorded before
//! and after so runs under different loads are not compared silently.

pub mod cache;
pub mod ceilings;
pub mod chart;
pub mod checkpoint;
pub mod common;
pub mod compare;
pub mod doc;
mod failover;
pub mod fuse_transport;
pub mod gluster_ec;
mod juicefs;
pub mod latency;
pub mod layouts;
pub mod meta;
pub mod mount;
pub mod nfs;
pub mod rebuild;
pub mod report;
pub mod rng;
pub mod stats;
pub mod tables;
pub mod throughput;
pub mod worker;
pub mod zipf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};

pub use stats::Summary;

#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub cmd: BenchCmd,
}

#[derive(Subcommand)]
pub enum BenchCmd {
    /// Sequential write then read of one file per point through the native client library.
    Throughput(throughput::ThroughputArgs),
    /// The FUSE kernel transport alone: `/dev/fuse` reads against FUSE over io_uring, with a server in memory
    /// (root; sets `enable_uring` for the run).
    FuseTransport(fuse_transport::FuseTransportArgs),
    /// Metadata operations (mdtest-style): create, stat, readdir, remove; or a stat storm.
    Meta(meta::MetaArgs),
    /// Latency of single reads and writes, one call at a time, per record size.
    Latency(latency::LatencyArgs),
    /// Reads and overwrites of records at Zipf-distributed offsets of one file.
    Zipf(zipf::ZipfArgs),
    /// fio and a create/stat loop on a Weft FUSE mount, libfuse's passthrough_ll and a GlusterFS mount, side by side.
    Mount(mount::MountArgs),
    /// N client processes write a checkpoint (a file each, or slices of one shared file) and fsync it.
    Checkpoint(checkpoint::CheckpointArgs),
    /// The same workloads on Weft and on every peer (local disk, passthrough_ll, GlusterFS, nfs-ganesha, iperf3,
    /// memcpy) in one run, with Weft's ratio to each.
    Compare(compare::CompareArgs),
    /// The cache bank (issue 16) with 0, 1, 2, 4 memcached daemons and several block sizes: stat storm, read
    /// latency by record size, shared-file reads, IOzone-style reads, and GlusterFS beside them.
    Cache(cache::CacheArgs),
    /// Weft's NFS gateway and nfs-ganesha through libnfs (NFSv3): sequential 1 MiB write and read, create/stat/remove.
    Nfs(nfs::NfsArgs),
    /// Rebuild onto a spare after kill -9 of a data server (ec/mirror), and GlusterFS disperse's heal beside it.
    Rebuild(rebuild::RebuildArgs),
    /// Turns a directory of result JSON into Markdown tables and SVG charts, with machine, date and command.
    Report(report::ReportArgs),
    /// One client process of a multi-process workload (started by the other subcommands).
    #[command(hide = true)]
    Worker(worker::WorkerArgs),
}

impl BenchArgs {
    /// Whether this is one client process of a multi-process workload (`weft bench worker`).
    pub fn is_worker(&self) -> bool {
        matches!(self.cmd, BenchCmd::Worker(_))
    }
}

/// The `weft` binary the benchmarks launch clusters and mounts with: `$WEFT_BIN` if set, else `weft` beside this
/// binary (both are built into one target directory, and installed into one `bin`).
pub fn weft_exe() -> Result<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("WEFT_BIN") {
        return Ok(p.into());
    }
    let me = std::env::current_exe().context("finding the weft-bench binary")?;
    let weft = me.with_file_name("weft");
    if !weft.is_file() {
        anyhow::bail!(
            "{} is missing: weft-bench runs clusters with the weft binary beside it (build both: `cargo build \
             --release -p weft -p weft-bench`), or name it with WEFT_BIN=PATH",
            weft.display()
        );
    }
    Ok(weft)
}

pub async fn run(args: BenchArgs) -> Result<()> {
    match args.cmd {
        BenchCmd::Throughput(a) => throughput::run(a).await,
        BenchCmd::Meta(a) => meta::run(a).await,
        BenchCmd::FuseTransport(a) => fuse_transport::run(a).await,
        BenchCmd::Latency(a) => latency::run(a).await,
        BenchCmd::Zipf(a) => zipf::run(a).await,
        BenchCmd::Mount(a) => mount::run_bench(a).await,
        BenchCmd::Checkpoint(a) => checkpoint::run(a).await,
        BenchCmd::Worker(a) => worker::run(a).await,
        BenchCmd::Compare(a) => compare::run(a).await,
        BenchCmd::Cache(a) => cache::run(a).await,
        BenchCmd::Rebuild(a) => rebuild::run(a).await,
        BenchCmd::Report(a) => report::run(a),
        BenchCmd::Nfs(a) => nfs::run(a).await,
    }
}

pub use weft_launch::parse_bytes;

/// Parses a comma-separated list, e.g. `1,2,4` or `4K,1M`.
pub fn parse_list<T>(s: &str, f: impl Fn(&str) -> Option<T>) -> Option<Vec<T>> {
    s.split(',').map(|x| f(x.trim())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("4k"), Some(4096));
        assert_eq!(parse_bytes("1M"), Some(1 << 20));
        assert_eq!(parse_bytes("2G"), Some(2 << 30));
        assert_eq!(parse_bytes("x"), None);
        assert_eq!(parse_bytes(""), None);
        assert_eq!(parse_bytes("99999999999T"), None);
        assert_eq!(parse_list("1,2,4", |x| x.parse::<u32>().ok()), Some(vec![1, 2, 4]));
    }
}
