#!/bin/sh
# NFS over RDMA inside the VM: a Weft cluster (a metadata service and two data servers, each also a pNFS data
# server over tcp and over RPC-over-RDMA on rxe0: `nfs_rdma_listen = "10.0.2.15:2005N"`) and a `weft nfs` gateway
# with `--rdma-listen 10.0.2.15:20049 --pnfs on`; the Linux kernel client mounts it with `proto=rdma,port=20049`,
# first vers=3 (through the gateway), then vers=4.1 (pNFS: the file's stripes go to the data servers over RDMA).
# Each time a file is written, the mount dropped (umount, drop_caches), mounted again and the file read back with
# an equal md5. Then the gateway's closed RDMA connections must report bytes moved by RDMA READ (the WRITEs' read
# chunks) and by RDMA WRITE (the READs' write chunks); for vers=4.1 the mount's stats must show LAYOUTGET, and
# every data server's closed RDMA connections bytes moved by RDMA READ and WRITE with no bounce copy
# (`bounce_copy_bytes=0`: READs are read into its registered buffer zones). In between, a rogue client offers
# chunks it does not own or that are too small: refused, and the gateway keeps serving.
# usage: nfs-rdma.sh [MIB]   (file size, default 4)
set -e
mib="${1:-4}"
export RUST_LOG=info
w=/tmp/weft
ip=10.0.2.15
mkdir -p $w/meta $w/d1 $w/d2 /mnt/v3 /mnt/v41
fail() {
	echo "nfs-rdma.sh: FAIL: $*"
	echo "---- gateway log (last 40 lines)"; tail -n 40 $w/nfs.log
	for n in 1 2; do echo "---- data server $n log (last 15 lines)"; tail -n 15 $w/d$n.log; done
	echo "---- kernel log (last 20 lines)"; dmesg | tail -n 20
	exit 1
}

# wait_for WHAT CMD...: runs CMD until it succeeds, 0.1 s apart, for at most two minutes (TCG is slow).
wait_for() {
	what="$1"; shift
	i=0
	until "$@"; do
		i=$((i + 1))
		[ "$i" -le 1200 ] || fail "$what"
		sleep 0.1
	done
}
start() {
	role="$1"; name="$2"
	weft "$role" --config "$w/$name.toml" >"$w/$name.out" 2>"$w/$name.log" &
	wait_for "$name never became ready" grep -q "^WEFT-READY " "$w/$name.out"
	sed -n 's/^WEFT-READY //p' "$w/$name.out"
}

weft key new $w/cluster.key
printf 'listen = "127.0.0.1:0"\ndata_dir = "%s"\nkey_file = "%s"\n' "$w/meta" "$w/cluster.key" >$w/meta.toml
mds="$(start meta meta)"
printf 'mds = "%s"\nkey_file = "%s"\n' "$mds" "$w/cluster.key" >$w/tcp.toml
for n in 1 2; do
	printf 'id = %s\nlisten = "127.0.0.1:0"\nroot = "%s"\nmds = "%s"\nshm = false\nkey_file = "%s"\n' \
		"$n" "$w/d$n" "$mds" "$w/cluster.key" >$w/d$n.toml
	printf 'nfs_listen = ["%s:0"]\nnfs_rdma_listen = "%s:%s"\n' "$ip" "$ip" "$((20049 + n))" >>$w/d$n.toml
	echo "nfs-rdma.sh: data server $n at $(start data d$n)"
	grep -q "NFS over RDMA (RPC-over-RDMA v1) listening" $w/d$n.log || fail "data server $n does not listen on rdma"
done
both_up() { weft status --cluster $w/tcp.toml 2>/dev/null | grep -q "2 of 2 data servers up"; }
wait_for "the data servers never registered" both_up
weft setstripe --cluster $w/tcp.toml --unit 256K --count 2 /

# A state directory, as a deployment has one: a first start has no clients to wait for, so no grace period (without
# one, every OPEN waited out the 90 s default).
mkdir -p $w/nfs-state
weft nfs --cluster $w/tcp.toml --listen $ip:2049 --allow 10.0.0.0/8,127.0.0.0/8 --no-root-squash \
	--rdma-listen $ip:20049 --pnfs on --state-dir $w/nfs-state >$w/nfs.out 2>$w/nfs.log &
