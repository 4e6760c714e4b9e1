//! Every `weft-bench` workload (`weft bench` runs it) runs end to end at tiny sizes and writes JSON in the shared contract (see
//! docs/bench.md): "machine", "command", "config", "ceilings", and a non-empty "results" whose every entry names
//! its "op", its "runs" and a finite, positive headline figure. No timing is asserted: the figures of a shared,
//! noisy machine are not the test's business, only that they are there and well formed.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BENCH: &str = env!("CARGO_BIN_EXE_weft-bench");
/// Far above what the tiny runs need; only a hang reaches it.
const TIMEOUT: Duration = Duration::from_secs(300);
const OPS: [&str; 12] = [
    "write",
    "rewrite",
    "read",
    "reread",
    "create",
    "stat",
    "readdir",
    "remove",
    "checkpoint",
    "degraded-read",
    "rebuild",
    "heal",
];

/// A fresh directory, removed when the test ends (pass or fail).
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("weft-bench-smoke-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `weft bench <args> --dir DIR --json DIR/<name>.json` and returns the parsed JSON.
fn bench(name: &str, args: &[&str]) -> Value {
    bench_env(name, args, &[])
}

/// [`bench`] with these environment variables set.
fn bench_env(name: &str, args: &[&str], env: &[(&str, &str)]) -> Value {
    let dir = TempDir::new(name);
    let json = dir.0.join(format!("{name}.json"));
    let mut child = Command::new(BENCH)
        .envs(env.iter().copied())
        .args(args)
        .arg("--dir")
        .arg(&dir.0)
        .arg("--json")
        .arg(&json)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running weft bench");
    // Drain both pipes while waiting, so a chatty run cannot block on a full pipe.
    let drain = |r: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut r) = r {
                let _ = r.read_to_string(&mut s);
            }
            s
        })
    };
    let out = drain(child.stdout.take().map(|r| Box::new(r) as _));
    let err = drain(child.stderr.take().map(|r| Box::new(r) as _));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("weft bench {args:?} did not finish within {TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let (stdout, stderr) = (out.join().unwrap(), err.join().unwrap());
    assert!(status.success(), "weft bench {args:?} failed: {status}\nstdout:\n{stdout}\nstderr:\n{stderr}");
    // The Markdown table went to stdout.
    assert!(stdout.contains("|---"), "no table on stdout:\n{stdout}");
    // The chart beside the JSON; the given --dir is left in place, the clusters in it are gone.
    let svg = std::fs::read_to_string(json.with_extension("svg")).expect("an SVG chart beside the JSON");
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{svg}");
    assert_leftovers_gone(&dir.0, &json);
    let text = std::fs::read_to_string(&json).expect("the JSON result file");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: not JSON ({e}):\n{text}", json.display()))
}

fn assert_leftovers_gone(dir: &Path, json: &Path) {
    let left: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p != json && *p != json.with_extension("svg"))
        .map(|p| p.display().to_string())
        .collect();
    assert!(left.is_empty(), "left behind in --dir: {left:?}");
}

fn positive(v: &Value, key: &str) -> f64 {
    let x = v[key].as_f64().unwrap_or_else(|| panic!("{key} is not a number in {v}"));
    assert!(x.is_finite() && x > 0.0, "{key} = {x} in {v}");
    x
}

