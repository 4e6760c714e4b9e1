//! An NFS gateway process (`weft nfs`) beside a [`LocalCluster`], for `weft up --nfs` and the tests.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::{LaunchError, LocalCluster, READY_PREFIX, io_err, terminate};

/// How `weft nfs` is started.
#[derive(Debug, Clone)]
pub struct NfsOptions {
    /// `--listen` (port 0: any free port; the gateway reports the one it bound).
    pub listen: String,
    /// `--export`.
    pub export: String,
    /// `--allow` (None: the gateway's default, loopback).
    pub allow: Option<String>,
    pub root_squash: bool,
    /// More arguments for `weft nfs`.
    pub extra_args: Vec<String>,
}

impl Default for NfsOptions {
    fn default() -> Self {
        NfsOptions {
            listen: "127.0.0.1:0".into(),
            export: "/".into(),
            allow: None,
            root_squash: true,
            extra_args: Vec::new(),
        }
    }
}

/// A running gateway; killed when dropped.
pub struct NfsGateway {
    child: Child,
    addr: String,
    log: PathBuf,
}

impl NfsGateway {
    /// The address it serves NFS and MOUNT on.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.rsplit_once(':').and_then(|(_, p)| p.parse().ok()).unwrap_or(0)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    pub fn log(&self) -> &std::path::Path {
        &self.log
    }

    /// SIGKILL, as `kill -9`: nothing is flushed.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// SIGTERM: the gateway syncs its open files and exits.
    pub async fn stop(&mut self) {
        if let Some(pid) = self.child.id() {
            terminate(pid);
        }
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await.is_err() {
            let _ = self.child.kill().await;
        }
    }
}

impl LocalCluster {
    /// Starts `weft nfs` on this cluster's `cluster.toml` and waits for the address it reports.
    pub async fn start_nfs(&self, o: &NfsOptions) -> Result<NfsGateway, LaunchError> {
        let log = self.opts.dir.join("logs/nfs.log");
        let log_file = std::fs::OpenOptions::new().create(true).append(true).open(&log).map_err(io_err(&log))?;
        let mut cmd = Command::new(&self.opts.weft_bin);
        cmd.arg("nfs")
            .arg("--cluster")
            .arg(self.cluster_file())
            .arg("--listen")
            .arg(&o.listen)
            .arg("--export")
            .arg(&o.export)
            .arg(if o.root_squash { "--root-squash" } else { "--no-root-squash" })
            .args(&o.extra_args)
            .env("RUST_LOG", &self.opts.log_filter)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log_file))
            .kill_on_drop(true);
        if let Some(a) = &o.allow {
            cmd.arg("--allow").arg(a);
        }
        for (k, v) in &self.opts.env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().map_err(|source| LaunchError::Spawn { role: "nfs".into(), source })?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut lines = BufReader::new(stdout).lines();
        let wait = Duration::from_millis(self.opts.ready_timeout_ms);
        let addr = match tokio::time::timeout(wait, lines.next_line()).await {
            Ok(Ok(Some(line))) if line.starts_with(READY_PREFIX) => line[READY_PREFIX.len()..].trim().to_string(),
            Ok(_) => return Err(LaunchError::Died { role: "nfs".into(), log }),
            Err(_) => {
                return Err(LaunchError::NotReady {
                    waited_ms: self.opts.ready_timeout_ms,
                    detail: format!("the NFS gateway did not report its address; see {}", log.display()),
                });
            }
        };
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(NfsGateway { child, addr, log })
    }
}
