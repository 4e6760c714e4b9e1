#!/usr/bin/env bash
# The Linux kernel NFS client against Weft's gateway: a real cluster on this host (`weft up`: a metadata service,
# two data servers and a FUSE mount) with a `weft nfs` gateway of its own, and the qemu VM of run.sh mounting it
# as 10.0.2.2 (qemu's user-mode network: the guest's connections reach the host from 127.0.0.1, which the gateway's
# default --allow serves). The guest script guest/nfs.sh runs the workloads; it asks this host for the steps that
# happen here (FUSE writes and checksums, killing and restarting the gateway) through run.sh's control channel,
# which runs nfs-control.sh once per request.
#
# usage: scripts/rdma-vm/nfs.sh [WEFT_BIN]   (default: $CARGO_TARGET_DIR/release/weft or target/release/weft)
# Environment: NFS_VM_GUEST (another guest script, for debugging), NFS_VM_LOCKS=0 (skips the v4.1 lock steps: locks
# contending with FUSE, and a gateway kill -9 while a flock is held), NFS_VM_GATEWAY_LOG (the gateway's RUST_LOG,
# e.g. weft_nfs=trace), NFS_VM_GRACE_MS (the gateway's NFSv4 grace period, default 15000), RDMA_VM_SMP (default 1
# here).
# Exits 0 only if the guest passed; on failure prints the guest console, the gateway's and the cluster's logs.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
weft="$(readlink -f "${1:-${CARGO_TARGET_DIR:-$repo/target}/release/weft}")"
[ -x "$weft" ] || { echo "nfs.sh: no weft binary at $weft (cargo build --release -p weft)" >&2; exit 2; }

work="$(mktemp -d /tmp/weft-nfs-vm.XXXXXX)"
mkdir -p "$work/mnt"
export NFSVM_DIR="$work" NFSVM_WEFT="$weft" NFSVM_MNT="$work/mnt" NFSVM_GRACE_MS="${NFS_VM_GRACE_MS:-15000}"
up_pid=""
ok=0
finish() {
	set +e
	if [ -s "$work/nfs.pid" ]; then kill "$(cat "$work/nfs.pid")" 2>/dev/null; fi
	if [ -n "$up_pid" ]; then kill -INT "$up_pid" 2>/dev/null; wait "$up_pid"; fi
	mountpoint -q "$work/mnt" && fusermount3 -u -z "$work/mnt"
	if [ "$ok" = 1 ]; then
		rm -rf "$work"
	else
		echo "==== nfs.sh: FAILED; the guest console: $work/console.log ====" >&2
		cat "$work/console.log" >&2 2>/dev/null
		echo "==== the gateway's log ($work/nfs.log, last 60 lines) ====" >&2
		tail -n 60 "$work/nfs.log" >&2 2>/dev/null
		echo "==== weft up ($work/up.out, last 30 lines; role logs in $work/data/logs) ====" >&2
		tail -n 30 "$work/up.out" >&2 2>/dev/null
	fi
}
trap finish EXIT

# wait_for WHAT CMD...: runs CMD until it succeeds, 0.1 s apart, for at most a minute; else fails saying WHAT.
wait_for() {
	local what="$1" i=0
	shift
	until "$@"; do
		i=$((i + 1))
		[ "$i" -le 600 ] || { echo "nfs.sh: $what" >&2; exit 1; }
		sleep 0.1
	done
}

# The cluster, with a FUSE mount that asks the cluster on every open (no attribute or entry caching), so what the
# guest wrote and closed through NFS is what the host reads back.
"$weft" up --data-dir "$work/data" --servers 2 --mount "$work/mnt" --attr-timeout-ms 0 --entry-timeout-ms 0 \
	>"$work/up.out" 2>&1 &
up_pid=$!
up_ready() {
	kill -0 "$up_pid" 2>/dev/null || { echo "nfs.sh: weft up died: $(tail -n 20 "$work/up.out")" >&2; exit 1; }
	grep -q "^Ctrl-C stops the cluster" "$work/up.out"
}
wait_for "weft up never became ready" up_ready
export NFSVM_CLUSTER="$work/data/cluster.toml"

# The gateway, on a port of its own (any free one); nfs-control.sh restarts it on the same port.
"$here/nfs-control.sh" start 0 >/dev/null
port="$(sed -n 's/^WEFT-READY .*:\([0-9]*\)$/\1/p' "$work/nfs.out" | head -1)"
[ -n "$port" ] || { echo "nfs.sh: the gateway reported no port" >&2; exit 1; }
echo "nfs.sh: cluster up, FUSE on $work/mnt, gateway on 127.0.0.1:$port (pid $(cat "$work/nfs.pid"))"

# Test data: six of this repository's crates (about 1.4 MiB of source, ~90 files in a tree): enough for every
# path of the client, small enough for TCG (git over NFS there costs about a second per 20 files).
rm -rf "$work/weft-src"
mkdir -p "$work/weft-src"
for c in weft-proto weft-fabric weft-rpc weft-client weft-meta weft-nfs; do cp -a "$repo/crates/$c" "$work/weft-src/"; done
start_s=$SECONDS
RDMA_VM_LOG="$work/console.log" RDMA_VM_SMP="${RDMA_VM_SMP:-1}" "$here/run.sh" --timeout-s 900 \
	--tree "$work/weft-src" --control "$here/nfs-control.sh" "${NFS_VM_GUEST:-$here/guest/nfs.sh}" "$port" "$([ "${NFS_VM_LOCKS:-1}" = 0 ] && echo nolocks || echo locks)" >/dev/null ||
	exit 1
grep -a '^nfs.sh: ' "$work/console.log" | tr -d '\r'
echo "nfs.sh: PASS (the VM step took $((SECONDS - start_s)) s)"
ok=1