/// The contract every bench document honours; `headline` is the figure each result must carry.
fn check_contract(doc: &Value, command: &str, headline: &str) {
    let machine = &doc["machine"];
    assert!(machine.is_object(), "machine: {doc}");
    assert!(machine["cores"].as_u64().unwrap_or(0) >= 1, "machine.cores: {machine}");
    assert!(machine["memory_gib"].is_number(), "machine.memory_gib: {machine}");
    assert!(machine["kernel"].is_string(), "machine.kernel: {machine}");
    assert!(machine.get("load_average").is_some(), "machine.load_average: {machine}");
    let cmd = doc["command"].as_str().unwrap_or_else(|| panic!("command: {doc}"));
    assert!(cmd.contains(&format!("bench {command}")), "command: {cmd}");
    assert!(doc["config"].is_object(), "config: {doc}");
    assert!(doc["ceilings"].is_object(), "ceilings: {doc}");
    let results = doc["results"].as_array().unwrap_or_else(|| panic!("results: {doc}"));
    assert!(!results.is_empty(), "no results: {doc}");
    for r in results {
        let op = r["op"].as_str().unwrap_or_else(|| panic!("op: {r}"));
        assert!(OPS.contains(&op), "op {op:?} is not one of {OPS:?}");
        assert!(r["runs"].as_u64().unwrap_or(0) >= 1, "runs: {r}");
        assert_eq!(r["system"], "weft", "{r}");
        assert!(r["servers"].as_u64().unwrap_or(0) >= 1, "servers: {r}");
        let h = positive(r, headline);
        // min and max are of the headline over the runs, so they bracket its median.
        let (lo, hi) = (positive(r, "min"), positive(r, "max"));
        assert!(lo <= h && h <= hi, "min {lo} ≤ {headline} {h} ≤ max {hi}: {r}");
    }
}

fn ops_of(doc: &Value) -> Vec<String> {
    doc["results"].as_array().unwrap().iter().map(|r| r["op"].as_str().unwrap().to_string()).collect()
}

#[test]
fn meta() {
    let doc = bench("meta", &["meta", "--servers", "1", "--threads", "2", "--files", "50", "--runs", "1"]);
    check_contract(&doc, "meta", "ops_per_s");
    check_loads(&doc);
    assert_eq!(ops_of(&doc), ["create", "stat", "readdir", "remove"]);
    for r in doc["results"].as_array().unwrap() {
        assert_eq!(r["clients"], 2, "{r}");
        positive(r, "client_cpu_us_per_op");
        if r["op"] != "readdir" {
            positive(r, "p50_us");
            assert!(positive(r, "p99_us") >= positive(r, "p50_us"), "{r}");
        }
    }
}

#[test]
fn meta_stat_storm() {
    let args = ["meta", "--stat-storm", "--servers", "1", "--threads", "2", "--files", "30", "--runs", "1"];
    let doc = bench("storm", &args);
    check_contract(&doc, "meta", "ops_per_s");
    let r = &doc["results"][0];
    assert_eq!((r["op"].as_str(), r["mode"].as_str()), (Some("stat"), Some("stat-storm")));
    positive(r, "slowest_client_ops_per_s");
    let per = r["per_client_ops_per_s"].as_array().expect("per-client rates");
    assert_eq!(per.len(), 2);
    assert!(per.iter().all(|x| x.as_f64().is_some_and(|x| x.is_finite() && x > 0.0)), "{r}");
}

#[test]
fn latency() {
    let args = ["latency", "--servers", "1", "--record", "1,4K", "--count", "16", "--runs", "1"];
    let doc = bench("latency", &args);
    check_contract(&doc, "latency", "p50_us");
    check_loads(&doc);
    assert_eq!(ops_of(&doc), ["write", "read", "write", "read"]);
    for r in doc["results"].as_array().unwrap() {
        positive(r, "mean_us");
        assert!(positive(r, "p99_us") >= positive(r, "p50_us"), "{r}");
        assert!([1, 4096].contains(&r["record_bytes"].as_u64().unwrap()), "{r}");
    }
}

/// Every result names the fabric the client actually used for its point: `--fabric tcp,shm` measures each record
/// size over both, and WEFT_FABRIC is the default of `--fabric`.
#[test]
fn latency_records_the_fabric_used() {
    let args = ["latency", "--servers", "1", "--record", "4K", "--count", "8", "--runs", "1"];
    let fabrics_of = |doc: &Value| -> Vec<String> {
        doc["results"].as_array().unwrap().iter().map(|r| r["fabric"].as_str().unwrap().to_string()).collect()
    };
    let doc = bench("latency-fabrics", &[&args[..], &["--fabric", "tcp,shm"]].concat());
    check_contract(&doc, "latency", "p50_us");
    assert_eq!(fabrics_of(&doc), ["tcp", "tcp", "shm", "shm"]);
    assert_eq!(ops_of(&doc), ["write", "read", "write", "read"]);
    let doc = bench_env("latency-env-shm", &args, &[("WEFT_FABRIC", "shm")]);
    assert_eq!(fabrics_of(&doc), ["shm", "shm"]);
    let doc = bench_env("latency-env-tcp", &args, &[("WEFT_FABRIC", "tcp")]);
    assert_eq!(fabrics_of(&doc), ["tcp", "tcp"]);
}

