//! A `weft mount` process for the tests that use the kernel mount (fuse.rs, permissions.rs).

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::{TestCluster, WEFT};

/// A `weft mount` process; unmounted (and the process reaped) on drop, even when the test failed.
pub struct Mount {
    pub child: Child,
    pub dir: PathBuf,
}

impl Mount {
    pub fn start(cl: &TestCluster, dir: &Path, extra: &[&str]) -> Mount {
        Mount::start_from(&cl.cluster_file(), dir, extra, None)
    }

    /// As [`Mount::start`], from the cluster file `cluster`, with the daemon's log (warnings) in `log` if given
    /// (else on the test's stderr).
    pub fn start_from(cluster: &Path, dir: &Path, extra: &[&str], log: Option<&Path>) -> Mount {
        std::fs::create_dir_all(dir).unwrap();
        let stderr = match log {
            Some(p) => Stdio::from(std::fs::File::create(p).unwrap()),
            None => Stdio::inherit(),
        };
        let mut child = Command::new(WEFT)
            .arg("mount")
            .arg("--cluster")
            .arg(cluster)
            .arg(dir)
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("running weft mount");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert!(line.starts_with("WEFT-MOUNTED "), "weft mount did not mount {}: {line:?}", dir.display());
        Mount { child, dir: dir.to_path_buf() }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        terminate(self.child.id());
        let _ = self.child.wait();
        // If the daemon could not unmount (a test left a file open), do not leave a dead mount behind.
        if is_mounted(&self.dir) {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}

pub fn terminate(pid: u32) {
    let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
}

pub fn is_mounted(dir: &Path) -> bool {
    let dir = dir.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mounts").unwrap().lines().any(|l| l.split(' ').nth(1) == Some(&dir))
}
