#!/usr/bin/env python3
"""A/B in one run: creates in a directory the mount made (its names known: negative lookups answered locally)
against one made by the native CLI (the mount does not know its names: each create's lookup goes to the MDS).
usage: scripts/bench-creates-ab.py WEFT DATA_DIR MOUNT ROUNDS N, against `weft up --mount MOUNT --data-dir DATA_DIR`
(docs/bench.md, "A mount answers lookups of missing names"). Creates/s and the MDS's Lookup calls per create."""
import os, subprocess, sys, threading, time, urllib.request, re
weft, data, mnt, rounds, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
cluster = os.path.join(data, "cluster.toml")
def meta_url():
    for line in open(os.path.join(data, "metrics.txt")):
        if line.startswith("meta"):
            return "http://" + line.split()[-1].replace("http://", "").rstrip("/") + ("" if line.strip().endswith("/metrics") else "/metrics")
    raise SystemExit("no meta metrics in metrics.txt: " + open(os.path.join(data, "metrics.txt")).read())
URL = meta_url()
def mds_ops(op):
    body = urllib.request.urlopen(URL).read().decode()
    return sum(float(l.split()[-1]) for l in body.splitlines() if l.startswith("weft_rpc_server_requests_total") and f'op="{op}"' in l)
def creators(dirs, per):
    def work(d):
        for i in range(per):
            os.close(os.open(os.path.join(d, f"f{i}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    ts = [threading.Thread(target=work, args=(d,)) for d in dirs]
    t0 = time.perf_counter()
    for t in ts: t.start()
    for t in ts: t.join()
    return per * len(dirs) / (time.perf_counter() - t0)
def make(kind, name):
    if kind == "mount":
        os.mkdir(os.path.join(mnt, name))
    else:
        subprocess.run([weft, "mkdir", "--cluster", cluster, "/" + name], check=True, stdout=subprocess.DEVNULL)
    return os.path.join(mnt, name)
cases = [("1 thread, one dir", 1, False), ("4 threads, one dir", 4, False), ("8 threads, a dir each", 8, True)]
res = {}
creators([make("mount", "warm")], 200)
for r in range(rounds):
    for label, th, own in cases:
        for kind in (["mount", "cli"] if r % 2 == 0 else ["cli", "mount"]):
            if own:
                dirs = [make(kind, f"r{r}-{kind}-{th}-{j}") for j in range(th)]
                per = n // th
                rate_dirs = dirs
            else:
                d = make(kind, f"r{r}-{kind}-{th}")
                rate_dirs = [d] * th
                per = n // th
            if not own and th > 1:
                # threads share one dir: give each its own name prefix
                def work_shared(d, k, per):
                    for i in range(per):
                        os.close(os.open(os.path.join(d, f"t{k}-{i}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                l0 = mds_ops("Lookup")
                ts = [threading.Thread(target=work_shared, args=(d, k, per)) for k in range(th)]
                t0 = time.perf_counter()
                for t in ts: t.start()
                for t in ts: t.join()
                rate = per * th / (time.perf_counter() - t0)
            else:
                l0 = mds_ops("Lookup")
                rate = creators(rate_dirs if own else [d], per)
            lk = (mds_ops("Lookup") - l0) / (per * th)
            res.setdefault((label, kind), []).append((rate, lk))
            print(f"round {r} {label:24} dir made by {kind:5}: {rate:7.0f} creates/s, {lk:.2f} Lookup/create", flush=True)
print()
import statistics
for label, _, _ in cases:
    m = statistics.median(x[0] for x in res[(label, "mount")]); c = statistics.median(x[0] for x in res[(label, "cli")])
    print(f"{label:24} mount-made {m:7.0f} ({' / '.join(f'{x[0]:.0f}' for x in res[(label,'mount')])}), cli-made {c:7.0f} ({' / '.join(f'{x[0]:.0f}' for x in res[(label,'cli')])}), ratio {m/c:.2f}x; Lookup/create {statistics.median(x[1] for x in res[(label,'mount')]):.2f} vs {statistics.median(x[1] for x in res[(label,'cli')]):.2f}")