#[test]
fn zipf() {
    let args = ["zipf", "--servers", "1", "--size", "1M", "--record", "4K", "--ops", "200", "--runs", "1"];
    let doc = bench("zipf", &args);
    check_contract(&doc, "zipf", "ops_per_s");
    check_loads(&doc);
    assert_eq!(ops_of(&doc), ["read", "rewrite"]);
    for r in doc["results"].as_array().unwrap() {
        positive(r, "mib_per_s");
        positive(r, "p50_us");
        positive(r, "p99_us");
        assert_eq!(r["record_bytes"], 4096, "{r}");
    }
    // The two ops split the 200 operations of the mix.
    let ops: u64 = doc["results"].as_array().unwrap().iter().map(|r| r["ops"].as_u64().unwrap()).sum();
    assert_eq!(ops, 200);
}

#[test]
fn throughput() {
    let args = ["throughput", "--servers", "1", "--record", "64K", "--size", "1M", "--runs", "1", "--no-iperf"];
    let doc = bench("throughput", &args);
    check_contract(&doc, "throughput", "mib_per_s");
    check_loads(&doc);
    assert_eq!(ops_of(&doc), ["write", "read"]);
    positive(&doc["ceilings"], "memcpy_mib_per_s");
}

#[test]
fn mount() {
    // Only Weft here: the peers (passthrough_ll, GlusterFS) need packages `make bench-deps` installs.
    let args = [
        "mount",
        "--systems",
        "weft",
        "--servers",
        "1",
        "--size",
        "4M",
        "--random-size",
        "1M",
        "--random-seconds",
        "1",
        "--random-jobs",
        "1",
        "--files",
        "20",
        "--threads",
        "2",
        "--runs",
        "1",
    ];
    let doc = bench("mount", &args);
    let results = doc["results"].as_array().unwrap();
    assert_eq!(ops_of(&doc), ["write", "read", "read", "write", "create", "stat", "readdir"]);
    for (r, headline) in
        results.iter().zip(["mib_per_s", "mib_per_s", "ops_per_s", "ops_per_s", "ops_per_s", "ops_per_s", "ops_per_s"])
    {
        let op = r["op"].as_str().unwrap();
        assert!(OPS.contains(&op), "{r}");
        assert_eq!(r["system"], "weft", "{r}");
        positive(r, headline);
    }
    assert!(doc["machine"]["cores"].as_u64().unwrap_or(0) >= 1);
    assert!(doc["command"].as_str().unwrap().contains("bench mount"));
}

/// Every result of a multi-run workload carries the load average before and after each run.
fn check_loads(doc: &Value) {
    for r in doc["results"].as_array().unwrap() {
        for k in ["load_1min_before", "load_1min_after"] {
            let v = r[k].as_array().unwrap_or_else(|| panic!("{k}: {r}"));
            assert_eq!(v.len() as u64, r["runs"].as_u64().unwrap(), "{k}: {r}");
            assert!(v.iter().all(|x| x.as_f64().is_some_and(|x| x.is_finite() && x >= 0.0)), "{k}: {r}");
        }
    }
    let argv = doc["argv"].as_array().expect("argv");
    assert!(argv[0].as_str().is_some_and(|w| w.ends_with("weft-bench")), "argv: {argv:?}");
}

