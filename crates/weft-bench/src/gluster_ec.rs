//! GlusterFS `disperse 4 redundancy 2` beside Weft's erasure coding (`weft bench rebuild`): six bricks on loopback
//! (`force`: they share one host), FUSE-mounted; sequential write and read with 1 MiB records, and its self-heal
//! after one brick process is killed and data is written while it is down.
//!
//! Processes: glusterd is started here only when none answers (`glusterd -p PIDFILE`), and then ended by that pid
//! at the end; the bricks and the self-heal daemon are glusterd's, stopped with `gluster volume stop`. The brick
//! killed for the heal is found by its pid file and checked to be that brick's `glusterfsd` before the signal.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::fcntl::{PosixFadviseAdvice, posix_fadvise};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::ceilings;
use crate::layouts::{fill_pattern, pattern_mismatch};

/// The volume's name (its own, so a `weft bench mount` or `cache` volume on the same glusterd is left alone).
pub const VOLUME: &str = "weftbenchec";
/// glusterd refuses 127.0.0.1 and localhost as brick hosts; 127.0.0.2 is loopback too.
const HOST: &str = "127.0.0.2";
pub const DATA_BRICKS: usize = 4;
pub const REDUNDANCY: usize = 2;
/// How often `gluster volume heal VOL info` is asked while a heal runs.
const HEAL_POLL_MS: u64 = 200;

fn gluster(args: &[&str]) -> Result<String> {
    crate::mount::run(Command::new("gluster").arg("--mode=script").args(args), &format!("gluster {}", args.join(" ")))
}

/// A started disperse volume, mounted at `mnt`; unmounted, stopped and deleted on drop.
pub struct Disperse {
    pub mnt: PathBuf,
    pub bricks: Vec<PathBuf>,
    /// glusterd's pid when it was started here (ended on drop); `None` when one was already running.
    glusterd_pid: Option<u32>,
    created: bool,
}

