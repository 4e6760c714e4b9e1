#!/bin/sh
# Sanity check of the guest's verbs stack: rdma-core's own RC ping-pong, server and client over rxe0 in one VM.
# GID index 1 is the IPv4-mapped RoCEv2 GID of 10.0.2.15 (index 0 is the IPv6 link-local one).
set -e
ibv_devinfo -d rxe0 | grep -E "state|link_layer"
ibv_rc_pingpong -d rxe0 -g 1 -n 100 -s 4096 > /tmp/server.log 2>&1 &
server=$!
sleep 1 # the pingpong tools have no readiness signal; the client below also retries its connect
ok=0
for attempt in 1 2 3 4 5; do
	if ibv_rc_pingpong -d rxe0 -g 1 -n 100 -s 4096 127.0.0.1; then ok=1; break; fi
	sleep 1
done
wait $server || { cat /tmp/server.log; exit 1; }
cat /tmp/server.log
[ "$ok" = 1 ]