#[test]
fn checkpoint() {
    let args = [
        "checkpoint",
        "--servers",
        "2",
        "--procs",
        "2",
        "--size",
        "256K",
        "--record",
        "64K",
        "--stripes",
        "1,2,3",
        "--runs",
        "2",
    ];
    let doc = bench("checkpoint", &args);
    check_contract(&doc, "checkpoint", "mib_per_s");
    check_loads(&doc);
    let results = doc["results"].as_array().unwrap();
    // Stripe count 3 exceeds the 2 data servers: skipped. Two stripe counts × two modes remain.
    assert_eq!(results.len(), 4, "{results:?}");
    let modes: Vec<&str> = results.iter().map(|r| r["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["n-n", "n-1", "n-n", "n-1"]);
    for r in results {
        assert_eq!(r["op"], "checkpoint");
        assert_eq!(r["procs"], 2, "{r}");
        assert_eq!(r["size_bytes_per_proc"], 256 << 10, "{r}");
        let s = positive(r, "checkpoint_s");
        assert!(positive(r, "checkpoint_s_min") <= s && s <= positive(r, "checkpoint_s_max"), "{r}");
        positive(r, "client_cpu_s_per_gib");
        positive(r, "ops_per_s");
    }
}

#[test]
fn throughput_procs() {
    let args = [
        "throughput",
        "--servers",
        "1",
        "--record",
        "64K",
        "--size",
        "512K",
        "--runs",
        "2",
        "--no-iperf",
        "--procs",
        "2",
    ];
    let doc = bench("throughput-procs", &args);
    check_contract(&doc, "throughput", "mib_per_s");
    check_loads(&doc);
    assert_eq!(ops_of(&doc), ["write", "read"]);
    for r in doc["results"].as_array().unwrap() {
        assert_eq!((r["procs"].as_u64(), r["clients"].as_u64()), (Some(2), Some(2)), "{r}");
        positive(r, "client_cpu_s_per_gib");
    }
}

#[test]
fn meta_procs() {
    let doc = bench("meta-procs", &["meta", "--servers", "1", "--procs", "2", "--files", "40", "--runs", "2"]);
    check_contract(&doc, "meta", "ops_per_s");
    check_loads(&doc);
    assert_eq!(ops_of(&doc), ["create", "stat", "readdir", "remove"]);
    for r in doc["results"].as_array().unwrap() {
        assert_eq!(r["procs"], 2, "{r}");
        positive(r, "client_cpu_us_per_op");
    }
}

#[test]
fn compare_native_and_memcpy() {
    // The peers that need packages (fio, FUSE, GlusterFS, nfs-ganesha) are left to `make bench-compare`.
    let args = ["compare", "--systems", "weft-native,memcpy", "--servers", "1", "--size", "1M", "--files", "20"];
    let doc = bench("compare", &[&args[..], &["--threads", "2", "--runs", "1"]].concat());
    assert!(doc["command"].as_str().unwrap().contains("bench compare"));
    assert!(doc["machine"]["cores"].as_u64().unwrap_or(0) >= 1);
    assert!(doc["config"]["load_check"]["mismatch"].is_boolean(), "{doc}");
    let results = doc["results"].as_array().unwrap();
    let systems: Vec<&str> = results.iter().map(|r| r["system"].as_str().unwrap()).collect();
    assert_eq!(systems, ["weft-native", "weft-native", "weft-native", "weft-native", "memcpy"]);
    for r in results {
        assert!(OPS.contains(&r["op"].as_str().unwrap()), "{r}");
        let h = r.get("mib_per_s").or_else(|| r.get("ops_per_s")).and_then(Value::as_f64).unwrap();
        assert!(h.is_finite() && h > 0.0, "{r}");
    }
    let ratios = doc["ratios"].as_array().unwrap();
    assert!(!ratios.is_empty());
    for r in ratios {
        assert_eq!(r["peer"], "memcpy", "{r}");
        positive(r, "ratio");
    }
}

#[test]
fn report_of_a_directory() {
    let dir = TempDir::new("report");
    let json = dir.0.join("ckpt.json");
    let status = Command::new(BENCH)
        .args(["checkpoint", "--servers", "1", "--procs", "1", "--size", "64K", "--record", "64K"])
        .args(["--stripes", "1", "--mode", "n-n", "--runs", "1", "--dir"])
        .arg(&dir.0)
        .arg("--json")
        .arg(&json)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::remove_file(json.with_extension("svg")).unwrap();
    let out = dir.0.join("report.md");
    // Through `weft bench`, which runs the weft-bench beside it.
    let weft = std::path::Path::new(BENCH).with_file_name("weft");
    let status = Command::new(weft).args(["bench", "report"]).arg(&dir.0).arg("--out").arg(&out).status().unwrap();
    assert!(status.success());
    let md = std::fs::read_to_string(&out).unwrap();
    assert!(md.contains("## checkpoint (ckpt.json)"), "{md}");
    assert!(md.contains("- command: `") && md.contains("bench checkpoint"), "{md}");
    assert!(md.contains("cores)") && md.contains("kernel"), "{md}");
    assert!(md.contains("| 1 | 1 | n-n | 1 |"), "{md}");
    // The chart is regenerated beside the JSON.
    assert!(std::fs::read_to_string(json.with_extension("svg")).unwrap().starts_with("<svg"));
}

#[test]
fn short_circuits_and_delay() {
    for (name, extra) in [
        ("sc-server", ["--short-circuit", "server"]),
        ("sc-network", ["--short-circuit", "network"]),
        ("delay", ["--delay-us", "10"]),
    ] {
        let args = ["throughput", "--servers", "1", "--record", "64K", "--size", "1M", "--runs", "1", "--no-iperf"];
        let doc = bench(name, &[&args[..], &extra[..]].concat());
        check_contract(&doc, "throughput", "mib_per_s");
        let f = &doc["config"]["fabric_options"];
        match name {
            "delay" => assert_eq!((f["delay_us"].as_u64(), f["short_circuit"].is_null()), (Some(10), true), "{f}"),
            _ => assert_eq!(f["short_circuit"], name.trim_start_matches("sc-"), "{f}"),
        }
    }
    // A checkpoint (fsync included) through short-circuited servers.
    let args = ["checkpoint", "--servers", "1", "--procs", "2", "--size", "128K", "--record", "64K", "--stripes", "1"];
    let doc = bench("sc-ckpt", &[&args[..], &["--runs", "1", "--short-circuit", "server"]].concat());
    check_contract(&doc, "checkpoint", "mib_per_s");
}

/// `weft bench cache` at tiny sizes with the bank off and on (one daemon, two block sizes), unused by the clients
/// (`--unused`), every lookup missing (`--miss`) and the storm through FUSE too: one result per (cache, block, bank
/// mode, workload) — per record size for the latency — each with its headline and its ratios to the no-bank
/// cluster and to the same cluster's clients not using the bank; and the targets block.
#[test]
fn cache() {
    let args = [
        "cache",
        "--servers",
        "1",
        "--cache",
        "0,1",
        "--block",
        "256,2K",
        "--cache-mib",
        "16",
        "--procs",
        "2",
        "--files",
        "10",
        "--record",
        "1,4K",
        "--count",
        "8",
        "--size",
        "64K",
        "--shared-record",
        "16K",
        "--iozone-record",
        "16K",
        "--miss",
        "--unused",
        "--fuse",
        "--no-glusterfs",
        "--runs",
        "1",
    ];
    let doc = bench("cache", &args);
    assert!(doc["command"].as_str().unwrap().contains("bench cache"), "{doc}");
    assert_eq!(doc["config"]["bench"], "cache");
    assert!(doc["config"]["glusterfs"].as_str().unwrap().starts_with("not measured"), "{}", doc["config"]);
    let results = doc["results"].as_array().unwrap();
    let points = [
        (0, None, "off"),
        (1, Some(256), "unused"),
        (1, Some(256), "hit"),
        (1, Some(256), "miss"),
        (1, Some(2048), "unused"),
        (1, Some(2048), "hit"),
        (1, Some(2048), "miss"),
    ];
    let mut seen = 0;
    for (cache, block, bank) in points {
        let at = |w: &str, access: &str| -> Vec<&Value> {
            results
                .iter()
                .filter(|r| {
                    r["system"] == "weft"
                        && r["cache"] == cache
                        && r["block_bytes"].as_u64() == block
                        && r["bank"] == bank
                        && r["workload"] == w
                        && r["access"] == access
                })
                .collect()
        };
        let latency: Vec<u64> = at("latency", "native").iter().map(|r| r["record_bytes"].as_u64().unwrap()).collect();
        assert_eq!(latency, [1, 4096], "latency of cache {cache} block {block:?} bank {bank}");
        for (w, n) in [("storm", 1), ("shared", 1), ("iozone", 1)] {
            assert_eq!(at(w, "native").len(), n, "{w} of cache {cache} block {block:?} bank {bank}");
        }
        // Through FUSE: the storm, with the cluster's own bank (a mount reads its cluster.toml).
        let fuse = usize::from(bank == "off" || bank == "hit");
        assert_eq!(at("storm", "fuse").len(), fuse, "fuse storm, bank {bank}");
        seen += 5 + fuse;
    }
    assert_eq!(results.len(), seen, "no other results");
    for r in results {
        let op = r["op"].as_str().unwrap();
        assert!(OPS.contains(&op), "{r}");
        let headline = r["headline"].as_str().unwrap_or_else(|| panic!("headline: {r}"));
        let h = positive(r, headline);
        let (lo, hi) = (positive(r, "min"), positive(r, "max"));
        assert!(lo <= h && h <= hi, "min {lo} ≤ {headline} {h} ≤ max {hi}: {r}");
        assert!(r["runs"].as_u64().unwrap_or(0) >= 1, "runs: {r}");
        positive(r, "speedup_vs_cache0");
        positive(r, "ratio_to_cache0");
        if r["cache"] != 0 && r["access"] == "native" {
            positive(r, "speedup_vs_unused");
        }
        if r["workload"] == "shared" || r["workload"] == "iozone" {
            positive(r, "client_cpu_s_per_gib");
        }
        if r["bank"] == "off" && r["system"] == "weft" {
            assert_eq!(r["speedup_vs_cache0"], 1.0, "the baseline is its own baseline: {r}");
        }
    }
    let t = &doc["targets"];
    assert_eq!(t["stat_storm"]["points"].as_array().unwrap().len(), 2, "{t}");
    assert_eq!(t["one_byte_read"]["points"].as_array().unwrap().len(), 2, "{t}");
    assert!(t["all_miss"]["worst"]["slowdown"].as_f64().is_some(), "{t}");
    assert!(t["all_miss"]["worst_vs_unused"]["slowdown"].as_f64().is_some(), "{t}");
}

/// `weft bench nfs` at a tiny size (the last 1 MiB record partial): Weft's gateway, and nfs-ganesha where this machine
/// can run it (root, its packages) — otherwise the JSON and the table say why it was skipped. The bench compares
/// every byte it reads back with what it wrote and fails otherwise; the read results record the bytes so verified.
#[test]
fn nfs() {
    let size = 3200u64 << 10;
    let doc = bench("nfs", &["nfs", "--servers", "1", "--size", "3200K", "--files", "8", "--runs", "1"]);
    assert!(doc["command"].as_str().unwrap().contains("bench nfs"), "{doc}");
    assert_eq!(doc["config"]["bench"], "nfs");
    let skipped = doc["config"]["skipped"].as_object().unwrap_or_else(|| panic!("config.skipped: {doc}"));
    let mut systems = vec!["weft"];
    match skipped.get("nfs-ganesha") {
        Some(why) => assert!(!why.as_str().unwrap_or("").is_empty(), "{doc}"),
        None => systems.push("nfs-ganesha"),
    }
    let results = doc["results"].as_array().unwrap();
    assert_eq!(results.len(), 5 * systems.len(), "{doc}");
    for sys in &systems {
        for op in ["write", "read", "create", "stat", "remove"] {
            let r = results
                .iter()
                .find(|r| r["system"] == *sys && r["op"] == op)
                .unwrap_or_else(|| panic!("no {sys} {op} in {doc}"));
            assert_eq!(r["runs"], 1, "{r}");
            let data = matches!(op, "write" | "read");
            let h = positive(r, if data { "mib_per_s" } else { "ops_per_s" });
            let (lo, hi) = (positive(r, "min"), positive(r, "max"));
            assert!(lo <= h && h <= hi, "{r}");
            let unit = if data { "s_per_gib" } else { "us_per_op" };
            for who in ["client", "server"] {
                let cpu = r[format!("{who}_cpu_{unit}")].as_f64().unwrap_or_else(|| panic!("{who} CPU in {r}"));
                assert!(cpu.is_finite() && cpu >= 0.0, "{r}");
            }
            if op == "read" {
                assert_eq!(r["verified_bytes"].as_u64(), Some(size), "{r}");
            }
            if *sys == "weft" && systems.len() == 2 {
                positive(r, "ratio_to_ganesha");
                if op != "remove" {
                    assert!(r["meets_target"].is_boolean(), "{r}");
                }
            }
        }
    }
}

/// Writes `doc` as DIR/NAME and renders the directory with `weft bench report`; returns the Markdown.
fn report_of(dir: &Path, docs: &[(&str, &Value)]) -> String {
    for (name, doc) in docs {
        std::fs::write(dir.join(name), serde_json::to_string(doc).unwrap()).unwrap();
    }
    let out = dir.join("report.md");
    let status = Command::new(BENCH).arg("report").arg(dir).arg("--out").arg(&out).status().unwrap();
    assert!(status.success());
    std::fs::read_to_string(&out).unwrap()
}

/// `throughput --layout plain,ec4+2 --degraded` on 7 data servers: each layout's write and read with its
/// `ratio_to_plain`, then ec4+2 read again with one of its servers stopped (`degraded-read`, `ratio_to_healthy`),
/// every byte of it compared, under a `rebuild_after_ms` no rebuild reaches; `weft bench report` renders it.
#[test]
fn throughput_layouts_and_degraded_read() {
    let args = ["throughput", "--servers", "7", "--layout", "plain,ec4+2", "--degraded", "--record", "1M"];
    let doc = bench("throughput-ec", &[&args[..], &["--size", "8M", "--runs", "1", "--no-iperf"]].concat());
    check_contract(&doc, "throughput", "mib_per_s");
    check_loads(&doc);
    assert_eq!(ops_of(&doc), ["write", "read", "write", "read", "degraded-read"]);
    let results = doc["results"].as_array().unwrap();
    let layouts: Vec<&str> = results.iter().map(|r| r["layout"].as_str().unwrap()).collect();
    assert_eq!(layouts, ["plain", "plain", "ec4+2", "ec4+2", "ec4+2"]);
    for r in &results[..2] {
        assert_eq!(r["ratio_to_plain"], 1.0, "plain is its own baseline: {r}");
    }
    for r in &results[2..4] {
        positive(r, "ratio_to_plain");
        assert_eq!(r["stripe_unit_bytes"], 1 << 20, "{r}");
    }
    let d = &results[4];
    positive(d, "ratio_to_healthy");
    assert!(d["ratio_to_plain"].is_null(), "a plain file has no degraded read: {d}");
    assert_eq!(d["servers_down"], 1, "{d}");
    assert!(d["stopped_server"].as_u64().is_some_and(|s| s < 7), "{d}");
    assert_eq!(d["bytes_verified"], 8 << 20, "the whole file, compared: {d}");
    assert_eq!(d["rebuild_during_read"], false, "{d}");
    let c = &doc["config"];
    assert_eq!(c["layouts"], serde_json::json!(["plain", "ec4+2"]), "{c}");
    assert!(c["rebuild_after_ms"].as_u64().unwrap() >= 600_000, "{c}");
    let dir = TempDir::new("report-ec");
    let md = report_of(&dir.0, &[("throughput-ec.json", &doc)]);
    assert!(md.contains("## throughput (throughput-ec.json)"), "{md}");
    assert!(md.contains("| ec4+2 | 1M | degraded-read |"), "{md}");
}

/// `rebuild --layout ec4+2 --servers 7 --rebuild-mib-s 0,200` at a tiny size: per throttle a fill, a kill -9, the
/// rebuild onto spares timed through the MDS, and the read-back and scrub that must find every byte right;
/// `weft bench report` renders it.
#[test]
fn rebuild() {
    let args = ["rebuild", "--layout", "ec4+2", "--servers", "7", "--rebuild-mib-s", "0,200", "--size", "8M"];
    let extra = ["--files", "2", "--rebuild-after-ms", "3000", "--runs", "1", "--no-glusterfs"];
    let doc = bench("rebuild", &[&args[..], &extra[..]].concat());
    check_contract(&doc, "rebuild", "mib_per_s");
    check_loads(&doc);
    assert_eq!(ops_of(&doc), ["write", "read", "rebuild", "write", "read", "rebuild"]);
    let results = doc["results"].as_array().unwrap();
    for (r, throttle) in [(&results[2], 0), (&results[5], 200)] {
        assert_eq!(r["rebuild_mib_per_s_throttle"], throttle, "{r}");
        assert_eq!(r["verified"], true, "{r}");
        assert_eq!(r["bytes_verified"], 8 << 20, "{r}");
        assert_eq!(r["scrub_inconsistencies"], 0, "{r}");
        positive(r, "detect_s");
        positive(r, "rebuild_s");
        let lost = r["bytes_lost"][0].as_u64().unwrap();
        assert!(lost > 0 && r["bytes_rebuilt"][0].as_u64().unwrap() >= lost, "the spares got what was lost: {r}");
        assert!(r["files_rebuilt"][0].as_u64().unwrap() >= 1, "{r}");
        assert!(r["ratio_to_glusterfs_heal"].is_null(), "GlusterFS not measured: {r}");
        match throttle {
            0 => assert!(r["ratio_to_throttle"].is_null(), "{r}"),
            _ => _ = positive(r, "ratio_to_throttle"),
        }
    }
    for r in [&results[1], &results[4]] {
        assert_eq!(r["bytes_verified"], 8 << 20, "the read-back compares every byte: {r}");
    }
    assert!(doc["config"]["glusterfs"].as_str().unwrap().starts_with("not measured"), "{}", doc["config"]);
    assert!(doc["targets"]["rebuild_vs_throttle"]["points"].as_array().is_some_and(|p| p.len() == 1), "{doc}");
    let dir = TempDir::new("report-rebuild");
    let md = report_of(&dir.0, &[("rebuild.json", &doc)]);
    assert!(md.contains("## rebuild (rebuild.json)"), "{md}");
    assert!(md.contains("| weft | ec4+2 | rebuild | unthrottled |"), "{md}");
    assert!(std::fs::read_to_string(dir.0.join("rebuild.svg")).unwrap().starts_with("<svg"));
}

/// `weft bench fuse-transport` at a tiny count: both transports mounted (root; the kernel's `enable_uring` set for
/// the run and put back after), each with requests served inline and on a pool (two ways), every op measured, every
/// byte read checked by the bench, the ring's ratio to `/dev/fuse` on each of its results, and the module
/// parameter as it was.
#[test]
fn fuse_transport() {
    let param = "/sys/module/fuse/parameters/enable_uring";
    let Ok(before) = std::fs::read_to_string(param) else {
        eprintln!("skipped: {param} does not exist (a kernel without FUSE over io_uring)");
        return;
    };
    let doc = bench("fuse-transport", &["fuse-transport", "--threads", "1,2", "--count", "300", "--runs", "2"]);
    assert_eq!(doc["config"]["bench"], "fuse-transport");
    assert!(doc["command"].as_str().unwrap().contains("bench fuse-transport"), "{doc}");
    let results = doc["results"].as_array().unwrap();
    assert_eq!(results.len(), 2 * 3 * 2 * 2, "two transports, three dispatches, two thread counts, two ops: {doc}");
    let dispatches = ["inline", "pool", "pool-submits"];
    for (transport, dispatch) in ["dev-fuse", "io-uring"].into_iter().flat_map(|t| dispatches.map(|d| (t, d))) {
        for threads in [1, 2] {
            for op in ["stat", "read4k"] {
                let r = results
                    .iter()
                    .find(|r| {
                        r["transport"] == transport
                            && r["dispatch"] == dispatch
                            && r["threads"] == threads
                            && r["op"] == op
                    })
                    .unwrap_or_else(|| panic!("no {transport} {dispatch} {threads} {op} in {doc}"));
                assert_eq!(r["runs"], 2, "{r}");
                assert_eq!(r["ops"], 300 * threads, "{r}");
                let h = positive(r, "ops_per_s");
                assert!(positive(r, "min") <= h && h <= positive(r, "max"), "{r}");
                positive(r, "p50_us");
                if transport == "io-uring" {
                    positive(r, "vs_dev_fuse_ops");
                    positive(r, "vs_dev_fuse_p50");
                }
            }
        }
    }
    assert_eq!(std::fs::read_to_string(param).unwrap(), before, "enable_uring is put back as it was");
    let dir = TempDir::new("fuse-transport-report");
    assert!(report_of(&dir.0, &[("fuse-transport.json", &doc)]).contains("io-uring"));
}
