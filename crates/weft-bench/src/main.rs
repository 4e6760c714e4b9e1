//! `weft-bench`: Weft's benchmarks, a binary of their own so the shipped `weft` links none of the peers' code
//! (GlusterFS, nfs-ganesha, libnfs, JuiceFS). It runs clusters with the `weft` binary beside it
//! ([`weft_bench::weft_exe`]); `weft bench ARGS` runs `weft-bench ARGS`.

use anyhow::{Context, Result};
use clap::Parser;
use weft_bench::{BenchArgs, BenchCmd};

/// Weft's benchmarks: every workload against this machine's ceilings and the peers, measured in the same run.
/// Results are JSON (`--json FILE`) plus an SVG chart beside it; `weft-bench report DIR` tabulates them.
#[derive(Parser)]
#[command(name = "weft-bench", version)]
struct Cli {
    #[command(subcommand)]
    cmd: BenchCmd,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    // A bench runs thousands of files and connections at once, past the usual soft limit of 1024 descriptors.
    if let Err(e) = weft_fabric::raise_open_files_limit() {
        tracing::warn!("could not raise the open files limit (RLIMIT_NOFILE): {e}");
    }
    let args = BenchArgs { cmd: cli.cmd };
    // A worker process is one client doing one call at a time: on a current-thread runtime the thread that waits
    // for a reply is the one that polls the socket, one wake-up per reply instead of a worker thread's wake-up
    // handing over to the blocked main thread (two context switches per call).
    let rt = if args.is_worker() {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread().enable_all().build()
    }
    .context("starting the runtime")?;
    rt.block_on(weft_bench::run(args))
}
