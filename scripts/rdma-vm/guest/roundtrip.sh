#!/bin/sh
# The rdma backend's file round trip (crates/weft-fabric/examples/rdma_roundtrip.rs) over rxe0: a server and a
# client process; the client's bytes go to the server by RDMA READ and come back by RDMA WRITE.
# usage: roundtrip.sh [MIB]   (file size, default 8)
set -e
mib="${1:-8}"
dd if=/dev/urandom of=/tmp/in bs=1M count="$mib" 2>/dev/null
rdma_roundtrip server 127.0.0.1:7471 /tmp/out &
server=$!
# The client retries its side-channel connect until the server listens (bounded, inside the example).
rdma_roundtrip client 127.0.0.1:7471 /tmp/in | tee /tmp/client.out
wait $server
cmp /tmp/in /tmp/out
grep -q "^RDMA-ROUNDTRIP: PASS" /tmp/client.out
