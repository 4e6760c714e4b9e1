#!/usr/bin/env bash
# The host's half of guest/nfs.sh's control channel. qemu runs it once per connection the guest opens to
# 10.0.2.100:5555, with the connection as stdin/stdout: it reads one request line, does it, and answers one line,
# `ok [RESULT]` or `error WHY`. nfs.sh also runs it directly (`start PORT`) for the gateway's first start.
# Environment (from nfs.sh, through qemu): NFSVM_DIR (work dir), NFSVM_WEFT, NFSVM_CLUSTER, NFSVM_MNT (the FUSE mount),
# NFSVM_GRACE_MS (the gateway's NFSv4 grace period).
#
# Requests:
#   start PORT            start `weft nfs` on 127.0.0.1:PORT (0: any), wait for its WEFT-READY line
#   kill-restart          SIGKILL the gateway (no sync, no goodbye), then start it again on the same port (on the
#                         same --state-dir: the new process adopts the old one's locks, docs/format.md §22)
#   wait-grace            wait until the gateway's NFSv4 grace period since its last start is over
#   fuse-write NAME BYTES SEED   write NAME under the FUSE mount (seeded pseudo-random bytes), close it; answer its MD5
#   fuse-md5 NAME         the MD5 of NAME read through the FUSE mount
#   fuse-flock-hold NAME  a process takes flock(LOCK_EX) on NAME through FUSE and keeps it until fuse-flock-release
#   fuse-flock-release NAME
#   fuse-flock-try NAME   flock(LOCK_EX|LOCK_NB) on NAME through FUSE, released at once: `ok free` or `ok held`
#   fuse-sqlite-hold NAME / fuse-sqlite-release NAME   the same with an SQLite `BEGIN EXCLUSIVE` (fcntl locks)
set -uo pipefail
d="$NFSVM_DIR"
answer() { echo "$*"; exit 0; }

# wait_for CMD...: CMD until it succeeds, 0.1 s apart, at most a minute.
wait_for() {
	local i=0
	until "$@"; do
		i=$((i + 1))
		[ "$i" -le 600 ] || return 1
		sleep 0.1
	done
}

start_gateway() {
	local port="$1" before
	before="$(grep -c '^WEFT-READY ' "$d/nfs.out" 2>/dev/null || true)"
	# Its own session, stdin/stdout away from the control connection: it outlives this request.
	RUST_LOG="${NFS_VM_GATEWAY_LOG:-${RUST_LOG:-info}}" setsid "$NFSVM_WEFT" nfs --cluster "$NFSVM_CLUSTER" --listen "127.0.0.1:$port" --no-root-squash \
		--state-dir "$d/nfs-state" --nfs4-grace-ms "${NFSVM_GRACE_MS:-15000}" \
		</dev/null >>"$d/nfs.out" 2>>"$d/nfs.log" &
	echo $! >"$d/nfs.pid"
	ready() { [ "$(grep -c '^WEFT-READY ' "$d/nfs.out" 2>/dev/null || true)" -gt "${before:-0}" ]; }
	wait_for ready || answer "error the gateway did not become ready on port $port"
}

# fuse_path NAME: sets $p to NAME under the FUSE mount; NAME must be a plain relative path inside it.
fuse_path() {
	case "$1" in "" | /* | *..*) answer "error bad name '$1'" ;; esac
	p="$NFSVM_MNT/$1"
}

if [ $# -gt 0 ]; then req="$*"; else read -r req || answer "error no request"; fi
# shellcheck disable=SC2086 # the request is words
set -- $req
echo "$(date -u +%T.%N) $req" >>"$d/control.log"
case "${1:-}" in
start)
	start_gateway "$2"
	answer "ok $(cat "$d/nfs.pid")"
	;;
kill-restart)
	pid="$(cat "$d/nfs.pid")"
	port="$(sed -n 's/^WEFT-READY .*:\([0-9]*\)$/\1/p' "$d/nfs.out" | head -1)"
	kill -9 "$pid" || answer "error the gateway (pid $pid) was not running"
	gone() { ! kill -0 "$pid" 2>/dev/null; }
	wait_for gone || answer "error the gateway survived SIGKILL"
	start_gateway "$port"
	answer "ok killed $pid, restarted as $(cat "$d/nfs.pid") on port $port"
	;;
fuse-write)
	fuse_path "$2"
	# Seeded: the same request always writes the same bytes.
	LC_ALL=C awk -v n="$3" -v seed="$4" 'BEGIN { srand(seed); while (n > 0) { printf "%c", int(rand() * 256); n-- } }' \
		>"$p" || answer "error writing $p"
	answer "ok $(md5sum <"$p" | cut -d' ' -f1)"
	;;
wait-grace)
	# One "grace period over" line per start, logged when it ends.
	over() { [ "$(grep -c 'NFSv4 grace period over' "$d/nfs.log" 2>/dev/null || true)" -ge "$(grep -c '^WEFT-READY ' "$d/nfs.out")" ]; }
	i=0
	until over; do
		i=$((i + 1))
		[ "$i" -le 3000 ] || answer "error the grace period never ended"
		sleep 0.1
	done
	answer "ok grace over"
	;;
fuse-flock-try)
	fuse_path "$2"
	if flock -n -x "$p" true; then answer "ok free"; else answer "ok held"; fi
	;;
fuse-md5)
	fuse_path "$2"
	[ -f "$p" ] || answer "error no file $p"
	answer "ok $(md5sum <"$p" | cut -d' ' -f1)"
	;;
fuse-flock-hold | fuse-sqlite-hold)
	fuse_path "$2"
	fifo="$d/release.$(basename "$2")"
	rm -f "$fifo" "$fifo.held" "$fifo.out" "$fifo.out.try"
	mkfifo "$fifo"
	if [ "$1" = fuse-flock-hold ]; then
		setsid flock -x "$p" sh -c "touch '$fifo.held'; read x <'$fifo'" </dev/null >/dev/null 2>&1 &
		wait_for test -e "$fifo.held" || answer "error the host never got the flock on $p"
	else
		# sqlite3 reads its statements from the pipe: BEGIN EXCLUSIVE runs, then it waits for the next line. With
		# a busy timeout: the Linux NFS client unlocks asynchronously at close (its LOCKU goes out after close(2)
		# returned), so the guest's last sqlite3 may still hold its SHARED lock for a moment.
		# Its output (an error of BEGIN EXCLUSIVE) goes to a file the failure answer quotes.
		out="$fifo.out"
		setsid sh -c "{ echo 'BEGIN EXCLUSIVE;'; read x <'$fifo'; echo 'COMMIT;'; } | sqlite3 -cmd '.timeout 60000' -bail '$p'; echo \"exit \$?\"" \
			</dev/null >"$out" 2>&1 &
		# Held once another writer is refused at once (no busy timeout) as busy.
		busy() { ! sqlite3 "$p" "BEGIN IMMEDIATE; ROLLBACK;" >"$out.try" 2>&1; }
		wait_for busy || answer "error the host never began the exclusive transaction on $p:" \
			"holder: $(tr '\n' ' ' <"$out"), another writer: $(tr '\n' ' ' <"$out.try")"
	fi
	answer "ok held"
	;;
fuse-flock-release | fuse-sqlite-release)
	fifo="$d/release.$(basename "$2")"
	echo release >"$fifo"
	answer "ok released"
	;;
*)
	answer "error unknown request '$req'"
	;;
esac
