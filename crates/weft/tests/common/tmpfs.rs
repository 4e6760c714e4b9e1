//! A size-limited tmpfs for a data server's root: a disk that fills (the tests run as root).

use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs mounted over a directory; unmounted on drop (lazily, so a server still holding files open, or a failed
/// test, never leaves it behind).
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    pub fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("running mount");
        assert!(ok.success(), "mounting a tmpfs on {} (the tests run as root)", dir.display());
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}
