#!/usr/bin/env bash
# pNFS with the Linux kernel client: on this host a cluster of a metadata service and 4 data servers, each also a
# pNFS data server listening for NFS on 127.0.0.1:P_i and advertising 10.0.2.2:P_i (qemu's user-mode network
# maps the guest's 10.0.2.2 to this host's loopback), and a `weft nfs --pnfs on` gateway; the VM of run.sh runs
# guest/pnfs.sh: a vers=4.1 mount writes a file striped over the 4 servers and reads it back equal after a
# remount, with LAYOUTGET and GETDEVICEINFO in its mountstats. Then here: every data server's log must show it
# served READ and WRITE bytes for that file's inode, and the gateway (stopped with SIGTERM, which logs the data
# bytes it moved per inode) none. Then a recall: the guest holds a second file open with a layout and truncates
# and rewrites it through a vers=3 mount of the gateway; the gateway's log must show a CB_LAYOUTRECALL sent for it
# and answered, and the guest reads the new bytes. Then an expiry: the MDS seals pNFS handles for PNFS_VM_TTL_S
# (default 20 s, pnfs_handle_ttl_ms) and the guest writes a third file across that lifetime: a data server must
# have refused its expired handle, and the guest reads every byte back.
#
# usage: scripts/rdma-vm/pnfs.sh [WEFT_BIN]   (default: $CARGO_TARGET_DIR/release/weft or target/release/weft)
# Environment: PNFS_VM_MIB (the file's size, default 4), NFS_VM_GATEWAY_LOG (the gateway's RUST_LOG).
# Exits 0 only if the guest passed and the host's checks held; on failure prints the console and the logs.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
weft="$(readlink -f "${1:-${CARGO_TARGET_DIR:-$repo/target}/release/weft}")"
[ -x "$weft" ] || { echo "pnfs.sh: no weft binary at $weft (cargo build --release -p weft)" >&2; exit 2; }
servers=4
mib="${PNFS_VM_MIB:-4}"
ttl_s="${PNFS_VM_TTL_S:-20}"