wait_for "the gateway never became ready" grep -q "^WEFT-READY " $w/nfs.out
grep -q "NFS over RDMA (RPC-over-RDMA v1) listening" $w/nfs.log || fail "the gateway does not listen on rdma"
echo "nfs-rdma.sh: gateway on $ip:2049 (tcp) and $ip:20049 (rdma)"

dd if=/dev/urandom of=/tmp/in bs=1M count="$mib" 2>/dev/null
want="$(md5sum </tmp/in | cut -d' ' -f1)"

# roundtrip NAME MOUNT-ARGS...: mount, write, umount, drop caches, mount, read back, umount.
roundtrip() {
	name="$1"; shift
	mount "$@" || fail "$name: mount $*"
	grep " /mnt/$name " /proc/mounts | grep -q "proto=rdma" || fail "$name: not mounted over rdma: $(grep " /mnt/$name " /proc/mounts)"
	echo "nfs-rdma.sh: $name mounted: $(grep " /mnt/$name " /proc/mounts)"
	timeout 300 cp /tmp/in /mnt/$name/f.$name || fail "$name: writing the file"
	sync
	awk -v mp="/mnt/$name" '$1 == "device" { on = ($5 == mp) } on' /proc/self/mountstats >$w/mountstats.$name.write
	umount /mnt/$name || fail "$name: umount"
	echo 3 >/proc/sys/vm/drop_caches
	mount "$@" || fail "$name: mount again"
	got="$(timeout 300 md5sum </mnt/$name/f.$name | cut -d' ' -f1)"
	if [ "$got" != "$want" ]; then
		timeout 300 cat /mnt/$name/f.$name >/tmp/back.$name || echo "nfs-rdma.sh: $name: reading the file failed"
		echo "nfs-rdma.sh: $name: read back $(wc -c </tmp/back.$name) bytes; first difference: $(cmp /tmp/in /tmp/back.$name 2>&1 | head -1)"
		echo "nfs-rdma.sh: $name: wrote: $(od -A d -t x1 -N 24 /tmp/in | head -2 | tr '\n' ' ')"
		echo "nfs-rdma.sh: $name: read:  $(od -A d -t x1 -N 24 /tmp/back.$name | head -2 | tr '\n' ' ')"
		echo "nfs-rdma.sh: $name: 4 KiB in: $(od -A d -t x1 -j 4096 -N 16 /tmp/back.$name | head -1)"
		for off in 4 8 12 16 100 112 116 120 124 128; do
			cmp -s -n 4096 -i "$off:0" /tmp/in /tmp/back.$name && echo "nfs-rdma.sh: $name: read-back is the file shifted by $off"
			cmp -s -n 4096 -i "0:$off" /tmp/in /tmp/back.$name && echo "nfs-rdma.sh: $name: read-back is the file shifted by -$off"
		done
		umount /mnt/$name; grep "connection closed" $w/nfs.log | tail -3
		mkdir -p /mnt/tcp
		mount -t nfs -o "vers=3,proto=tcp,port=2049,mountport=2049,mountproto=tcp,nolock,addr=$ip,mountaddr=$ip" $ip:/ /mnt/tcp &&
			echo "nfs-rdma.sh: $name: over tcp the file reads $(md5sum </mnt/tcp/f.$name | cut -d' ' -f1); $(cmp /tmp/in /mnt/tcp/f.$name 2>&1 | head -1)"
	fi
	awk -v mp="/mnt/$name" '$1 == "device" { on = ($5 == mp) } on' /proc/self/mountstats >$w/mountstats.$name
	umount /mnt/$name || fail "$name: umount after reading"
	echo "nfs-rdma.sh: $name: wrote $want, read back $got"
	[ "$got" = "$want" ] || fail "$name: the file read back differs"
}
roundtrip v3 -t nfs -o "vers=3,proto=rdma,port=20049,mountport=2049,mountproto=tcp,nolock,addr=$ip,mountaddr=$ip" \
	$ip:/ /mnt/v3
# A rogue client (weft-nfs/examples/rdma_rogue.rs): a write chunk too small is refused with ERR_CHUNK and nothing
# written, a bogus handle ends only its own connection, and a proper READ on a new connection still works; the
# v4.1 mount below proves the gateway kept serving the kernel client too.
rdma_rogue $ip:20049 f.v3 /tmp/in || fail "the rogue client's checks"

