//! `weft mount` against a real cluster and a real kernel mount: POSIX operations and their errno, consistency
//! between two mounts, and real tools (tar, diff, git) on the mount.

use crate::common;

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};

use common::mount::*;
use common::*;

fn errno(r: std::io::Result<impl Sized>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.raw_os_error().expect("an OS error"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn files_read_write_truncate_append_and_their_errors() {
    let cl = start("fuse-files", 3).await;
    let m = Mount::start(&cl, &test_dir("fuse-files-mnt"), &[]);
    let tests = tokio::task::spawn_blocking(move || {
        // A multi-stripe file written and read back through the kernel.
        let data = pattern(5, 0, 3_500_000);
        std::fs::write(m.path("big"), &data).unwrap();
        assert_eq!(std::fs::read(m.path("big")).unwrap(), data);
        assert_eq!(std::fs::metadata(m.path("big")).unwrap().len(), data.len() as u64);

        // Overwrite in the middle, read a range.
        let mut f = std::fs::OpenOptions::new().read(true).write(true).open(m.path("big")).unwrap();
        f.seek(SeekFrom::Start(1_048_000)).unwrap();
        f.write_all(&[0xAB; 1000]).unwrap();
        f.seek(SeekFrom::Start(1_047_990)).unwrap();
        let mut buf = [0u8; 20];
        f.read_exact(&mut buf).unwrap();
        assert_eq!(&buf[..10], &data[1_047_990..1_048_000]);
        assert_eq!(buf[10..], [0xAB; 10]);
        drop(f);

        // O_APPEND, O_TRUNC, O_EXCL.
        std::fs::write(m.path("log"), b"one\n").unwrap();
        let mut a = std::fs::OpenOptions::new().append(true).open(m.path("log")).unwrap();
        a.write_all(b"two\n").unwrap();
        drop(a);
        assert_eq!(std::fs::read(m.path("log")).unwrap(), b"one\ntwo\n");
        std::fs::OpenOptions::new().write(true).truncate(true).open(m.path("log")).unwrap();
        assert_eq!(std::fs::metadata(m.path("log")).unwrap().len(), 0);
        let excl = std::fs::OpenOptions::new().write(true).create_new(true).open(m.path("log"));
        assert_eq!(errno(excl), libc::EEXIST);

        // Truncate down and up: the cut bytes read back as zeros.
        let f = std::fs::OpenOptions::new().write(true).open(m.path("big")).unwrap();
        f.set_len(10_000).unwrap();
        f.set_len(20_000).unwrap();
        drop(f);
        let back = std::fs::read(m.path("big")).unwrap();
        assert_eq!(back.len(), 20_000);
        assert_eq!(&back[..10_000], &data[..10_000]);
        assert!(back[10_000..].iter().all(|&b| b == 0));

        // A hole.
        let mut h = std::fs::File::create(m.path("holey")).unwrap();
        h.seek(SeekFrom::Start(5_000_000)).unwrap();
        h.write_all(b"end").unwrap();
        drop(h);
        let back = std::fs::read(m.path("holey")).unwrap();
        assert_eq!(back.len(), 5_000_003);
        assert!(back[..5_000_000].iter().all(|&b| b == 0));

        // O_DIRECT reads and writes (the page cache is bypassed).
        let mut d = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(m.path("log"))
            .unwrap();
        let block = vec![7u8; 4096];
        d.write_all(&block).unwrap();
        d.seek(SeekFrom::Start(0)).unwrap();
        let mut back = vec![0u8; 4096];
        d.read_exact(&mut back).unwrap();
        assert_eq!(back, block);
        drop(d);

        // chmod, utimes, fsync.
        std::fs::set_permissions(m.path("log"), std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(std::fs::metadata(m.path("log")).unwrap().permissions().mode() & 0o7777, 0o600);
        let f = std::fs::File::options().write(true).open(m.path("log")).unwrap();
        let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
        f.set_modified(when).unwrap();
        f.sync_all().unwrap();
        drop(f);
        assert_eq!(std::fs::metadata(m.path("log")).unwrap().mtime(), 1_000_000_000);

        // Errors.
        assert_eq!(errno(std::fs::read(m.path("missing"))), libc::ENOENT);
        assert_eq!(errno(std::fs::read(m.path("log/below"))), libc::ENOTDIR);
        assert_eq!(errno(std::fs::write(m.path(&"n".repeat(256)), b"x")), libc::ENAMETOOLONG);
        std::fs::write(m.path(&"n".repeat(255)), b"x").unwrap();
        assert_eq!(errno(std::fs::OpenOptions::new().write(true).open(&m.dir)), libc::EISDIR);
        // statfs works and reports space.
        let st = nix_statvfs(&m.dir);
        assert!(st.0 > 0 && st.1 <= st.0, "{st:?}");
    });
    tests.await.unwrap();
}

/// (blocks, free blocks) of the file system at `p`.
fn nix_statvfs(p: &Path) -> (u64, u64) {
    let out = Command::new("stat").args(["-f", "-c", "%b %f"]).arg(p).output().unwrap();
    assert!(out.status.success());
    let s = String::from_utf8(out.stdout).unwrap();
    let mut it = s.split_whitespace().map(|x| x.parse::<u64>().unwrap());
    (it.next().unwrap(), it.next().unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn directories_links_renames_and_their_errors() {
    let cl = start("fuse-dirs", 2).await;
    let m = Mount::start(&cl, &test_dir("fuse-dirs-mnt"), &[]);
    tokio::task::spawn_blocking(move || {
        std::fs::create_dir(m.path("d")).unwrap();
        assert_eq!(errno(std::fs::create_dir(m.path("d"))), libc::EEXIST);
        let n = 3000;
        for i in 0..n {
            std::fs::write(m.path(&format!("d/f{i:05}")), i.to_string()).unwrap();
        }
        let mut names: Vec<String> =
            std::fs::read_dir(m.path("d")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        assert_eq!(names, (0..n).map(|i| format!("f{i:05}")).collect::<Vec<_>>());
        assert_eq!(std::fs::read_to_string(m.path("d/f02999")).unwrap(), "2999");

        assert_eq!(errno(std::fs::remove_dir(m.path("d"))), libc::ENOTEMPTY);
        assert_eq!(errno(std::fs::remove_dir(m.path("d/f00001"))), libc::ENOTDIR);
        assert_eq!(errno(std::fs::remove_file(m.path("d"))), libc::EISDIR);

        // rename: replace an existing target, across directories, NOREPLACE, a directory under itself.
        std::fs::create_dir(m.path("e")).unwrap();
        std::fs::write(m.path("e/target"), b"old").unwrap();
        std::fs::rename(m.path("d/f00000"), m.path("e/target")).unwrap();
        assert_eq!(std::fs::read_to_string(m.path("e/target")).unwrap(), "0");
        assert_eq!(errno(std::fs::metadata(m.path("d/f00000"))), libc::ENOENT);
        std::fs::write(m.path("e/other"), b"o").unwrap();
        assert_eq!(renameat2(&m.path("e/other"), &m.path("e/target"), libc::RENAME_NOREPLACE), libc::EEXIST);
        // RENAME_EXCHANGE swaps two existing names atomically, a file with a directory too.
        assert_eq!(renameat2(&m.path("e/other"), &m.path("e/target"), libc::RENAME_EXCHANGE), 0);
        assert_eq!(std::fs::read_to_string(m.path("e/other")).unwrap(), "0");
        assert_eq!(std::fs::read_to_string(m.path("e/target")).unwrap(), "o");
        assert_eq!(renameat2(&m.path("e/other"), &m.path("e/missing"), libc::RENAME_EXCHANGE), libc::ENOENT);
        std::fs::create_dir(m.path("xdir")).unwrap();
        assert_eq!(renameat2(&m.path("e/other"), &m.path("xdir"), libc::RENAME_EXCHANGE), 0);
        assert!(std::fs::metadata(m.path("e/other")).unwrap().is_dir());
        assert_eq!(std::fs::read_to_string(m.path("xdir")).unwrap(), "0");
        assert_eq!(renameat2(&m.path("e/other"), &m.path("xdir"), libc::RENAME_EXCHANGE), 0);
        std::fs::remove_dir(m.path("xdir")).unwrap();
        std::fs::create_dir(m.path("e/sub")).unwrap();
        assert_eq!(errno(std::fs::rename(m.path("e"), m.path("e/sub/e"))), libc::EINVAL);

        // Hard and symbolic links.
        std::fs::hard_link(m.path("e/target"), m.path("hard")).unwrap();
        assert_eq!(std::fs::metadata(m.path("hard")).unwrap().nlink(), 2);
        assert_eq!(
            std::fs::metadata(m.path("e/target")).unwrap().ino(),
            std::fs::metadata(m.path("hard")).unwrap().ino()
        );
        std::os::unix::fs::symlink("e/target", m.path("sym")).unwrap();
        assert_eq!(std::fs::read_link(m.path("sym")).unwrap(), Path::new("e/target"));
        assert_eq!(std::fs::read_to_string(m.path("sym")).unwrap(), "o", "e/target holds what e/other held");
        assert_eq!(errno(std::fs::hard_link(m.path("e"), m.path("dirlink"))), libc::EPERM);

        // mknod of a regular file, a FIFO, a device node; a socket by bind(2). The special files are metadata
        // only: a FIFO works as a pipe through the kernel, the device keeps its number.
        use std::os::unix::fs::FileTypeExt;
        assert_eq!(mknod(&m.path("node"), libc::S_IFREG | 0o644), 0);
        assert!(std::fs::metadata(m.path("node")).unwrap().is_file());
        assert_eq!(mknod(&m.path("node"), libc::S_IFIFO | 0o644), libc::EEXIST);
        assert_eq!(mknod(&m.path("fifo"), libc::S_IFIFO | 0o640), 0);
        let md = std::fs::symlink_metadata(m.path("fifo")).unwrap();
        assert!(md.file_type().is_fifo());
        assert_eq!(md.mode() & 0o7777, 0o640);
        let fifo = m.path("fifo");
        let writer = std::thread::spawn(move || std::fs::write(fifo, b"through the pipe").unwrap());
        assert_eq!(std::fs::read(m.path("fifo")).unwrap(), b"through the pipe");
        writer.join().unwrap();
        let dev = libc::makedev(1, 3);
        let c = cpath(&m.path("null"));
        // SAFETY: a NUL-terminated path that outlives the call.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, dev) };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        let md = std::fs::symlink_metadata(m.path("null")).unwrap();
        assert!(md.file_type().is_char_device());
        assert_eq!(md.rdev(), dev);
        let sock = std::os::unix::net::UnixListener::bind(m.path("sock")).unwrap();
        assert!(std::fs::symlink_metadata(m.path("sock")).unwrap().file_type().is_socket());
        drop(sock);
        assert_eq!(errno(std::fs::write(m.path("fifo/below"), b"x")), libc::ENOTDIR);
        std::fs::remove_file(m.path("fifo")).unwrap();
        std::fs::remove_file(m.path("null")).unwrap();
        std::fs::remove_file(m.path("sock")).unwrap();

        // A set-group-ID directory hands its group to new entries, and its bit to new subdirectories.
        std::fs::create_dir(m.path("sgid")).unwrap();
        std::os::unix::fs::chown(m.path("sgid"), None, Some(4242)).unwrap();
        std::fs::set_permissions(m.path("sgid"), std::fs::Permissions::from_mode(0o2775)).unwrap();
        std::fs::write(m.path("sgid/f"), b"").unwrap();
        std::fs::create_dir(m.path("sgid/d")).unwrap();
        assert_eq!(std::fs::metadata(m.path("sgid/f")).unwrap().gid(), 4242);
        let d = std::fs::metadata(m.path("sgid/d")).unwrap();
        assert_eq!((d.gid(), d.mode() & 0o2000), (4242, 0o2000));
        std::fs::remove_dir_all(m.path("sgid")).unwrap();

        // Remove everything again.
        std::fs::remove_dir_all(m.path("d")).unwrap();
        std::fs::remove_dir_all(m.path("e")).unwrap();
        assert_eq!(errno(std::fs::read_dir(m.path("d"))), libc::ENOENT);
    })
    .await
    .unwrap();
}

fn cpath(p: &Path) -> std::ffi::CString {
    std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
}

/// renameat2(2)'s errno (0 on success).
fn renameat2(from: &Path, to: &Path, flags: libc::c_uint) -> i32 {
    let (a, b) = (cpath(from), cpath(to));
    // SAFETY: two NUL-terminated paths that outlive the call.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::renameat2(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), flags) };
    if rc == 0 { 0 } else { std::io::Error::last_os_error().raw_os_error().unwrap() }
}

/// mknod(2)'s errno (0 on success).
fn mknod(p: &Path, mode: libc::mode_t) -> i32 {
    let c = cpath(p);
    // SAFETY: a NUL-terminated path that outlives the call.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::mknod(c.as_ptr(), mode, 0) };
    if rc == 0 { 0 } else { std::io::Error::last_os_error().raw_os_error().unwrap() }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_mounts_see_each_other_close_to_open() {
    let cl = start("fuse-two", 2).await;
    let a = Mount::start(&cl, &test_dir("fuse-two-a"), &[]);
    // Entry and attribute timeouts of 0: a change elsewhere is seen at the next lookup.
    let b = Mount::start(&cl, &test_dir("fuse-two-b"), &["--entry-timeout-ms", "0", "--attr-timeout-ms", "0"]);
    tokio::task::spawn_blocking(move || {
        let data = pattern(9, 0, 2_000_000);
        std::fs::write(a.path("shared"), &data).unwrap();
        assert_eq!(std::fs::read(b.path("shared")).unwrap(), data, "written and closed in A, read in B");
        // Rewritten in A, re-opened in B: the new bytes, not B's cached pages.
        let data2 = pattern(10, 0, 2_000_000);
        std::fs::write(a.path("shared"), &data2).unwrap();
        assert_eq!(std::fs::read(b.path("shared")).unwrap(), data2);
        std::fs::rename(a.path("shared"), a.path("renamed")).unwrap();
        assert_eq!(errno(std::fs::metadata(b.path("shared"))), libc::ENOENT);
        assert_eq!(std::fs::read(b.path("renamed")).unwrap(), data2);
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn real_tools_tar_diff_and_git_work_on_the_mount() {
    let cl = start("fuse-tools", 3).await;
    let m = Mount::start(&cl, &test_dir("fuse-tools-mnt"), &[]);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf(); // crates/
    tokio::task::spawn_blocking(move || {
        let sh = |cmd: &str| {
            let out = Command::new("sh").arg("-c").arg(cmd).output().unwrap();
            assert!(
                out.status.success(),
                "{cmd}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let mnt = m.dir.display().to_string();
        // tar in, tar out, byte-for-byte diff.
        sh(&format!("tar -C {} -cf - --exclude=target . | tar -C {mnt} -xf -", src.display()));
        sh(&format!("diff -r --exclude=target {} {mnt}", src.display()));
        let out = test_dir("fuse-tools-out");
        sh(&format!("tar -C {mnt} -cf - . | tar -C {} -xf -", out.display()));
        sh(&format!("diff -r {mnt} {}", out.display()));
        // git: init, add, commit, fsck on the mount.
        std::fs::create_dir(m.path("repo")).unwrap();
        sh(&format!(
            "cd {mnt}/repo && git init -q && cp -r {mnt}/weft-proto . && git add -A && \
             git -c user.name=t -c user.email=t@e commit -q -m first && git fsck --strict && git log --oneline"
        ));
        let log = sh(&format!("cd {mnt}/repo && git log --oneline | wc -l"));
        assert_eq!(log.trim(), "1");
        let _ = std::fs::remove_dir_all(out);
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn permissions_follow_uid_gid_and_mode() {
    let cl = start("fuse-perm", 1).await;
    let m = Mount::start(&cl, &test_dir("fuse-perm-mnt"), &["--allow-other", "--attr-timeout-ms", "0"]);
    tokio::task::spawn_blocking(move || {
        // As an unprivileged user (nobody): returns the exit status of `sh -c cmd`.
        let as_nobody = |cmd: &str| {
            Command::new("setpriv")
                .args(["--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", cmd])
                .stderr(Stdio::null())
                .status()
                .unwrap()
                .success()
        };
        let mnt = m.dir.display().to_string();
        std::fs::set_permissions(&m.dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(m.path("secret"), b"root only").unwrap();
        std::fs::set_permissions(m.path("secret"), std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(m.path("public"), b"everyone").unwrap();
        std::fs::set_permissions(m.path("public"), std::fs::Permissions::from_mode(0o644)).unwrap();

        assert!(!as_nobody(&format!("cat {mnt}/secret")), "mode 0600 of root refuses others");
        // access(2) (test -r/-w/-x) answers from the same mode bits.
        assert!(!as_nobody(&format!("test -r {mnt}/secret")), "access(R_OK) is EACCES");
        assert!(as_nobody(&format!("test -r {mnt}/public && ! test -w {mnt}/public && ! test -x {mnt}/public")));
        assert!(as_nobody(&format!("test -x {mnt} && ! test -w {mnt}")));
        assert!(as_nobody(&format!("cat {mnt}/public")));
        assert!(!as_nobody(&format!("echo x >> {mnt}/public")), "no write bit for others");
        assert!(!as_nobody(&format!("touch {mnt}/new")), "the root directory is 0755 root");
        assert!(!as_nobody(&format!("chmod 666 {mnt}/public")), "only the owner may chmod");

        // A directory nobody may write: files created there belong to nobody.
        std::fs::create_dir(m.path("pub")).unwrap();
        std::fs::set_permissions(m.path("pub"), std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(as_nobody(&format!("echo mine > {mnt}/pub/own && chmod 600 {mnt}/pub/own")));
        let md = std::fs::metadata(m.path("pub/own")).unwrap();
        assert_eq!((md.uid(), md.gid(), md.mode() & 0o777), (65534, 65534, 0o600));
        assert!(!as_nobody(&format!("chown 0 {mnt}/pub/own")), "giving a file away needs CAP_CHOWN");
    })
    .await
    .unwrap();
}

/// Runs a shell command, asserting success; returns its stdout.
fn sh(cmd: &str) -> String {
    let out = Command::new("sh").arg("-c").arg(cmd).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn fio_dbench_rsync_and_sqlite_run_on_the_mount() {
    let cl = start("fuse-fio", 2).await;
    let m = Mount::start(&cl, &test_dir("fuse-fio-mnt"), &[]);
    tokio::task::spawn_blocking(move || {
        let mnt = m.dir.display().to_string();
        // fio writes with checksums and reads them back (do_verify): any wrong byte fails the job.
        let fio = |args: &str| {
            let out = sh(&format!(
                "fio --directory={mnt} --fallocate=none --verify_state_save=0 --output-format=terse {args}"
            ));
            // Terse format field 5 is the job's error code.
            let err = out.split(';').nth(4).unwrap_or("?").to_string();
            assert_eq!(err, "0", "fio {args}: {out}");
        };
        fio("--name=seq --rw=write --bs=1M --size=64M --verify=crc32c --do_verify=1");
        fio("--name=seq --rw=read --bs=1M --size=64M");
        fio("--name=rand --rw=randwrite --bs=4k --size=8M --verify=crc32c --do_verify=1");
        fio("--name=rand --rw=randread --bs=4k --size=8M");
        fio("--name=direct --rw=randwrite --bs=4k --size=4M --direct=1 --verify=crc32c --do_verify=1");
        fio("--name=direct --rw=randread --bs=4k --size=4M --direct=1");

        // dbench: a file-server mix of creates, renames, reads, writes and unlinks, two clients.
        let out = sh(&format!("dbench -D {mnt} -c /usr/share/dbench/client.txt -t 5 2"));
        assert!(out.contains("Throughput"), "{out}");

        // rsync -a round trip, then a checksum pass that finds nothing to change.
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join("weft-proto");
        let back = test_dir("fuse-fio-back");
        sh(&format!("rsync -a {}/ {mnt}/rs/", src.display()));
        sh(&format!("rsync -a {mnt}/rs/ {}/", back.display()));
        sh(&format!("diff -r {} {}", src.display(), back.display()));
        assert_eq!(sh(&format!("rsync -ai --checksum {}/ {mnt}/rs/", src.display())).trim(), "");
        let _ = std::fs::remove_dir_all(back);

        // SQLite: a database created, filled and queried on the mount, and its integrity checked.
        let script = m.path("fill.sql");
        let mut sql = String::from("create table t(a integer, b text);\nbegin;\n");
        for i in 0..2000 {
            sql.push_str(&format!("insert into t values({i}, 'row {i}');\n"));
        }
        sql.push_str("commit;\ncreate index ta on t(a);\n");
        std::fs::write(&script, sql).unwrap();
        sh(&format!("sqlite3 {mnt}/db.sqlite < {}", script.display()));
        let q = sh(&format!(
            "sqlite3 {mnt}/db.sqlite 'select count(*), sum(a) from t where a >= 0; pragma integrity_check;'"
        ));
        assert_eq!(q.trim(), "2000|1999000\nok");
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn daemon_mode_returns_once_mounted_and_umount_stops_it() {
    let cl = start("fuse-daemon", 1).await;
    let dir = test_dir("fuse-daemon-mnt");
    let log = test_dir("fuse-daemon-log").join("mount.log");
    let out = Command::new(WEFT)
        .args(["mount", "--daemon", "--log", log.to_str().unwrap(), "--cluster"])
        .arg(cl.cluster_file())
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(is_mounted(&dir), "mounted when --daemon returns");
    std::fs::write(dir.join("f"), b"daemon").unwrap();
    assert_eq!(std::fs::read(dir.join("f")).unwrap(), b"daemon");
    // `umount DIR` ends the daemon's session; the daemon notices and exits.
    sh(&format!("umount {}", dir.display()));
    assert!(!is_mounted(&dir));
    let pid = String::from_utf8_lossy(&out.stdout)
        .split("daemon pid ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .and_then(|s| s.trim().parse::<u32>().ok())
        .expect("the daemon's pid is printed");
    // Waiting for an unrelated process to exit: poll /proc (bounded), not a timing assertion.
    let gone = (0..200).any(|_| {
        let alive = Path::new(&format!("/proc/{pid}")).exists()
            && !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z ");
        if alive {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        !alive
    });
    assert!(gone, "the daemon exits after umount");
}

/// Pages of `p` in the page cache, as util-linux's fincore counts them (it opens the file first).
fn cached_pages(p: &Path) -> u64 {
    let out = sh(&format!("fincore --noheadings --output PAGES {}", p.display()));
    out.trim().parse().unwrap_or_else(|e| panic!("fincore said {out:?}: {e}"))
}

/// utimensat(2) on `p` with raw timespecs (UTIME_NOW / UTIME_OMIT allowed); its errno (0 on success).
fn utimensat(p: &Path, atime: libc::timespec, mtime: libc::timespec) -> i32 {
    let c = cpath(p);
    let times = [atime, mtime];
    // SAFETY: a NUL-terminated path and a two-element timespec array, both outliving the call.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) };
    if rc == 0 { 0 } else { std::io::Error::last_os_error().raw_os_error().unwrap() }
}

fn ts(sec: i64, nsec: i64) -> libc::timespec {
    libc::timespec { tv_sec: sec, tv_nsec: nsec }
}

#[tokio::test(flavor = "multi_thread")]
async fn setattr_combinations_and_rename_errors() {
    let cl = start("fuse-setattr", 2).await;
    let m = Mount::start(&cl, &test_dir("fuse-setattr-mnt"), &["--attr-timeout-ms", "0"]);
    tokio::task::spawn_blocking(move || {
        let f = m.path("f");
        std::fs::write(&f, b"0123456789").unwrap();

        // utimens: explicit times, then UTIME_OMIT keeps one, UTIME_NOW sets the other to the present.
        assert_eq!(utimensat(&f, ts(1_000, 5), ts(2_000, 7)), 0);
        let md = std::fs::metadata(&f).unwrap();
        assert_eq!((md.atime(), md.atime_nsec(), md.mtime(), md.mtime_nsec()), (1_000, 5, 2_000, 7));
        let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
        assert_eq!(utimensat(&f, ts(0, libc::UTIME_OMIT), ts(0, libc::UTIME_NOW)), 0);
        let md = std::fs::metadata(&f).unwrap();
        assert_eq!((md.atime(), md.atime_nsec()), (1_000, 5), "UTIME_OMIT leaves atime alone");
        assert!(md.mtime() >= before, "UTIME_NOW sets mtime to now: {} < {before}", md.mtime());
        assert_eq!(utimensat(&f, ts(0, libc::UTIME_NOW), ts(0, libc::UTIME_OMIT)), 0);
        let md2 = std::fs::metadata(&f).unwrap();
        assert!(md2.atime() >= before);
        assert_eq!((md2.mtime(), md2.mtime_nsec()), (md.mtime(), md.mtime_nsec()), "UTIME_OMIT leaves mtime alone");
        assert_eq!(utimensat(&f, ts(0, 1_000_000_000), ts(0, 0)), libc::EINVAL, "nanoseconds out of range");

        // chown (root may give files away), chmod keeps the file type, and ctime moves on each.
        std::os::unix::fs::chown(&f, Some(65534), Some(65534)).unwrap();
        let md = std::fs::metadata(&f).unwrap();
        assert_eq!((md.uid(), md.gid()), (65534, 65534));
        std::os::unix::fs::chown(&f, None, Some(0)).unwrap();
        assert_eq!(std::fs::metadata(&f).unwrap().gid(), 0);
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o4751)).unwrap();
        let md = std::fs::metadata(&f).unwrap();
        assert_eq!(md.mode(), libc::S_IFREG | 0o4751);

        // truncate by path while another handle is open: the open handle sees the new size and zeros.
        let mut open = std::fs::File::open(&f).unwrap();
        let t = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
        t.set_len(4).unwrap();
        drop(t);
        let mut got = Vec::new();
        open.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"0123");
        std::fs::OpenOptions::new().write(true).open(&f).unwrap().set_len(8).unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"0123\0\0\0\0");

        // A file removed while open stays readable through its handle.
        std::fs::write(m.path("doomed"), b"still here").unwrap();
        let mut h = std::fs::File::open(m.path("doomed")).unwrap();
        std::fs::remove_file(m.path("doomed")).unwrap();
        assert_eq!(errno(std::fs::metadata(m.path("doomed"))), libc::ENOENT);
        let mut s = String::new();
        h.read_to_string(&mut s).unwrap();
        assert_eq!(s, "still here");

        // rename's errors: a directory over a file, a file over a directory, over a non-empty directory, a
        // missing source, into a missing directory.
        std::fs::create_dir(m.path("d")).unwrap();
        std::fs::create_dir(m.path("full")).unwrap();
        std::fs::write(m.path("full/x"), b"x").unwrap();
        std::fs::create_dir(m.path("empty")).unwrap();
        assert_eq!(errno(std::fs::rename(m.path("d"), &f)), libc::ENOTDIR);
        assert_eq!(errno(std::fs::rename(&f, m.path("d"))), libc::EISDIR);
        assert_eq!(errno(std::fs::rename(m.path("d"), m.path("full"))), libc::ENOTEMPTY);
        assert_eq!(errno(std::fs::rename(m.path("nope"), m.path("d/nope"))), libc::ENOENT);
        assert_eq!(errno(std::fs::rename(&f, m.path("nodir/f"))), libc::ENOENT);
        // A directory replaces an empty one; a file replaces a file; renaming onto itself is a no-op.
        std::fs::rename(m.path("d"), m.path("empty")).unwrap();
        assert!(std::fs::metadata(m.path("empty")).unwrap().is_dir());
        assert_eq!(errno(std::fs::metadata(m.path("d"))), libc::ENOENT);
        std::fs::rename(&f, &f).unwrap();
        assert_eq!(std::fs::read(&f).unwrap().len(), 8);
        // Directory link counts follow subdirectories.
        assert_eq!(std::fs::metadata(m.path("full")).unwrap().nlink(), 2);
        std::fs::create_dir(m.path("full/sub")).unwrap();
        assert_eq!(std::fs::metadata(m.path("full")).unwrap().nlink(), 3);
        // Long names: 255 bytes is fine for every entry-making call, 256 is ENAMETOOLONG.
        let long = "L".repeat(256);
        assert_eq!(errno(std::fs::create_dir(m.path(&long))), libc::ENAMETOOLONG);
        assert_eq!(errno(std::os::unix::fs::symlink("x", m.path(&long))), libc::ENAMETOOLONG);
        assert_eq!(errno(std::fs::hard_link(&f, m.path(&long))), libc::ENAMETOOLONG);
        assert_eq!(errno(std::fs::rename(&f, m.path(&long))), libc::ENAMETOOLONG);
        assert_eq!(mknod(&m.path(&long), libc::S_IFREG | 0o644), libc::ENAMETOOLONG);
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn readdir_offsets_stay_stable_and_readdirplus_brings_attributes() {
    let cl = start("fuse-readdir", 2).await;
    let a = Mount::start(&cl, &test_dir("fuse-readdir-a"), &[]);
    let b = Mount::start(&cl, &test_dir("fuse-readdir-b"), &["--entry-timeout-ms", "0", "--attr-timeout-ms", "0"]);
    tokio::task::spawn_blocking(move || {
        std::fs::create_dir(a.path("d")).unwrap();
        let n = 2500;
        for i in 0..n {
            std::fs::write(a.path(&format!("d/f{i:05}")), vec![b'x'; i % 7]).unwrap();
        }
        // The directory's listing with attributes (readdirplus, as `ls -l` asks) matches stat of each name.
        let listed = sh(&format!("ls -ln --time-style=+%s {}", b.path("d").display()));
        let lines: Vec<&str> = listed.lines().skip(1).collect();
        assert_eq!(lines.len(), n);
        for (i, line) in lines.iter().enumerate() {
            let cols: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(cols[4].parse::<usize>().unwrap(), i % 7, "size in `ls -l`: {line}");
            assert_eq!(cols.last().unwrap(), &format!("f{i:05}"));
        }

        // A handle's offsets survive concurrent changes: read part of the listing, then entries behind and
        // ahead of the cursor are removed and added; the rest of the listing has no duplicates, and every entry
        // present throughout is listed exactly once.
        let dir = cpath(&b.path("d"));
        // SAFETY: a NUL-terminated path; the DIR* is used only here and closed below.
        #[allow(unsafe_code)]
        let dp = unsafe { libc::opendir(dir.as_ptr()) };
        assert!(!dp.is_null());
        let next = || -> Option<(String, i64)> {
            // SAFETY: `dp` is an open DIR*; the entry is copied out before the next call.
            #[allow(unsafe_code)]
            unsafe {
                let e = libc::readdir(dp);
                if e.is_null() {
                    return None;
                }
                let name = std::ffi::CStr::from_ptr((*e).d_name.as_ptr()).to_string_lossy().into_owned();
                Some((name, libc::telldir(dp)))
            }
        };
        let mut seen = Vec::new();
        let mut mark = 0;
        for k in 0..1000 {
            let (name, off) = next().unwrap();
            if k == 500 {
                mark = off;
            }
            seen.push(name);
        }
        for i in (0..400).step_by(2) {
            std::fs::remove_file(a.path(&format!("d/f{i:05}"))).unwrap();
        }
        for i in (2000..2400).step_by(2) {
            std::fs::remove_file(a.path(&format!("d/f{i:05}"))).unwrap();
        }
        std::fs::write(a.path("d/zz-new"), b"").unwrap();
        while let Some((name, _)) = next() {
            seen.push(name);
        }
        let mut dedup = seen.clone();
        dedup.sort();
        dedup.dedup();
        assert_eq!(dedup.len(), seen.len(), "no entry listed twice");
        for i in 0..n {
            let name = format!("f{i:05}");
            let removed = i % 2 == 0 && (i < 400 || (2000..2400).contains(&i));
            let stable = !removed;
            if stable {
                assert!(seen.contains(&name), "{name} was present all along but not listed");
            }
        }
        // seekdir back to a remembered offset resumes at the same entry.
        let after_mark = seen[501].clone();
        // SAFETY: `dp` is an open DIR* and `mark` an offset telldir returned for it.
        #[allow(unsafe_code)]
        unsafe {
            libc::seekdir(dp, mark)
        };
        assert_eq!(next().unwrap().0, after_mark);
        // SAFETY: `dp` is open and not used after this.
        #[allow(unsafe_code)]
        unsafe {
            libc::closedir(dp)
        };
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn cached_pages_are_kept_only_while_the_file_is_unchanged() {
    let cl = start("fuse-cache", 2).await;
    let a = Mount::start(&cl, &test_dir("fuse-cache-a"), &[]);
    let b = Mount::start(&cl, &test_dir("fuse-cache-b"), &["--entry-timeout-ms", "0", "--attr-timeout-ms", "0"]);
    tokio::task::spawn_blocking(move || {
        let data = pattern(3, 0, 3_000_000);
        std::fs::write(a.path("f"), &data).unwrap();
        // B reads the file; its next open keeps those pages (fincore opens the file and counts resident pages).
        assert_eq!(std::fs::read(b.path("f")).unwrap(), data);
        assert!(cached_pages(&b.path("f")) > 0, "an open of an unchanged file keeps the cached pages");
        assert_eq!(std::fs::read(b.path("f")).unwrap(), data);
        // A overwrites a range in place (same size) and closes: B's next open must drop its cached pages.
        let mut w = std::fs::OpenOptions::new().write(true).open(a.path("f")).unwrap();
        w.seek(SeekFrom::Start(1_000_000)).unwrap();
        w.write_all(&[0xEE; 70_000]).unwrap();
        drop(w);
        let mut want = data.clone();
        want[1_000_000..1_070_000].fill(0xEE);
        assert_eq!(cached_pages(&b.path("f")), 0, "an open after another mount's commit drops the cached pages");
        assert_eq!(std::fs::read(b.path("f")).unwrap(), want, "B must not serve its stale pages");
        // B writes, closes, reopens: its own writes are there; A sees them too.
        let mut w = std::fs::OpenOptions::new().write(true).open(b.path("f")).unwrap();
        w.write_all(b"from b").unwrap();
        drop(w);
        want[..6].copy_from_slice(b"from b");
        assert_eq!(std::fs::read(b.path("f")).unwrap(), want);
        assert_eq!(std::fs::read(a.path("f")).unwrap(), want);
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn writeback_cache_mount_keeps_data_and_sizes_right() {
    let cl = start("fuse-wb", 2).await;
    let a = Mount::start(&cl, &test_dir("fuse-wb-a"), &["--writeback-cache"]);
    let b = Mount::start(&cl, &test_dir("fuse-wb-b"), &["--entry-timeout-ms", "0", "--attr-timeout-ms", "0"]);
    tokio::task::spawn_blocking(move || {
        // Many small unaligned writes, which the kernel gathers into pages and flushes at close.
        let mut want = Vec::new();
        let mut f = std::fs::File::create(a.path("small")).unwrap();
        for i in 0..5000u32 {
            let chunk = format!("record {i:05} {}\n", "x".repeat((i % 13) as usize));
            f.write_all(chunk.as_bytes()).unwrap();
            want.extend_from_slice(chunk.as_bytes());
        }
        // Overwrite inside a page written earlier, then read through the same handle before close.
        f.seek(SeekFrom::Start(10)).unwrap();
        f.write_all(b"PATCH").unwrap();
        want[10..15].copy_from_slice(b"PATCH");
        drop(f);
        assert_eq!(std::fs::read(a.path("small")).unwrap(), want);
        // Closed in A: another mount reads every byte (close flushed the cached writes first).
        assert_eq!(std::fs::read(b.path("small")).unwrap(), want);
        assert_eq!(std::fs::metadata(b.path("small")).unwrap().len(), want.len() as u64);

        // O_APPEND, truncate down and up, and a write past the end leaving a hole.
        let mut ap = std::fs::OpenOptions::new().append(true).open(a.path("small")).unwrap();
        ap.write_all(b"tail").unwrap();
        drop(ap);
        want.extend_from_slice(b"tail");
        assert_eq!(std::fs::read(b.path("small")).unwrap(), want);
        let t = std::fs::OpenOptions::new().write(true).open(a.path("small")).unwrap();
        t.set_len(100).unwrap();
        t.set_len(200).unwrap();
        drop(t);
        let back = std::fs::read(b.path("small")).unwrap();
        assert_eq!(back.len(), 200);
        assert_eq!(&back[..100], &want[..100]);
        assert!(back[100..].iter().all(|&x| x == 0));
        let mut h = std::fs::File::create(a.path("holey")).unwrap();
        h.seek(SeekFrom::Start(3_000_000)).unwrap();
        h.write_all(b"end").unwrap();
        h.sync_all().unwrap();
        drop(h);
        let back = std::fs::read(b.path("holey")).unwrap();
        assert_eq!(back.len(), 3_000_003);
        assert!(back[..3_000_000].iter().all(|&x| x == 0));
        // fio's own verification of random 4 KiB writes through the writeback cache.
        sh(&format!(
            "cd {} && fio --name=wb --rw=randwrite --bs=4k --size=16M --verify=crc32c --do_verify=1 \
             --verify_state_save=0 --ioengine=psync --fallocate=none --output=/dev/null",
            a.dir.display()
        ));
    })
    .await
    .unwrap();
}

/// (name, d_ino) of every entry readdir(3) returns for `dir`, "." and ".." included.
fn raw_entries(dir: &Path) -> Vec<(String, u64)> {
    let c = cpath(dir);
    let mut out = Vec::new();
    // SAFETY: a NUL-terminated path; the DIR* is used only in this block and closed at its end; each entry is
    // copied out before the next readdir.
    #[allow(unsafe_code)]
    unsafe {
        let dp = libc::opendir(c.as_ptr());
        assert!(!dp.is_null(), "opendir {}", dir.display());
        loop {
            let e = libc::readdir(dp);
            if e.is_null() {
                break;
            }
            let name = std::ffi::CStr::from_ptr((*e).d_name.as_ptr()).to_string_lossy().into_owned();
            out.push((name, (*e).d_ino));
        }
        libc::closedir(dp);
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn readdir_lists_dot_and_dotdot_and_statfs_counts_one_disk_once() {
    let cl = start("fuse-dots", 3).await;
    let m = Mount::start(&cl, &test_dir("fuse-dots-mnt"), &[]);
    let disk_dir = std::env::temp_dir();
    tokio::task::spawn_blocking(move || {
        std::fs::create_dir_all(m.path("d/e")).unwrap();
        std::fs::write(m.path("d/e/f"), b"x").unwrap();
        let ino = |p: &str| std::fs::metadata(m.path(p)).unwrap().ino();
        // "." is the directory, ".." its parent; the root's ".." is the root. Read twice: the second listing is
        // served from a fresh handle too (plain readdir or readdirplus, as the kernel chooses).
        for _ in 0..2 {
            let e = raw_entries(&m.path("d/e"));
            assert_eq!(e, vec![(".".into(), ino("d/e")), ("..".into(), ino("d")), ("f".into(), ino("d/e/f"))]);
            let d = raw_entries(&m.path("d"));
            assert_eq!(&d[..2], &[(".".into(), ino("d")), ("..".into(), ino(""))]);
            let root = raw_entries(&m.dir);
            assert_eq!(&root[..2], &[(".".into(), ino("")), ("..".into(), ino(""))]);
        }
        // What users see: `ls -a` shows both, `find` walks without them.
        let ls = sh(&format!("ls -a {}", m.path("d/e").display()));
        assert_eq!(ls.split_whitespace().collect::<Vec<_>>(), [".", "..", "f"]);
        let found = sh(&format!("cd {} && find . | sort", m.dir.display()));
        assert_eq!(found.split_whitespace().collect::<Vec<_>>(), [".", "./d", "./d/e", "./d/e/f"]);

        // statfs (df) through the mount: three data servers on one disk are that disk's size once.
        let (blocks, _) = nix_statvfs(&m.dir);
        let out = Command::new("stat").args(["-f", "-c", "%S %b"]).arg(&disk_dir).output().unwrap();
        let v: Vec<u64> =
            String::from_utf8(out.stdout).unwrap().split_whitespace().map(|x| x.parse().unwrap()).collect();
        assert_eq!(blocks, v[0] * v[1] / 4096, "the mount's size is the disk's, counted once");
    })
    .await
    .unwrap();
}

/// Metadata leases (issue 33, docs/format.md §31): while the MDS leases B's lookups and attributes to it, B's
/// kernel answers stats itself (no FUSE request); a change through A is recalled from B's kernel before A's call
/// returns, so B's next stat sees it at once, with no timeout to run out.
#[tokio::test(flavor = "multi_thread")]
async fn leased_metadata_is_served_by_the_kernel_until_a_change_elsewhere_recalls_it() {
    use common::scrape::{parse, scrape, sum};
    let cl = start("fuse-leases", 1).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let a = Mount::start(&cl, &test_dir("fuse-leases-a"), &[]);
    // Timeouts of 0: only what is leased is cached.
    let b = Mount::start(
        &cl,
        &test_dir("fuse-leases-b"),
        &["--metrics-listen", &addr, "--attr-timeout-ms", "0", "--entry-timeout-ms", "0"],
    );
    let gauge = |name: &'static str| {
        let addr = addr.clone();
        async move { sum(&parse(&scrape(&addr).await.unwrap()), name, &[]) }
    };
    common::members::wait_for("B's lease channel", || async { gauge("weft_fuse_lease_epoch_live").await == 1.0 }).await;
    let asked = || async {
        let s = parse(&scrape(&addr).await.unwrap());
        ["lookup", "getattr"]
            .iter()
            .map(|op| sum(&s, "weft_fuse_requests_total", &[&format!("op=\"{op}\"")]))
            .sum::<f64>()
    };
    let (pa, pb) = (a.dir.clone(), b.dir.clone());
    let stat_all = move |root: &Path| {
        (0..8).map(|i| std::fs::metadata(root.join(format!("d/f{i}"))).unwrap().len()).collect::<Vec<_>>()
    };
    let (pa2, pb2) = (pa.clone(), pb.clone());
    tokio::task::spawn_blocking(move || {
        std::fs::create_dir(pa2.join("d")).unwrap();
        for i in 0..8 {
            std::fs::write(pa2.join(format!("d/f{i}")), vec![i as u8; 100 + i]).unwrap();
        }
        assert_eq!(stat_all(&pb2), (0..8).map(|i| 100 + i as u64).collect::<Vec<_>>(), "B sees A's files");
    })
    .await
    .unwrap();
    let before = asked().await;
    let pb2 = pb.clone();
    tokio::task::spawn_blocking(move || {
        for _ in 0..3 {
            stat_all(&pb2);
        }
    })
    .await
    .unwrap();
    assert_eq!(asked().await, before, "leased: B's kernel answered 24 stats without a FUSE lookup or getattr");
    tokio::task::spawn_blocking(move || {
        let (a, b) = (|r: &str| pa.join(r), |r: &str| pb.join(r));
        std::fs::set_permissions(a("d/f0"), std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(std::fs::metadata(b("d/f0")).unwrap().mode() & 0o7777, 0o600, "a chmod in A, seen in B");
        std::fs::OpenOptions::new().append(true).open(a("d/f1")).unwrap().write_all(&[9; 50]).unwrap();
        assert_eq!(std::fs::metadata(b("d/f1")).unwrap().len(), 151, "an append closed in A");
        std::fs::rename(a("d/f2"), a("d/g2")).unwrap();
        assert_eq!(errno(std::fs::metadata(b("d/f2"))), libc::ENOENT, "renamed away in A");
        assert_eq!(std::fs::metadata(b("d/g2")).unwrap().len(), 102);
        std::fs::remove_file(a("d/f3")).unwrap();
        assert_eq!(errno(std::fs::metadata(b("d/f3"))), libc::ENOENT, "unlinked in A");
        let nlink = std::fs::metadata(b("d")).unwrap().nlink();
        std::fs::create_dir(a("d/sub")).unwrap();
        assert_eq!(std::fs::metadata(b("d")).unwrap().nlink(), nlink + 1, "the directory's link count after a mkdir");
        std::fs::remove_dir(a("d/sub")).unwrap();
        assert_eq!(std::fs::metadata(b("d")).unwrap().nlink(), nlink, "and after the rmdir");
        std::fs::hard_link(a("d/f4"), a("d/h4")).unwrap();
        assert_eq!(std::fs::metadata(b("d/f4")).unwrap().nlink(), 2, "a link in A");
        assert_eq!(utimensat(&a("d/f5"), ts(1_000_000, 0), ts(2_000_000, 5)), 0);
        assert_eq!(std::fs::metadata(b("d/f5")).unwrap().mtime(), 2_000_000, "a utimes in A");
        // A rename over an existing name: B's entry names the new inode.
        std::fs::rename(a("d/f6"), a("d/f7")).unwrap();
        assert_eq!(std::fs::metadata(b("d/f7")).unwrap().len(), 106, "f7 is f6 now");
        assert_eq!(errno(std::fs::metadata(b("d/f6"))), libc::ENOENT);
    })
    .await
    .unwrap();
    assert!(gauge("weft_fuse_lease_recalls").await >= 10.0, "every change was recalled from B");
    assert!(gauge("weft_fuse_leased_items").await > 0.0);
}

/// Two mounts creating files in one directory at once, each holding a lease on it. A create recalls only the
/// directory's attributes from the other mount, never the new name (no one caches a missing name), and an
/// attribute recall takes no directory lock in the other's kernel, where that mount's own create may hold it while
/// it waits for this one: so no create waits out a lease and no holder is revoked.
#[tokio::test(flavor = "multi_thread")]
async fn creates_in_one_directory_from_two_mounts_revoke_no_lease() {
    use common::scrape::{parse, scrape, sum};
    let cl = start_with("fuse-leases-two", 1, |o| o.metrics = true).await;
    let meta = cl.metrics_addrs().into_iter().find(|(role, _)| role == "meta").unwrap().1;
    let gauge = |name: &'static str| {
        let meta = meta.clone();
        async move { sum(&parse(&scrape(&meta).await.unwrap()), name, &[]) }
    };
    let a = Mount::start(&cl, &test_dir("fuse-leases-two-a"), &[]);
    let b = Mount::start(&cl, &test_dir("fuse-leases-two-b"), &[]);
    common::members::wait_for("both lease channels", || async { gauge("weft_mds_lease_holders").await == 2.0 }).await;
    std::fs::create_dir(a.path("d")).unwrap();
    const FILES: usize = 300;
    let create = |root: std::path::PathBuf, tag: &'static str| {
        std::thread::spawn(move || {
            for i in 0..FILES {
                std::fs::write(root.join(format!("d/{tag}{i}")), tag).unwrap();
                // A stat of the directory takes its lease again after each recall.
                std::fs::metadata(root.join("d")).unwrap();
            }
        })
    };
    let (ta, tb) = (create(a.dir.clone(), "a"), create(b.dir.clone(), "b"));
    ta.join().unwrap();
    tb.join().unwrap();
    for m in [&a, &b] {
        assert_eq!(std::fs::read_dir(m.path("d")).unwrap().count(), 2 * FILES, "every create, seen in each mount");
    }
    assert!(gauge("weft_mds_lease_recalls").await > 0.0, "the mounts recalled the directory from each other");
    assert_eq!(gauge("weft_mds_lease_revocations").await, 0.0, "no create waited out a lease");
}

/// A lease outlives the service that granted it by at most its lease (docs/format.md §31): the MDS is killed and
/// restarted, a chmod through the native client reaches the new service (which knows nothing of the mount's
/// leases and recalls nothing), and the mount sees it once its lease channel has failed or its trust ran out and it
/// dropped what it held. Its kernel timeout for leased items is ten minutes here, so only that drop can show the
/// chmod within the wait. Then the mount holds leases from the new service.
#[tokio::test(flavor = "multi_thread")]
async fn an_mds_restart_ends_the_leases_it_granted() {
    use common::scrape::{parse, scrape, sum};
    use std::os::unix::fs::PermissionsExt;
    let mut cl = start_with("fuse-leases-restart", 1, |o| o.postgres = false).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let extra = ["--metrics-listen", &addr, "--attr-timeout-ms", "0", "--entry-timeout-ms", "0"];
    let m = Mount::start(
        &cl,
        &test_dir("fuse-leases-restart-mnt"),
        &[&extra[..], &["--lease-timeout-ms", "600000"]].concat(),
    );
    let live = || {
        let addr = addr.clone();
        async move { sum(&parse(&scrape(&addr).await.unwrap()), "weft_fuse_lease_epoch_live", &[]) == 1.0 }
    };
    common::members::wait_for("the mount's lease channel", live).await;
    let c = cl.client().await;
    let f = c.create(1, "f", 0o644, true).await.unwrap();
    let path = m.path("f");
    let mode = move || std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
    assert_eq!(tokio::task::spawn_blocking(mode.clone()).await.unwrap(), 0o644, "leased in the mount");
    drop(c);
    cl.kill_mds().await;
    cl.restart_mds().await.unwrap();
    let c = cl.client().await;
    c.setattr(f.ino, weft_proto::SetAttrs { mode: Some(0o600), ..Default::default() }).await.unwrap();
    common::members::wait_for("the chmod through the mount", || {
        let mode = mode.clone();
        async move { tokio::task::spawn_blocking(mode).await.unwrap() == 0o600 }
    })
    .await;
    common::members::wait_for("leases from the new service", live).await;
    drop(m);
}
