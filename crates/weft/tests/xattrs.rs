//! Extended attributes and POSIX ACLs against a real cluster: through the client library and the CLI (limits,
//! flags, errors, an ACL honoured by the MDS for another user), and through a real kernel mount with the real
//! tools (`setfattr`/`getfattr` of package attr, `setfacl`/`getfacl` of package acl, `cp -a`), as other users
//! (`setpriv`).

use crate::common;

use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Command, Stdio};

use common::mount::Mount;
use common::*;
use weft_client::{ClientError, OpenMode};
use weft_proto::msg::{XATTR_CREATE, XATTR_REPLACE};
use weft_proto::{ErrorCode, ROOT_INO, UserCred};

const ALICE: u32 = 1000;
const BOB: u32 = 1001;
const USERS: u32 = 100;

fn code<T>(r: Result<T, ClientError>) -> ErrorCode {
    match r {
        Ok(_) => panic!("expected an error, got a success"),
        Err(e) => e.code().unwrap_or_else(|| panic!("an error without a code: {e}")),
    }
}

const UNDEF: u32 = u32::MAX;

#[tokio::test(flavor = "multi_thread")]
async fn attributes_and_acls_through_the_library_and_the_cli() {
    let cl = start("xattr-lib", 1).await;
    let root = cl.client().await;
    let shared = root.mkdir(ROOT_INO, "shared", 0o777).await.unwrap().ino;
    let alice = root.with_user(UserCred::new(ALICE, USERS, vec![]).unwrap());
    let bob = root.with_user(UserCred::new(BOB, 7, vec![]).unwrap());
    let f = alice.create(shared, "f", 0o600, true).await.unwrap().ino;

    alice.setxattr(f, "user.colour", b"blue", XATTR_CREATE).await.unwrap();
    assert_eq!(code(alice.setxattr(f, "user.colour", b"red", XATTR_CREATE).await), ErrorCode::Exists);
    assert_eq!(code(alice.setxattr(f, "user.size", b"1", XATTR_REPLACE).await), ErrorCode::NoData);
    assert_eq!(alice.getxattr(f, "user.colour").await.unwrap(), b"blue");
    assert_eq!(code(alice.getxattr(f, "user.none").await), ErrorCode::NoData);
    assert_eq!(code(alice.setxattr(f, "user.big", &vec![0; (64 << 10) + 1], 0).await), ErrorCode::TooBig);
    assert_eq!(code(alice.setxattr(f, "weird.x", b"", 0).await), ErrorCode::NotSupported);
    assert_eq!(code(alice.setxattr(f, "trusted.x", b"", 0).await), ErrorCode::NotPermitted);
    root.setxattr(f, "trusted.x", b"t", 0).await.unwrap();
    assert_eq!(alice.listxattr(f).await.unwrap(), ["user.colour"], "trusted.* is root's to see");
    assert_eq!(root.listxattr(f).await.unwrap(), ["trusted.x", "user.colour"]);
    assert_eq!(code(bob.getxattr(f, "user.colour").await), ErrorCode::Permission, "mode 0600");

    // An access ACL naming bob: the MDS lets him read (attributes and data), and still not write.
    let acl = acl_value(&[(0x01, 6, UNDEF), (0x02, 4, BOB), (0x04, 0, UNDEF), (0x10, 4, UNDEF), (0x20, 0, UNDEF)]);
    assert_eq!(code(bob.setxattr(f, "system.posix_acl_access", &acl, 0).await), ErrorCode::NotPermitted);
    alice.setxattr(f, "system.posix_acl_access", &acl, 0).await.unwrap();
    assert_eq!(root.getattr(f).await.unwrap().mode & 0o777, 0o640, "group bits from the mask");
    assert_eq!(bob.getxattr(f, "user.colour").await.unwrap(), b"blue");
    assert!(bob.open("/shared/f", OpenMode::Read).await.is_ok());
    assert_eq!(code(bob.open("/shared/f", OpenMode::Write).await), ErrorCode::Permission);
    let carol = root.with_user(UserCred::new(1002, 8, vec![]).unwrap());
    assert_eq!(code(carol.open("/shared/f", OpenMode::Read).await), ErrorCode::Permission);
    let mut bad = acl.clone();
    bad.truncate(bad.len() - 8);
    assert_eq!(code(alice.setxattr(f, "system.posix_acl_access", &bad, 0).await), ErrorCode::Invalid);

    // The CLI, as root over the cluster key.
    let ok = |args: &[&str]| {
        let (ok, out, err) = weft(&cl, args);
        assert!(ok, "weft {args:?}: {err}");
        out
    };
    ok(&["xattr", "set", "/shared/f", "user.note", "hello", "--create"]);
    assert_eq!(ok(&["xattr", "get", "/shared/f", "user.note"]), "hello");
    assert_eq!(ok(&["xattr", "list", "/shared/f"]), "system.posix_acl_access\ntrusted.x\nuser.colour\nuser.note\n");
    let (ok_, _, err) = weft(&cl, &["xattr", "set", "/shared/f", "user.note", "again", "--create"]);
    assert!(!ok_ && err.contains("Exists"), "{err}");
    ok(&["xattr", "rm", "/shared/f", "user.note"]);
    let (ok_, _, err) = weft(&cl, &["xattr", "get", "/shared/f", "user.note"]);
    assert!(!ok_ && err.contains("NoData"), "{err}");

    // Removing the file removes its attributes: a new file never sees them.
    alice.unlink(shared, "f").await.unwrap();
    let g = alice.create(shared, "f", 0o600, true).await.unwrap().ino;
    assert!(alice.listxattr(g).await.unwrap().is_empty());
    assert_eq!(code(root.getxattr(f, "user.colour").await), ErrorCode::NotFound);
}

