#!/usr/bin/env python3
"""A/B in one run: creates in a directory the mount made (its names known: negative lookups answered locally)
against one made by the native CLI (the mount does not know its names: each create's lookup goes to the MDS).
usage: scripts/bench-creates-ab.py WEFT DATA_DIR MOUNT ROUNDS N, against `weft up --mount MOUNT --data-dir DATA_DIR`
(docs/bench.md, "A mount answers lookups of missing names"). Creates/s and the MDS's Lookup calls per create."""
import os, statistics, subprocess, sys, threading, time, urllib.request

weft, data, mnt, rounds, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
cluster = os.path.join(data, "cluster.toml")
# metrics.txt (written by `weft up`): one "ROLE ADDR" line per role.
URL = "http://" + [l.split()[1] for l in open(os.path.join(data, "metrics.txt")) if l.startswith("meta ")][0] + "/metrics"


def mds_lookups():
    body = urllib.request.urlopen(URL).read().decode()
    return sum(float(l.split()[-1]) for l in body.splitlines()
               if l.startswith("weft_rpc_server_requests_total") and 'op="Lookup"' in l)


def creators(jobs):
    """One thread per (dir, name prefix, count): O_CREAT|O_EXCL then close. Creates/s of all together."""
    def work(d, prefix, count):
        for i in range(count):
            os.close(os.open(os.path.join(d, f"{prefix}{i}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    ts = [threading.Thread(target=work, args=job) for job in jobs]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(job[2] for job in jobs) / (time.perf_counter() - t0)


def make(kind, name):
    if kind == "mount":
        os.mkdir(os.path.join(mnt, name))
    else:
        subprocess.run([weft, "mkdir", "--cluster", cluster, "/" + name], check=True, stdout=subprocess.DEVNULL)
    return os.path.join(mnt, name)


# (label, threads, a directory per thread)
cases = [("1 thread, one dir", 1, False), ("4 threads, one dir", 4, False), ("8 threads, a dir each", 8, True)]
res = {}
creators([(make("mount", "warm"), "f", 200)])
for r in range(rounds):
    for label, threads, own in cases:
        for kind in (["mount", "cli"] if r % 2 == 0 else ["cli", "mount"]):
            per = n // threads
            if own:
                jobs = [(make(kind, f"r{r}-{kind}-{threads}-{j}"), "f", per) for j in range(threads)]
            else:
                d = make(kind, f"r{r}-{kind}-{threads}")
                jobs = [(d, f"t{k}-", per) for k in range(threads)]
            before = mds_lookups()
            rate = creators(jobs)
            lookups = (mds_lookups() - before) / (per * threads)
            res.setdefault((label, kind), []).append((rate, lookups))
            print(f"round {r} {label:24} dir made by {kind:5}: {rate:7.0f} creates/s, {lookups:.2f} Lookup/create",
                  flush=True)
print()
for label, _, _ in cases:
    runs = {kind: res[(label, kind)] for kind in ("mount", "cli")}
    med = {kind: statistics.median(x[0] for x in v) for kind, v in runs.items()}
    each = {kind: " / ".join(f"{x[0]:.0f}" for x in v) for kind, v in runs.items()}
    lk = {kind: statistics.median(x[1] for x in v) for kind, v in runs.items()}
    print(f"{label:24} mount-made {med['mount']:7.0f} ({each['mount']}), cli-made {med['cli']:7.0f} ({each['cli']}), "
          f"ratio {med['mount'] / med['cli']:.2f}x; Lookup/create {lk['mount']:.2f} vs {lk['cli']:.2f}")
