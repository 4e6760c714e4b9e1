#!/bin/sh
# A Weft cluster over rxe0: a metadata service, two data servers and a client, each its own process. The client
# reaches the metadata service at its rdma address and is forced onto the rdma fabric for data (`--fabric rdma`:
# no fallback to tcp), so every message and every bulk byte it exchanges travels over RDMA (SEND/RECV for the RPC
# frames, RDMA READ/WRITE for data). A file striped over both servers goes in and comes back out; the checksums
# must match, and both data servers must have moved bytes by RDMA READ and WRITE, none through a bounce copy.
# Then a client killed mid-read must have its connections closed on both data servers.
# usage: cluster.sh [MIB]   (file size, default 8)
set -e
mib="${1:-8}"
export RUST_LOG=info
w=/tmp/weft
mkdir -p $w/meta $w/d1 $w/d2

# wait_for WHAT CMD...: runs CMD until it succeeds, 0.1 s apart, for at most a minute; else fails saying WHAT.
wait_for() {
	what="$1"; shift
	i=0
	until "$@"; do
		i=$((i + 1))
		[ "$i" -le 600 ] || { echo "cluster.sh: $what" >&2; exit 1; }
		sleep 0.1
	done
}

# Starts `weft ROLE --config FILE` in the background and waits for its WEFT-READY line.
start() {
	role="$1"; name="$2"
	weft "$role" --config "$w/$name.toml" >"$w/$name.out" 2>"$w/$name.log" &
	wait_for "$name never became ready (its log: $(tail -n 20 "$w/$name.log" 2>/dev/null))" \
		grep -q "^WEFT-READY " "$w/$name.out"
	sed -n 's/^WEFT-READY //p' "$w/$name.out"
}

# The guest is a machine of its own: a fixed port for the metadata service's rdma side channel is free.
mds_rdma="rdma:127.0.0.1:7001"
# Every role proves the cluster key on every connection, over rdma too.
weft key new $w/cluster.key
cat >$w/meta.toml <<CFG
listen = "127.0.0.1:0"
rdma_listen = "$mds_rdma"
data_dir = "$w/meta"
key_file = "$w/cluster.key"
CFG
mds="$(start meta meta)"
echo "cluster.sh: metadata service at $mds and $mds_rdma"
# The client's configs: the MDS over tcp (status) and over rdma (everything else).
printf 'mds = "%s"\nkey_file = "%s"\n' "$mds" "$w/cluster.key" >$w/tcp.toml
printf 'mds = "%s"\nkey_file = "%s"\n' "$mds_rdma" "$w/cluster.key" >$w/rdma.toml
for n in 1 2; do
	cat >$w/d$n.toml <<CFG
id = $n
listen = "127.0.0.1:0"
root = "$w/d$n"
mds = "$mds"
shm = false
key_file = "$w/cluster.key"
CFG
	echo "cluster.sh: data server $n at $(start data d$n)"
done

# Both servers registered with the metadata service (heartbeats arrive every second).
both_up() { weft status --cluster $w/tcp.toml 2>/dev/null | grep -q "2 of 2 data servers up"; }
wait_for "the data servers never registered" both_up

dd if=/dev/urandom of=/tmp/in bs=1M count="$mib" 2>/dev/null
# Odd sizes too: a tail that is neither a stripe nor a page multiple takes every size class.
head -c 70001 /tmp/in >/tmp/in.odd
weft mkdir --cluster $w/rdma.toml --fabric rdma /d
weft setstripe --cluster $w/rdma.toml --fabric rdma --unit 256K --count 2 /d
for f in in in.odd; do
	weft put --cluster $w/rdma.toml --fabric rdma /tmp/$f /d/$f
	weft get --cluster $w/rdma.toml --fabric rdma /d/$f /tmp/$f.back
	a="$(md5sum </tmp/$f)"; b="$(md5sum </tmp/$f.back)"
	echo "cluster.sh: $f: sent $a, got back $b"
	[ "$a" = "$b" ] || { echo "cluster.sh: checksums differ for $f"; exit 1; }
done
# Every bulk byte went one-sided: each server's closed connections report bytes moved by RDMA READ and WRITE.
# (The client has exited, so its connections are closed and logged.)
grep -q "rdma connection up" $w/meta.log || { echo "cluster.sh: the client never reached the MDS over rdma"; exit 1; }
for n in 1 2; do
	grep "rdma connection closed\|zone registered\|bouncing" $w/d$n.log | sed "s/^/cluster.sh: d$n: /"
	grep "rdma connection closed" $w/d$n.log | grep -q "bytes_read=[1-9]" ||
		{ echo "cluster.sh: data server $n moved no bytes by RDMA READ"; exit 1; }
	grep "rdma connection closed" $w/d$n.log | grep -q "bytes_written=[1-9]" ||
		{ echo "cluster.sh: data server $n moved no bytes by RDMA WRITE"; exit 1; }
	# Its pool buffers are zones registered once: nothing went through the bounce copy.
	! grep "rdma connection closed" $w/d$n.log | grep -v -q "bytes_bounced=0$" ||
		{ echo "cluster.sh: data server $n bounced bytes through a copy"; exit 1; }
done
# A client killed mid-read: its connections must end on the servers (the side channel's end-of-file; an idle
# queue pair would never notice), releasing its queue pairs and registrations. `weft cat` writes into a FIFO
# whose reader never reads, so it stays alive with its connections open until it is killed.
count() { grep -c "rdma connection $1" "$w/d$2.log" || true; }
up1="$(count up 1)"; up2="$(count up 2)"; closed1="$(count closed 1)"; closed2="$(count closed 2)"
connected() { [ "$(count up 1)" -gt "$up1" ] && [ "$(count up 2)" -gt "$up2" ]; }
closed() { [ "$(count closed 1)" -gt "$closed1" ] && [ "$(count closed 2)" -gt "$closed2" ]; }
mkfifo /tmp/pipe
sleep 600 </tmp/pipe &
stuck_reader=$!
weft cat --cluster $w/rdma.toml --fabric rdma /d/in >/tmp/pipe &
victim=$!
wait_for "the victim never connected to both data servers" connected
kill -9 "$victim"
wait_for "a killed client's rdma connections were never closed" closed
kill "$stuck_reader" 2>/dev/null || true
echo "cluster.sh: a killed client's rdma connections were closed on both data servers"

# A client holding another key gets no queue pair: the side channel refuses it before anything is registered.
weft key new $w/wrong.key
printf 'mds = "%s"\nkey_file = "%s"\n' "$mds_rdma" "$w/wrong.key" >$w/wrong.toml
ups="$(grep -c "rdma connection up" $w/meta.log || true)"
if weft ls --cluster $w/wrong.toml --fabric rdma / >/tmp/wrong.out 2>&1; then
	echo "cluster.sh: a client with the wrong key listed the root over rdma"; exit 1
fi
refused() { grep -q "rdma connection refused: .*key" $w/meta.log; }
wait_for "the MDS never logged the wrong key's side-channel refusal" refused
[ "$(grep -c "rdma connection up" $w/meta.log || true)" = "$ups" ] ||
	{ echo "cluster.sh: the MDS made a queue pair for a client with the wrong key"; exit 1; }
grep "rdma connection refused" $w/meta.log | sed "s/^/cluster.sh: meta: /"
echo "cluster.sh: a client with the wrong key was refused on the side channel, no queue pair made"
echo "cluster.sh: the client said: $(tr "\n" " " </tmp/wrong.out | tail -c 400)"

echo "RDMA-CLUSTER: PASS bytes=$((mib * 1048576)) md5=$(md5sum </tmp/in | cut -d" " -f1)"
