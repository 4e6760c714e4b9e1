//! The `weft` command against a real cluster, as a user would type it.

mod common;

use common::*;

#[tokio::test]
async fn the_weft_command_end_to_end() {
    let cl = start("cli", 2).await;
    let dir = test_dir("cli-local");
    let local = dir.join("in.bin");
    let data = pattern(77, 0, 3_000_000);
    std::fs::write(&local, &data).unwrap();
    let local_s = local.to_str().unwrap();

    let ok = |args: &[&str]| {
        let (ok, out, err) = weft(&cl, args);
        assert!(ok, "weft {args:?} failed: {err}");
        out
    };
    ok(&["mkdir", "-p", "/a/b/c"]);
    ok(&["mkdir", "-p", "/a/b/c"]);
    ok(&["setstripe", "--unit", "64K", "--count", "2", "/a/b"]);
    ok(&["put", local_s, "/a/b/file"]);
    let stat = ok(&["stat", "/a/b/file"]);
    assert!(stat.contains("size: 3000000"), "{stat}");
    assert!(stat.contains("stripe unit 65536 bytes, stripe count 2"), "{stat}");
    let ls = ok(&["ls", "-l", "/a/b"]);
    assert!(ls.contains("file") && ls.contains(" c\n") || ls.contains(" c"), "{ls}");

    let out = dir.join("out.bin");
    ok(&["get", "/a/b/file", out.to_str().unwrap()]);
    assert_eq!(std::fs::read(&out).unwrap(), data);
    let cat = std::process::Command::new(WEFT)
        .args(["cat", "/a/b/file"])
        .env("WEFT_CLUSTER", cl.cluster_file())
        .output()
        .unwrap();
    assert!(cat.status.success());
    assert_eq!(cat.stdout, data);

    ok(&["mv", "/a/b/file", "/a/moved"]);
    ok(&["ln", "-s", "/a/moved", "/a/sym"]);
    assert!(ok(&["stat", "/a/sym"]).contains("target: /a/moved"));
    ok(&["ln", "/a/moved", "/a/hard"]);
    assert!(ok(&["stat", "/a/hard"]).contains("links: 2"));
    ok(&["truncate", "--size", "1K", "/a/hard"]);
    assert!(ok(&["stat", "/a/moved"]).contains("size: 1024"));

    let status = ok(&["status"]);
    assert_eq!(status.lines().filter(|l| l.contains("127.0.0.1:") && l.contains(" up ")).count(), 2, "{status}");
    assert!(status.contains("2 of 2 data servers up"), "{status}");

    // Errors: clear messages and a failing exit status.
    let (ok_, _, err) = weft(&cl, &["get", "/no/such", out.to_str().unwrap()]);
    assert!(!ok_);
    assert!(err.contains("NotFound"), "{err}");
    let (ok_, _, err) = weft(&cl, &["rmdir", "/a"]);
    assert!(!ok_ && err.contains("NotEmpty"), "{err}");
    let (ok_, _, err) = weft(&cl, &["rm", "/a"]);
    assert!(!ok_ && err.contains("is a directory"), "{err}");
    ok(&["rm", "-r", "/a"]);
    assert_eq!(ok(&["ls", "/"]).trim(), "");
    // No cluster at all: a clear error, not a panic.
    let out = std::process::Command::new(WEFT).args(["ls", "/", "--cluster", "127.0.0.1:1"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("connecting to the metadata service"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn help_explains_the_commands() {
    let out = std::process::Command::new(WEFT).arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for cmd in ["up", "meta", "data", "put", "get", "setstripe", "status", "bench"] {
        assert!(text.contains(cmd), "--help lacks {cmd}: {text}");
    }
}
