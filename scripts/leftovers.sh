#!/usr/bin/env bash
# Processes `make test` starts must not outlive it (issue 30 item 7).
#   scripts/leftovers.sh snapshot FILE   records the pids of watched programs already running (not ours)
#   scripts/leftovers.sh check FILE      fails, naming them, if a watched program not in FILE is still running
#                                        after a grace of 20 s; kills what it names, so the machine is left clean
# Watched: the weft binary (any role, the mount included), memcached, postgres, qemu, fsx, and the peers' daemons.
set -euo pipefail
watched='^(weft|memcached|postgres|postmaster|qemu-system-x86|fsx|ganesha.nfsd|glusterd|glusterfsd|redis-server)$'
ours() { ps -eo pid=,comm= | awk -v re="$watched" '$2 ~ re { print $1 }' | sort -n; }
case "${1:-}" in
snapshot)
	ours >"$2"
	;;
check)
	touch "$2"
	left=""
	for _ in $(seq 1 200); do
		left="$(ours | comm -23 - <(sort -n "$2") | grep -vx "$$" || true)"
		[ -z "$left" ] && break
		sleep 0.1
	done
	if [ -n "$left" ]; then
		echo "leftovers: these processes started during the run are still alive:" >&2
		for p in $left; do ps -o pid=,args= -p "$p" >&2 || true; done
		for p in $left; do kill -9 "$p" 2>/dev/null || true; done
		exit 1
	fi
	echo "leftovers: none"
	;;
*)
	echo "usage: $0 snapshot|check FILE" >&2
	exit 2
	;;
esac
