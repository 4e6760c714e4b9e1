//! The `weft` command against a real cluster, as a user would type it.

use crate::common;

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
    // `weft up --mount` takes `weft mount`'s options (one flattened clap struct).
    let out = std::process::Command::new(WEFT).args(["up", "--help"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in ["--allow-other", "--ro", "--suid", "--dev", "--attr-timeout-ms", "--writeback-cache"] {
        assert!(text.contains(flag), "weft up --help lacks {flag}: {text}");
    }
}

/// Bytes of the file system holding `p` (statvfs f_blocks × f_frsize, as a data server reports it).
fn disk_bytes(p: &std::path::Path) -> u64 {
    let out = std::process::Command::new("stat").args(["-f", "-c", "%S %b"]).arg(p).output().unwrap();
    assert!(out.status.success());
    let s = String::from_utf8(out.stdout).unwrap();
    let v: Vec<u64> = s.split_whitespace().map(|x| x.parse().unwrap()).collect();
    v[0] * v[1]
}

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

#[tokio::test]
async fn status_and_df_count_servers_on_one_disk_once() {
    let cl = start("cli-space", 4).await;
    let ok = |args: &[&str]| {
        let (ok, out, err) = weft(&cl, args);
        assert!(ok, "weft {args:?} failed: {err}");
        out
    };
    // Every data server of a local cluster stores under the test directory: one file system.
    let disk = disk_bytes(&std::env::temp_dir());
    assert!(disk > 0);

    let df = json(&ok(&["df", "--json"]));
    assert_eq!(df["size_bytes"], disk, "one disk's size, not four: {df}");
    let (used, avail) = (df["used_bytes"].as_u64().unwrap(), df["avail_bytes"].as_u64().unwrap());
    assert_eq!(used + avail, disk, "{df}");
    assert!(df["use_percent"].as_u64().unwrap() <= 100);
    assert_eq!((df["servers_up"].as_u64(), df["servers_total"].as_u64()), (Some(4), Some(4)));
    let text = ok(&["df"]);
    assert!(text.lines().nth(1).is_some_and(|l| l.starts_with("weft") && l.ends_with("4/4")), "{text}");

    let st = json(&ok(&["status", "--json"]));
    let servers = st["servers"].as_array().unwrap();
    assert_eq!(servers.len(), 4, "{st}");
    for s in servers {
        assert_eq!(s["state"], "up");
        assert_eq!(s["size_bytes"], disk, "{s}");
        assert_eq!(s["device"], 1, "{s}");
        assert_eq!(s["device_known"], true);
        assert_eq!(s["shares_device_with"].as_array().unwrap().len(), 3, "{s}");
        let (size, used, free) =
            (s["size_bytes"].as_u64().unwrap(), s["used_bytes"].as_u64().unwrap(), s["free_bytes"].as_u64().unwrap());
        assert_eq!(used + free, size);
    }
    assert_eq!(st["devices"].as_array().unwrap().len(), 1, "{st}");
    assert_eq!(st["devices"][0]["servers"], serde_json::json!([0, 1, 2, 3]));
    assert_eq!(st["total"]["size_bytes"], disk);
    assert_eq!(st["usable_bytes"]["striping"], st["total"]["free_bytes"], "striping stores every byte once");
    assert_eq!(st["metadata"]["files"], 1, "the root");

    let text = ok(&["status"]);
    assert_eq!(text.lines().filter(|l| l.contains("127.0.0.1:") && l.contains(" up ")).count(), 4, "{text}");
    assert!(text.contains("servers 0, 1, 2, 3 share one file system, counted once"), "{text}");
    assert!(text.contains("in 1 file system(s)") && text.contains("4 of 4 data servers up"), "{text}");
    assert!(text.contains("usable for new data with striping:"), "{text}");
}

#[tokio::test]
async fn chmod_chown_stat_ls_du_and_json() {
    let cl = start("cli-attrs", 2).await;
    let dir = test_dir("cli-attrs-local");
    let ok = |args: &[&str]| {
        let (ok, out, err) = weft(&cl, args);
        assert!(ok, "weft {args:?} failed: {err}");
        out
    };
    let put = |len: usize, remote: &str| {
        let local = dir.join("f");
        std::fs::write(&local, vec![7u8; len]).unwrap();
        ok(&["put", local.to_str().unwrap(), remote]);
    };
    let stat = |path: &str| json(&ok(&["stat", "--json", path]));
    ok(&["mkdir", "-p", "/t/d/e"]);
    put(1000, "/t/a");
    put(2000, "/t/d/b");
    put(3000, "/t/d/e/c");
    ok(&["ln", "/t/a", "/t/d/hard"]);
    ok(&["ln", "-s", "/t/a", "/t/sym"]);

    // chmod: octal, symbolic, recursive.
    ok(&["chmod", "640", "/t/a"]);
    assert_eq!(stat("/t/a")["mode"], 0o640);
    ok(&["chmod", "u+x,go-w", "/t/d/b"]);
    assert_eq!(stat("/t/d/b")["mode_octal"], "0744", "0644 → u+x,go-w");
    ok(&["chmod", "-R", "go=", "/t/d"]);
    for p in ["/t/d", "/t/d/e", "/t/d/b", "/t/d/e/c"] {
        assert_eq!(stat(p)["mode"].as_u64().unwrap() & 0o077, 0, "{p}");
    }
    ok(&["chmod", "-R", "a+rX", "/t/d"]);
    assert_eq!(stat("/t/d/e")["mode_octal"], "0755");
    assert_eq!(stat("/t/d/e/c")["mode_octal"], "0644", "X: no execute for a plain file");
    let (good, _, err) = weft(&cl, &["chmod", "u+z", "/t/a"]);
    assert!(!good && err.contains("invalid mode"), "{err}");

    // chown: names through the user database, numbers, USER: and :GROUP, recursive.
    ok(&["chown", "1234:5678", "/t/a"]);
    assert_eq!((stat("/t/a")["uid"].as_u64(), stat("/t/a")["gid"].as_u64()), (Some(1234), Some(5678)));
    ok(&["chown", "root:", "/t/a"]);
    assert_eq!((stat("/t/a")["uid"].as_u64(), stat("/t/a")["gid"].as_u64()), (Some(0), Some(0)));
    ok(&["chown", "-R", "4321:4321", "/t/d"]);
    for p in ["/t/d", "/t/d/e", "/t/d/b", "/t/d/e/c"] {
        assert_eq!(stat(p)["uid"], 4321, "{p}");
    }
    ok(&["chown", ":root", "/t/d/b"]);
    assert_eq!((stat("/t/d/b")["uid"].as_u64(), stat("/t/d/b")["gid"].as_u64()), (Some(4321), Some(0)));
    let (good, _, err) = weft(&cl, &["chown", "no-such-user-weft", "/t/a"]);
    assert!(!good && err.contains("no user named"), "{err}");

    // stat: ISO 8601 with nanoseconds and zone; --raw gives nanoseconds; --json both.
    let text = ok(&["stat", "/t/a"]);
    let mtime = text.lines().find_map(|l| l.trim().strip_prefix("mtime: ")).unwrap().to_string();
    let b = mtime.as_bytes();
    assert!(mtime.len() == 30 && b[4] == b'-' && b[10] == b'T' && b[19] == b'.' && mtime.ends_with('Z'), "{mtime}");
    let j = stat("/t/a");
    assert_eq!(j["mtime"], mtime);
    let ns = j["mtime_ns"].as_i64().unwrap();
    assert_eq!(&mtime[20..29], format!("{:09}", ns % 1_000_000_000), "the fraction is the nanoseconds");
    assert!(ok(&["stat", "--raw", "/t/a"]).contains(&format!("mtime: {ns} ns")));
    assert_eq!(
        (j["size_bytes"].as_u64(), j["nlink"].as_u64(), j["kind"].as_str()),
        (Some(1000), Some(2), Some("file"))
    );
    assert_eq!(j["layout"]["stripe_count"], 2);
    assert_eq!(stat("/t/sym")["target"], "/t/a");

    // ls --json: every entry with its attributes; -a adds . and .. (the parent's inode).
    let ls = json(&ok(&["ls", "--json", "-a", "/t/d"]));
    let names: Vec<&str> = ls.as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names, [".", "..", "b", "e", "hard"]);
    assert_eq!(ls[0]["ino"], stat("/t/d")["ino"]);
    assert_eq!(ls[1]["ino"], stat("/t")["ino"]);
    assert_eq!((ls[2]["size_bytes"].as_u64(), ls[3]["kind"].as_str()), (Some(2000), Some("dir")));
    assert!(ls[2]["mtime_ns"].as_i64().unwrap() > 0);

    // du: the tree's file sizes (the symlink's is its target's length, 4), the hard link once; deepest first.
    let du = ok(&["du", "/t"]);
    assert_eq!(du, "3000\t/t/d/e\n5000\t/t/d\n6004\t/t\n", "{du}");
    assert_eq!(ok(&["du", "-s", "-h", "/t"]), "5.9K\t/t\n");
    assert_eq!(json(&ok(&["du", "-s", "--json", "/t"])), serde_json::json!([{"path": "/t", "size_bytes": 6004}]));
    assert!(ok(&["du", "--help"]).contains("human"));

    // key list --json.
    let keyring = dir.join("clients.keyring");
    let k = |args: &[&str]| {
        let out = std::process::Command::new(WEFT).args(args).arg("--keyring").arg(&keyring).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    k(&["key", "add", "alice", "--uid", "1000", "--gid", "1000", "--out", dir.join("alice.key").to_str().unwrap()]);
    let list = json(&k(&["key", "list", "--json"]));
    assert_eq!(list, serde_json::json!([{"name": "alice", "policy": "uid=1000,gid=1000"}]));
    let _ = std::fs::remove_dir_all(&dir);
}