/// Runs `sh -c cmd` as uid/gid `id` with no supplementary groups; true if it succeeded.
fn as_user(id: u32, cmd: &str) -> bool {
    Command::new("setpriv")
        .args([&format!("--reuid={id}"), &format!("--regid={id}"), "--clear-groups", "sh", "-c", cmd])
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

/// Runs `sh -c cmd` as root, asserting success; returns its stdout.
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

/// getxattr(2) into a buffer of `size` bytes: the length, or the errno.
fn getxattr(path: &Path, name: &str, size: usize) -> Result<usize, i32> {
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; size];
    // SAFETY: both strings are NUL-terminated and live across the call; `buf` has `size` writable bytes.
    #[allow(unsafe_code)]
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), size) };
    if r < 0 { Err(std::io::Error::last_os_error().raw_os_error().unwrap()) } else { Ok(r as usize) }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_mount_serves_attributes_and_enforces_acls_with_the_real_tools() {
    let cl = start("xattr-fuse", 1).await;
    let m = Mount::start(&cl, &test_dir("xattr-fuse-mnt"), &["--allow-other", "--attr-timeout-ms", "0"]);
    tokio::task::spawn_blocking(move || {
        let mnt = m.dir.display().to_string();
        std::fs::set_permissions(&m.dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();

        // User attributes with setfattr/getfattr; the size probe and ERANGE of getxattr(2).
        sh(&format!("echo data > {mnt}/f && setfattr -n user.colour -v blue {mnt}/f"));
        assert_eq!(sh(&format!("getfattr --only-values -n user.colour {mnt}/f")), "blue");
        assert_eq!(getxattr(&m.path("f"), "user.colour", 0), Ok(4), "a size-0 call asks for the length");
        assert_eq!(getxattr(&m.path("f"), "user.colour", 2), Err(libc::ERANGE));
        assert_eq!(getxattr(&m.path("f"), "user.none", 16), Err(libc::ENODATA));
        // cp -a keeps it.
        sh(&format!("cp -a {mnt}/f {mnt}/copy"));
        assert_eq!(sh(&format!("getfattr --only-values -n user.colour {mnt}/copy")), "blue");
        sh(&format!("setfattr -x user.colour {mnt}/copy"));
        assert!(!sh(&format!("getfattr -d {mnt}/copy")).contains("colour"));

        // An access ACL: nobody may read a root file of mode 0600; another user still may not.
        sh(&format!("echo secret > {mnt}/s && chmod 600 {mnt}/s"));
        assert!(!as_user(65534, &format!("cat {mnt}/s")), "mode 0600 refuses nobody");
        sh(&format!("setfacl -m u:nobody:r {mnt}/s"));
        let acl = sh(&format!("getfacl -n {mnt}/s"));
        assert!(acl.contains("user:65534:r--") && acl.contains("mask::r--"), "{acl}");
        assert!(as_user(65534, &format!("cat {mnt}/s")), "the ACL lets nobody read");
        assert!(!as_user(65534, &format!("echo x >> {mnt}/s")), "but not write");
        assert!(!as_user(1000, &format!("cat {mnt}/s")), "another user is still refused");
        assert_eq!(
            std::fs::metadata(m.path("s"))
                .map(|md| std::os::unix::fs::PermissionsExt::mode(&md.permissions()) & 0o777)
                .unwrap(),
            0o640
        );
        // chmod rewrites the mask: nobody loses the read.
        sh(&format!("chmod 600 {mnt}/s"));
        assert!(sh(&format!("getfacl -n {mnt}/s")).contains("mask::---"));
        assert!(!as_user(65534, &format!("cat {mnt}/s")), "masked out by chmod");

        // A default ACL on a directory is inherited by a new file (instead of the umask) and by a subdirectory.
        sh(&format!("mkdir {mnt}/d && chmod 755 {mnt}/d && setfacl -d -m u:nobody:rw {mnt}/d"));
        sh(&format!("umask 022 && touch {mnt}/d/new && mkdir {mnt}/d/sub"));
        let inherited = sh(&format!("getfacl -n {mnt}/d/new"));
        assert!(inherited.contains("user:65534:rw-") && inherited.contains("mask::rw-"), "{inherited}");
        assert!(as_user(65534, &format!("echo hi >> {mnt}/d/new")), "the inherited entry grants nobody rw");
        assert!(!as_user(1000, &format!("echo hi >> {mnt}/d/new")), "others get other::r-- only");
        let sub = sh(&format!("getfacl -n {mnt}/d/sub"));
        assert!(sub.contains("default:user:65534:rw-"), "a subdirectory inherits the default ACL: {sub}");
        // Without a default ACL the umask applies as before.
        sh(&format!("umask 027 && touch {mnt}/plain"));
        assert_eq!(
            std::fs::metadata(m.path("plain"))
                .map(|md| std::os::unix::fs::PermissionsExt::mode(&md.permissions()) & 0o777)
                .unwrap(),
            0o640
        );
    })
    .await
    .unwrap();
}

/// The mount negotiates `FUSE_HANDLE_KILLPRIV_V2`, so the MDS, not the kernel, drops privileges when a file
/// changes: a write (at its commit), a truncate and a chown remove `security.capability`, a non-root write drops
/// set-user-ID; and the kernel no longer asks for `security.capability` before every write request.
#[tokio::test(flavor = "multi_thread")]
async fn changes_drop_file_capabilities_without_a_getxattr_per_write() {
    let cl = start("xattr-killpriv", 1).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let m = Mount::start(
        &cl,
        &test_dir("xattr-killpriv-mnt"),
        &["--allow-other", "--attr-timeout-ms", "0", "--metrics-listen", &addr],
    );
    // A version-2 capability value granting cap_net_bind_service (what `setcap` writes).
    const CAP: &str = "0x0100000200040000000000000000000000000000";
    let mnt = m.dir.display().to_string();
    let has_cap = |p: &str| getxattr(Path::new(p), "security.capability", 64).is_ok();
    {
        let mnt = mnt.clone();
        tokio::task::spawn_blocking(move || {
            std::fs::set_permissions(Path::new(&mnt), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
            for f in ["w", "t", "o"] {
                sh(&format!("echo v1 > {mnt}/{f} && setfattr -n security.capability -v {CAP} {mnt}/{f}"));
                assert!(has_cap(&format!("{mnt}/{f}")), "{f} holds the capability");
            }
            sh(&format!("echo more >> {mnt}/w"));
            assert!(!has_cap(&format!("{mnt}/w")), "a write drops the capability");
            sh(&format!("truncate -s 1 {mnt}/t"));
            assert!(!has_cap(&format!("{mnt}/t")), "a truncate drops the capability");
            sh(&format!("chown 1000 {mnt}/o"));
            assert!(!has_cap(&format!("{mnt}/o")), "a chown drops the capability");
            // A set-user-ID file another user may write: that user's write clears the bit.
            sh(&format!("echo x > {mnt}/s && chmod 4777 {mnt}/s"));
            assert!(as_user(ALICE, &format!("echo y >> {mnt}/s")));
            let mode = std::fs::metadata(format!("{mnt}/s")).unwrap();
            assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o7777, 0o777);
        })
        .await
        .unwrap();
    }
    let before = common::scrape::parse(&common::scrape::scrape(&addr).await.unwrap());
    let big = m.path("big");
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut f = std::fs::File::create(&big).unwrap();
        for _ in 0..64 {
            f.write_all(&[7u8; 65536]).unwrap();
        }
    })
    .await
    .unwrap();
    let after = common::scrape::parse(&common::scrape::scrape(&addr).await.unwrap());
    let grew = |op: &str| {
        let l = format!("op=\"{op}\"");
        common::scrape::sum(&after, "weft_fuse_requests_total", &[&l])
            - common::scrape::sum(&before, "weft_fuse_requests_total", &[&l])
    };
    assert!(grew("write") >= 64.0, "64 write requests at least");
    assert!(grew("getxattr") <= 2.0, "no getxattr per write: {} for {} writes", grew("getxattr"), grew("write"));
    drop(m);
}