w="$(mktemp -d /tmp/weft-pnfs-vm.XXXXXX)"
pids=()
ok=0
# Every process `start` ran: `start` runs in a command substitution (a subshell), so its `$!` reaches this shell
# only through the pid files; each is stopped with SIGTERM, then SIGKILL if still alive after 10 s.
stop_all() {
	local f p i
	for f in "$w"/*.pid; do [ -s "$f" ] && kill "$(cat "$f")" 2>/dev/null; done
	for f in "$w"/*.pid; do
		[ -s "$f" ] || continue
		p="$(cat "$f")"
		i=0
		while kill -0 "$p" 2>/dev/null && [ "$i" -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
		kill -9 "$p" 2>/dev/null
	done
}
finish() {
	set +e
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	stop_all
	wait 2>/dev/null
	if [ "$ok" = 1 ]; then
		rm -rf "$w"
	else
		echo "==== pnfs.sh: FAILED; the guest console: $w/console.log ====" >&2
		cat "$w/console.log" >&2 2>/dev/null
		[ -s "$w/nfs.pid" ] && kill -TERM "$(cat "$w/nfs.pid")" 2>/dev/null && sleep 2
		echo "==== the gateway's bytes per inode, the data servers' refusals ====" >&2
		grep -h "gateway data bytes served" "$w/nfs.log" >&2 2>/dev/null
		grep -h "refusing a request's capability\|WRITE refused" "$w"/d*.log >&2 2>/dev/null
		echo "==== the gateway's log ($w/nfs.log, last 60 lines) ====" >&2
		tail -n 60 "$w/nfs.log" >&2 2>/dev/null
		for i in $(seq 0 $((servers - 1))); do
			echo "==== data server $i ($w/d$i.log, pNFS lines) ====" >&2
			grep "pnfs\|WARN\|ERROR" "$w/d$i.log" | tail -n 20 >&2
		done
	fi
}
trap finish EXIT

fail() { echo "pnfs.sh: FAIL: $*" >&2; exit 1; }
# wait_for WHAT CMD...: CMD until it succeeds, 0.1 s apart, at most a minute; else fails saying WHAT.
wait_for() {
	local what="$1" i=0
	shift
	until "$@"; do
		i=$((i + 1))
		[ "$i" -le 600 ] || fail "$what"
		sleep 0.1
	done
}
# start NAME ROLE ARGS...: runs `weft ROLE ARGS` in the background, waits for its WEFT-READY line, prints the address.
start() {
	local name="$1"
	shift
	RUST_LOG="${RUST_LOG:-info}" "$weft" "$@" >"$w/$name.out" 2>"$w/$name.log" &
	pids+=($!)
	echo $! >"$w/$name.pid"
	ready() { grep -q "^WEFT-READY " "$w/$name.out"; }
	wait_for "$name never became ready: $(tail -n 5 "$w/$name.log" 2>/dev/null)" ready
	sed -n 's/^WEFT-READY //p' "$w/$name.out" | head -1
}
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

"$weft" key new "$w/cluster.key" >/dev/null
mkdir -p "$w/meta"
printf 'listen = "127.0.0.1:0"\ndata_dir = "%s"\nkey_file = "%s"\npnfs_handle_ttl_ms = %d\n' "$w/meta" "$w/cluster.key" \
	$((ttl_s * 1000)) >"$w/meta.toml"
mds="$(start meta meta --config "$w/meta.toml")"
printf 'mds = "%s"\nkey_file = "%s"\n' "$mds" "$w/cluster.key" >"$w/cluster.toml"
for i in $(seq 0 $((servers - 1))); do
	port="$(free_port)"
	mkdir -p "$w/d$i"
	cat >"$w/d$i.toml" <<CFG
id = $i
listen = "127.0.0.1:0"
root = "$w/d$i"
mds = "$mds"
key_file = "$w/cluster.key"
nfs_listen = ["127.0.0.1:$port"]
nfs_advertise = ["10.0.2.2:$port"]
capability_clock_skew_ms = 0
CFG
	echo "pnfs.sh: data server $i at $(RUST_LOG="${RUST_LOG:-info,weft_nfs::ds=debug}" start "d$i" data --config "$w/d$i.toml"), NFS on 127.0.0.1:$port (advertised as 10.0.2.2:$port)"
done
all_up() { "$weft" status --cluster "$w/cluster.toml" 2>/dev/null | grep -q "$servers of $servers data servers up"; }
wait_for "the data servers never registered" all_up
"$weft" mkdir --cluster "$w/cluster.toml" /p
"$weft" setstripe --cluster "$w/cluster.toml" --unit 64K --count "$servers" /p
: >"$w/empty"
"$weft" put --cluster "$w/cluster.toml" "$w/empty" /p/file

addr="$(RUST_LOG="${NFS_VM_GATEWAY_LOG:-info}" start nfs nfs --cluster "$w/cluster.toml" --listen 127.0.0.1:0 --no-root-squash \
	--pnfs on --nfs4-grace-ms 1000 --nfs4-recall-ms 10000)"
port="${addr##*:}"
grep -q "pnfs=true" "$w/nfs.log" || fail "the gateway does not serve pNFS: $(grep 'NFS gateway serving' "$w/nfs.log")"
echo "pnfs.sh: gateway on 127.0.0.1:$port with --pnfs on"

start_s=$SECONDS
RDMA_VM_LOG="$w/console.log" RDMA_VM_SMP="${RDMA_VM_SMP:-1}" "$here/run.sh" --timeout-s 600 \
	"$here/guest/pnfs.sh" "$port" "$mib" "$ttl_s" >/dev/null || fail "the guest failed"
grep -a '^pnfs.sh: ' "$w/console.log" | tr -d '\r'
ino="$(sed -n 's/^pnfs.sh: PASS ino=\([0-9]*\) .*/\1/p' "$w/console.log" | tr -d '\r' | head -1)"
[ -n "$ino" ] || fail "the guest named no inode"

# The data servers log each NFS connection's bytes when it closes (the VM is gone: every connection closed).
for i in $(seq 0 $((servers - 1))); do
	served() { grep "pnfs ds: served READ" "$w/d$i.log" | grep -E "for ino ([0-9]+,)*$ino(,|$| )"; }
	closed() { served >/dev/null; }
	wait_for "data server $i never logged serving ino $ino" closed
	served | grep -q "READ [1-9][0-9]* bytes" || fail "data server $i served no READ bytes for ino $ino: $(served)"
	served | grep -q "WRITE [1-9][0-9]* bytes" || fail "data server $i served no WRITE bytes for ino $ino: $(served)"
	echo "pnfs.sh: data server $i: $(served | sed 's/.*pnfs ds: //' | tr '\n' ';')"
done
# The recall step's file: the gateway sent a CB_LAYOUTRECALL for it on the guest's back channel and got an answer
# (NFS4_OK, then the client's LAYOUTRETURN, or NFS4ERR_NOMATCHING_LAYOUT), and revoked nothing.
rino="$(sed -n 's/^pnfs.sh: PASS .* rino=\([0-9]*\) .*/\1/p' "$w/console.log" | tr -d '\r' | head -1)"
[ -n "$rino" ] || fail "the guest named no recall inode"
grep "CB_LAYOUTRECALL sent" "$w/nfs.log" | grep -q "ino=$rino " || fail "the gateway sent no CB_LAYOUTRECALL for ino $rino"
answered="$(grep "CB_LAYOUTRECALL answered" "$w/nfs.log" | grep "ino=$rino " || true)"
echo "$answered" | grep -qE "status=Some\((0|10060)\)" || fail "CB_LAYOUTRECALL for ino $rino not answered OK: $answered"
! grep "layout revoked\|not returned in time" "$w/nfs.log" | grep -qE "ino=$rino( |$)" ||
	fail "the gateway revoked the layout of ino $rino: $(grep 'revoked' "$w/nfs.log")"
echo "pnfs.sh: recall of ino $rino: $(echo "$answered" | sed 's/.*CB_LAYOUTRECALL/CB_LAYOUTRECALL/' | head -1)"
# The expiry step's file: some data server refused its handle as expired (the guest then read every byte right).
eino="$(sed -n 's/^pnfs.sh: PASS .* eino=\([0-9]*\) .*/\1/p' "$w/console.log" | tr -d '\r' | head -1)"
[ -n "$eino" ] || fail "the guest named no expiry inode"
grep -h "refusing a request's capability" "$w"/d*.log | grep "ino=$eino " | grep -q "expired" ||
	fail "no data server refused an expired handle of ino $eino"
echo "pnfs.sh: expiry of ino $eino: $(grep -h "refusing a request's capability" "$w"/d*.log | grep "ino=$eino " | grep -c expired) data-server refusals as expired"
# The gateway logs at SIGTERM the data bytes it moved per inode: none for this one.
kill -TERM "$(cat "$w/nfs.pid")"
stopped() { ! kill -0 "$(cat "$w/nfs.pid")" 2>/dev/null; }
wait_for "the gateway did not stop on SIGTERM" stopped
gw="$(grep "gateway data bytes served" "$w/nfs.log" | grep "ino=$ino " || true)"
[ -z "$gw" ] || fail "the gateway moved data bytes of ino $ino: $gw"
# Through the gateway for the expiry step's file: the I/O the data servers refused, resent (for the next person
# chasing a wrong byte there: issue 30).
echo "pnfs.sh: the gateway's bytes of ino $eino: $(grep "gateway data bytes served" "$w/nfs.log" | grep "ino=$eino " | sed 's/.*gateway data bytes/gateway data bytes/' || true)"
echo "pnfs.sh: the gateway moved no data bytes of ino $ino ($(grep -c 'gateway data bytes served' "$w/nfs.log" || true) inodes with bytes through it)"
echo "pnfs.sh: PASS (the VM step took $((SECONDS - start_s)) s)"
ok=1