impl Disperse {
    /// Starts glusterd if needed, creates and starts the volume on bricks under `base`, and mounts it.
    pub fn start(base: &Path) -> Result<Disperse> {
        crate::mount::need("glusterd")?;
        let mnt = base.join("gluster-ec-mnt");
        std::fs::create_dir_all(&mnt)?;
        let bricks: Vec<PathBuf> =
            (0..DATA_BRICKS + REDUNDANCY).map(|i| base.join(format!("gluster-ec-b{i}"))).collect();
        for b in &bricks {
            std::fs::create_dir_all(b)?;
        }
        let mut d = Disperse { mnt, bricks, glusterd_pid: None, created: false };
        if gluster(&["volume", "list"]).is_err() {
            let pidfile = base.join("glusterd.pid");
            crate::mount::run(Command::new("glusterd").arg("-p").arg(&pidfile), "glusterd")?;
            // glusterd writes its pid file and answers the CLI a moment after it forks.
            let mut ready = false;
            for _ in 0..100 {
                if d.glusterd_pid.is_none() {
                    d.glusterd_pid = std::fs::read_to_string(&pidfile).ok().and_then(|s| s.trim().parse().ok());
                }
                if d.glusterd_pid.is_some() && gluster(&["volume", "list"]).is_ok() {
                    ready = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if !ready {
                bail!("glusterd did not answer within 10 s");
            }
        }
        // A volume left by an interrupted run.
        let _ = gluster(&["volume", "stop", VOLUME, "force"]);
        let _ = gluster(&["volume", "delete", VOLUME]);
        let names: Vec<String> = d.bricks.iter().map(|b| format!("{HOST}:{}", b.display())).collect();
        let (k, m) = (DATA_BRICKS.to_string(), REDUNDANCY.to_string());
        let mut args = vec!["volume", "create", VOLUME, "disperse-data", &k, "redundancy", &m, "transport", "tcp"];
        args.extend(names.iter().map(String::as_str));
        args.push("force");
        gluster(&args)?;
        d.created = true;
        gluster(&["volume", "start", VOLUME])?;
        crate::mount::run(
            Command::new("mount").args(["-t", "glusterfs"]).arg(format!("{HOST}:/{VOLUME}")).arg(&d.mnt),
            "mount -t glusterfs",
        )?;
        for _ in 0..600 {
            if is_mounted(&d.mnt) {
                return Ok(d);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("the glusterfs mount of {} did not appear within 30 s", d.mnt.display())
    }

    /// The pid of brick `i`'s `glusterfsd`, from glusterd's pid file, checked against the process's command line.
    pub fn brick_pid(&self, i: usize) -> Result<u32> {
        let brick = &self.bricks[i];
        let name = brick.to_string_lossy().trim_start_matches('/').replace('/', "-");
        let file = PathBuf::from(format!("/var/run/gluster/vols/{VOLUME}/{HOST}-{name}.pid"));
        let pid: u32 = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?
            .trim()
            .parse()
            .with_context(|| format!("{}: not a pid", file.display()))?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let words: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        let brick_arg = brick.to_string_lossy();
        let is_it = words.first().is_some_and(|w| w.ends_with(b"glusterfsd"))
            && words.windows(2).any(|w| w[0] == b"--brick-name" && w[1] == brick_arg.as_bytes());
        if !is_it {
            bail!("pid {pid} from {} is not the glusterfsd of brick {}", file.display(), brick.display());
        }
        Ok(pid)
    }

    /// `kill -9` of brick `i`'s process; returns once the process is gone from the process table. (A killed brick
    /// is reaped by init, which may take a moment; until then glusterd takes its pid for a running brick and
    /// `volume start force` would not start it again.)
    pub fn kill_brick(&self, i: usize) -> Result<u32> {
        let pid = self.brick_pid(i)?;
        kill(Pid::from_raw(pid as i32), Signal::SIGKILL).with_context(|| format!("kill -9 {pid}"))?;
        for _ in 0..600 {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                return Ok(pid);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("brick process {pid} was killed but is still in the process table after 30 s")
    }

    /// Brings brick `i`, killed as `old_pid`, back (`gluster volume start VOL force`) and waits until a new
    /// process serves it.
    pub fn restart_brick(&self, i: usize, old_pid: u32) -> Result<()> {
        gluster(&["volume", "start", VOLUME, "force"])?;
        for _ in 0..600 {
            if self.brick_pid(i).is_ok_and(|p| p != old_pid) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!(
            "brick {} did not come back within 30 s of `gluster volume start {VOLUME} force`",
            self.bricks[i].display()
        )
    }

    /// `gluster volume heal VOL`: the self-heal daemon heals the indexed entries now.
    pub fn trigger_heal(&self) -> Result<()> {
        gluster(&["volume", "heal", VOLUME]).map(drop)
    }

    /// Entries left to heal over every brick, from `gluster volume heal VOL info`; `None` while any brick is not
    /// connected (its count is unknown).
    pub fn heal_entries(&self) -> Result<Option<u64>> {
        parse_heal_info(&gluster(&["volume", "heal", VOLUME, "info"])?, self.bricks.len())
    }

    /// Waits until the heal info shows 0 entries on every (connected) brick; the seconds it took from `since`.
    pub fn wait_healed(&self, since: Instant, timeout: Duration) -> Result<f64> {
        loop {
            if self.heal_entries()? == Some(0) {
                return Ok(since.elapsed().as_secs_f64());
            }
            if since.elapsed() > timeout {
                let info = gluster(&["volume", "heal", VOLUME, "info", "summary"]).unwrap_or_else(|e| e.to_string());
                bail!("GlusterFS did not heal within {timeout:?}: {info}");
            }
            std::thread::sleep(Duration::from_millis(HEAL_POLL_MS));
        }
    }
}

impl Drop for Disperse {
    fn drop(&mut self) {
        if is_mounted(&self.mnt) {
            let _ = Command::new("umount").arg(&self.mnt).status();
        }
        if is_mounted(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
        if self.created {
            let _ = gluster(&["volume", "stop", VOLUME, "force"]);
            let _ = gluster(&["volume", "delete", VOLUME]);
        }
        if let Some(pid) = self.glusterd_pid {
            // The glusterd this run started (its own pid file), and only it.
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        }
    }
}

fn is_mounted(dir: &Path) -> bool {
    let dir = dir.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mounts").unwrap_or_default().lines().any(|l| l.split(' ').nth(1) == Some(&dir))
}

/// The total of `Number of entries: N` over `bricks` bricks of a `heal info` output; `None` when a brick is not
/// `Connected`, shows `-`, or is missing.
fn parse_heal_info(out: &str, bricks: usize) -> Result<Option<u64>> {
    let (mut seen, mut total, mut connected) = (0usize, 0u64, 0usize);
    for line in out.lines().map(str::trim) {
        if let Some(s) = line.strip_prefix("Status:") {
            connected += usize::from(s.trim() == "Connected");
        } else if let Some(n) = line.strip_prefix("Number of entries:") {
            seen += 1;
            match n.trim().parse::<u64>() {
                Ok(n) => total += n,
                Err(_) => return Ok(None),
            }
        }
    }
    if seen != bricks || connected != bricks {
        return Ok(None);
    }
    Ok(Some(total))
}

/// Writes `size` bytes of the pattern of `seed` to `path` in `record`-byte writes, then closes it (the close
/// flushes GlusterFS's write-behind, as a Weft commit ends a write pass); (secs, client CPU secs).
pub fn write_file(path: &Path, seed: u64, size: u64, record: u64) -> Result<(f64, f64)> {
    let mut buf = vec![0u8; record as usize];
    let (t, c) = (Instant::now(), ceilings::cpu_seconds());
    let mut f = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut at = 0;
    while at < size {
        let n = record.min(size - at) as usize;
        fill_pattern(seed, at, &mut buf[..n]);
        f.write_all(&buf[..n]).with_context(|| format!("writing {} at {at}", path.display()))?;
        at += n as u64;
    }
    drop(f);
    Ok((t.elapsed().as_secs_f64(), ceilings::cpu_seconds() - c))
}

/// Reads `path` in `record`-byte reads after dropping its pages from this host's page cache (so the bytes come
/// from the bricks, as a Weft read comes from the data servers), comparing them with the pattern of `seed`;
/// (secs, client CPU secs).
pub fn read_file(path: &Path, seed: u64, size: u64, record: u64) -> Result<(f64, f64)> {
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    posix_fadvise(&f, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED)
        .with_context(|| format!("dropping the cached pages of {}", path.display()))?;
    let mut buf = vec![0u8; record as usize];
    let (t, c) = (Instant::now(), ceilings::cpu_seconds());
    let mut at = 0;
    while at < size {
        let n = record.min(size - at) as usize;
        f.read_exact(&mut buf[..n]).with_context(|| format!("reading {} at {at}", path.display()))?;
        if let Some(bad) = pattern_mismatch(seed, at, &buf[..n]) {
            bail!("GlusterFS returned wrong bytes: {} at offset {bad}", path.display());
        }
        at += n as u64;
    }
    Ok((t.elapsed().as_secs_f64(), ceilings::cpu_seconds() - c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heal_info_counts_entries_only_when_every_brick_is_connected() {
        let brick =
            |n: &str, status: &str| format!("Brick 127.0.0.2:/b\n/ \nStatus: {status}\nNumber of entries: {n}\n\n");
        let all = |n: &str| (0..6).map(|_| brick(n, "Connected")).collect::<String>();
        assert_eq!(parse_heal_info(&all("0"), 6).unwrap(), Some(0));
        assert_eq!(parse_heal_info(&all("3"), 6).unwrap(), Some(18));
        let one_down = brick("-", "Transport endpoint is not connected") + &all("0")[..];
        assert_eq!(parse_heal_info(&one_down, 7).unwrap(), None);
        assert_eq!(parse_heal_info(&all("0"), 7).unwrap(), None, "a brick missing from the output");
        assert_eq!(parse_heal_info("", 6).unwrap(), None);
    }
}