modprobe nfs_layout_nfsv41_files 2>/dev/null || true
roundtrip v41 -t nfs4 -o "vers=4.1,proto=rdma,port=20049,addr=$ip" $ip:/ /mnt/v41
grep -q "pnfs=LAYOUT_NFSV4_1_FILES" $w/mountstats.v41 || fail "v41: the mount did not take the files layout driver"
# Linux gets a layout inside OPEN when it can (counted as OPEN); a write through a file already open for reading
# asks LAYOUTGET for a read-write layout on its own, as the tcp pNFS test (pnfs.sh) does: rewritten that way.
mount -t nfs4 -o "vers=4.1,proto=rdma,port=20049,addr=$ip" $ip:/ /mnt/v41 || fail "v41: the third mount"
exec 3</mnt/v41/f.v41 || fail "v41: opening the file for reading"
dd if=/tmp/in of=/mnt/v41/f.v41 bs=1M conv=notrunc,fsync 2>/dev/null || fail "v41: rewriting the file"
exec 3<&-
got="$(timeout 300 md5sum </mnt/v41/f.v41 | cut -d' ' -f1)"
awk -v mp="/mnt/v41" '$1 == "device" { on = ($5 == mp) } on' /proc/self/mountstats >$w/mountstats.v41.rewrite
umount /mnt/v41 || fail "v41: the third umount"
[ "$got" = "$want" ] || fail "v41: after the rewrite the file reads $got, not $want"
for f in write read rewrite; do
	m=$w/mountstats.v41.$f; [ $f != read ] || m=$w/mountstats.v41
	echo "nfs-rdma.sh: v41 $f: mountstats: $(awk '$1 ~ /^(LAYOUTGET|GETDEVICEINFO|LAYOUTCOMMIT|OPEN|READ|WRITE):$/ { printf "%s %s; ", $1, $2 }' $m)"
done
count() { awk -v op="$1:" '$1 == op { n += $2 } END { print n + 0 }' $w/mountstats.v41.write $w/mountstats.v41 $w/mountstats.v41.rewrite; }
[ "$(count LAYOUTGET)" -gt 0 ] || fail "v41: no LAYOUTGET in the mount's stats"
[ "$(count GETDEVICEINFO)" -gt 0 ] || fail "v41: no GETDEVICEINFO in the mount's stats"
for n in 1 2; do
	# The RDMA connections close when the client lets go of the data server (after the umounts): waited for.
	ds_moved() {
		grep "rpc-over-rdma connection closed" $w/d$n.log | grep -q "rdma_read_bytes=[1-9]" &&
			grep "rpc-over-rdma connection closed" $w/d$n.log | grep -q "rdma_write_bytes=[1-9]"
	}
	wait_for "data server $n: no closed rdma connection moved bytes by RDMA READ (the pNFS WRITEs) and RDMA WRITE (the READs)" ds_moved
	grep "rpc-over-rdma connection closed\|pnfs ds: served" $w/d$n.log | sed "s/^/nfs-rdma.sh: data server $n: /"
	grep "rpc-over-rdma connection closed" $w/d$n.log | grep -v -q "bounce_copy_bytes=0" &&
		fail "data server $n: bytes bounce-copied"
	grep -q "pnfs ds: served READ [1-9]" $w/d$n.log || fail "data server $n: served no pNFS READ bytes"
	grep -q "pnfs ds: served READ [0-9]* bytes, WRITE [1-9]" $w/d$n.log || fail "data server $n: served no pNFS WRITE bytes"
done

closed() { grep -q "rpc-over-rdma connection closed" $w/nfs.log; }
wait_for "the gateway logged no closed rdma connection" closed
grep "rpc-over-rdma connection closed" $w/nfs.log | sed "s/^/nfs-rdma.sh: gateway: /"
grep "rpc-over-rdma connection closed" $w/nfs.log | grep -q "rdma_read_bytes=[1-9]" ||
	fail "no bytes moved by RDMA READ (read chunks)"
grep "rpc-over-rdma connection closed" $w/nfs.log | grep -q "rdma_write_bytes=[1-9]" ||
	fail "no bytes moved by RDMA WRITE (write chunks)"
echo "RDMA-NFS: PASS bytes=$((mib * 1048576)) md5=$want"
