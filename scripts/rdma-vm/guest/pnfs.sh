#!/bin/sh
# pNFS with the Linux kernel client (run by ../pnfs.sh, which starts a cluster of 4 data servers each serving NFS
# as a pNFS data server, advertised to this guest as 10.0.2.2:P, and a gateway with --pnfs on at 10.0.2.2:PORT).
# Mounts vers=4.1 over tcp, writes a file striped over the 4 data servers (directory /p: 64 KiB units, count 4),
# remounts with caches dropped, reads it back equal, and shows the mount's LAYOUTGET and GETDEVICEINFO counts
# (each must be > 0). Prints `pnfs.sh: ino=N` for the host's checks (every data server served READ and WRITE for
# it; the gateway moved none of its bytes). Then the recall step (below): `pnfs.sh: ... rino=N` names its file.
# Then the expiry step: a layout held past its handles' lifetime (TTL_S, the MDS's pnfs_handle_ttl_ms) is refused
# by the data servers (STALE) and the client must carry on through a fresh layout: `eino=N` names its file.
# usage: pnfs.sh PORT [MIB] [TTL_S]
set -eu
port="$1"
mib="${2:-4}"
ttl_s="${3:-20}"
fail() { echo >&2; echo "pnfs.sh: FAIL: $*" >&2; exit 1; }
md5() { md5sum <"$1" | cut -d' ' -f1; }
mnt=/mnt/pnfs
opts="vers=4.1,proto=tcp,port=$port,addr=10.0.2.2"
# op_count MOUNTPOINT OP: the number of OP calls in the mount's per-op statistics (0 if the line is missing).
op_count() {
	awk -v mp="$1" -v op="$2:" '$1 == "device" { on = ($5 == mp) } on && $1 == op { print $2; found = 1; exit }
		END { if (!found) print 0 }' /proc/self/mountstats
}
# show MOUNTPOINT: the pNFS lines of the mount's statistics, on the console.
show() {
	awk -v mp="$1" '$1 == "device" { on = ($5 == mp) } on && ($1 ~ /^(LAYOUT|GETDEVICE)/ || $1 == "READ:" || $1 == "WRITE:" || $0 ~ /pnfs/) { print "pnfs.sh: mountstats: " $0 }' \
		/proc/self/mountstats
}

# umount_settled MOUNTPOINT: umount, retried for up to 10 s: busybox's `timeout` leaves a watcher process holding
# its command's open files for up to a second after the command ended.
umount_settled() {
	i=0
	until umount "$1" 2>/dev/null; do
		i=$((i + 1))
		[ "$i" -le 20 ] || { umount "$1"; return 1; }
		sleep 0.5
	done
}

modprobe nfs_layout_nfsv41_files 2>/dev/null || true
mkdir -p "$mnt"
timeout 120 mount -t nfs4 -o "$opts" 10.0.2.2:/ "$mnt" || fail "mount -t nfs4 -o $opts 10.0.2.2:/ $mnt"
grep -q "pnfs=LAYOUT_NFSV4_1_FILES" /proc/self/mountstats ||
	{ grep -a "nfsv4:\|pnfs" /proc/self/mountstats | sed 's/^/pnfs.sh: /'; fail "the mount did not take the files layout driver"; }
echo "pnfs.sh: ok mounted $opts (pnfs=LAYOUT_NFSV4_1_FILES)"

dd if=/dev/urandom of=/tmp/src bs=1M count="$mib" 2>/dev/null
want="$(md5 /tmp/src)"
# The host made p/file empty. Linux asks for a file's first layout inside its OPEN (counted as OPEN), so the file
# is first held open for reading (a READ layout with that OPEN) and then written: the RW layout the write needs is
# a LAYOUTGET of its own.
exec 3<"$mnt/p/file" || fail "opening $mnt/p/file for reading"
dd if=/tmp/src of="$mnt/p/file" bs=1M conv=notrunc,fsync 2>/dev/null || fail "writing $mnt/p/file"
exec 3<&-
sync
ino="$(ls -i "$mnt/p/file" | awk '{print $1}')"
size="$(stat -c %s "$mnt/p/file")"
[ "$size" = $((mib * 1048576)) ] || fail "the size after the write is $size, not $((mib * 1048576))"
lg="$(op_count "$mnt" LAYOUTGET)"
lc="$(op_count "$mnt" LAYOUTCOMMIT)"
gdi1="$(op_count "$mnt" GETDEVICEINFO)"
show "$mnt"
[ "$lg" -gt 0 ] || fail "no LAYOUTGET after writing $mib MiB"
echo "pnfs.sh: ok wrote $mib MiB (md5 $want) ino=$ino: LAYOUTGET $lg, LAYOUTCOMMIT $lc, GETDEVICEINFO $gdi1"

umount "$mnt" || fail "umount $mnt"
echo 3 >/proc/sys/vm/drop_caches
timeout 120 mount -t nfs4 -o "$opts" 10.0.2.2:/ "$mnt" || fail "the second mount"
got="$(md5 "$mnt/p/file")" || fail "reading $mnt/p/file"
size="$(stat -c %s "$mnt/p/file")"
lg="$(op_count "$mnt" LAYOUTGET)"
gdi="$(op_count "$mnt" GETDEVICEINFO)"
show "$mnt"
[ "$got" = "$want" ] || fail "read back md5 $got (size $size), wrote $want"
# The read's layout comes with its OPEN (Linux's layoutget-on-open: no LAYOUTGET line moves); the host checks
# that every data server served READ bytes and the gateway none.
# The client caches a device while its NFS client lives: it may ask for it once, on the first mount.
[ $((gdi1 + gdi)) -gt 0 ] || fail "no GETDEVICEINFO on either mount"
echo "pnfs.sh: ok read back equal after a remount with caches dropped (md5 $got): LAYOUTGET $lg (the layout came with OPEN), GETDEVICEINFO $gdi"

# Recall: a second file, written here through pNFS, stays open (fd 3) with its layout held (part of it read
# through the data servers), and is truncated and rewritten through a second, non-pNFS path (a vers=3 mount of the
# same gateway). The gateway must recall the layout (CB_LAYOUTRECALL on this mount's back channel, answered: the
# host checks its log), and this mount must then read exactly the new bytes. Every step has a timeout: a callback
# the client cannot answer must not hang it.
rfile="$mnt/p/rfile"
timeout 60 dd if=/tmp/src of="$rfile" bs=1M conv=fsync 2>/dev/null || fail "writing $rfile"
rino="$(ls -i "$rfile" | awk '{print $1}')"
exec 3<"$rfile" || fail "opening $rfile"
timeout 60 dd bs=64k count=1 of=/dev/null <&3 2>/dev/null || fail "reading part of $rfile"
lr0="$(op_count "$mnt" LAYOUTRETURN)"
mkdir -p /mnt/v3
v3opts="vers=3,proto=tcp,port=$port,mountport=$port,mountproto=tcp,nolock,addr=10.0.2.2,mountaddr=10.0.2.2"
timeout 60 mount -t nfs -o "$v3opts" 10.0.2.2:/ /mnt/v3 || fail "mount -t nfs -o $v3opts 10.0.2.2:/ /mnt/v3"
dd if=/dev/urandom of=/tmp/new bs=64k count=$((mib * 8)) 2>/dev/null
new="$(md5 /tmp/new)"
timeout 60 truncate -s 0 /mnt/v3/p/rfile || fail "truncating $rfile through the vers=3 mount"
timeout 60 dd if=/tmp/new of=/mnt/v3/p/rfile bs=64k conv=notrunc,fsync 2>/dev/null || fail "rewriting through vers=3"
umount_settled /mnt/v3 || fail "umount /mnt/v3"
got="$(timeout 60 md5sum "$rfile" | cut -d' ' -f1)" || fail "reading $rfile after the recall"
rsize="$(stat -c %s "$rfile")"
exec 3<&-
lr="$(op_count "$mnt" LAYOUTRETURN)"
show "$mnt"
[ "$got" = "$new" ] || fail "after the truncate and rewrite elsewhere, read md5 $got (size $rsize), want $new"
echo "pnfs.sh: ok recall rino=$rino: read the new bytes after a truncate through vers=3 (md5 $got, size $rsize): LAYOUTRETURN $lr0 -> $lr"

# Expiry: a third file is held open (fd 4, so the client keeps its layout), half written through the data servers,
# and the rest written after the handles' lifetime has passed: the data servers answer STALE (the host checks
# their logs), the client sends that I/O through the gateway and takes a fresh layout, and every byte is right,
# read through the same mount and after a remount.
efile="$mnt/p/efile"
: >"$efile" || fail "creating $efile"
eino="$(ls -i "$efile" | awk '{print $1}')"
exec 4<"$efile" || fail "opening $efile"
half=$((mib * 8))
timeout 60 dd if=/tmp/src of="$efile" bs=64k count="$half" conv=notrunc,fsync 2>/dev/null || fail "writing $efile"
lg0="$(op_count "$mnt" LAYOUTGET)"
sleep $((ttl_s + 2))
timeout 120 dd if=/tmp/src of="$efile" bs=64k skip="$half" seek="$half" count="$half" conv=notrunc,fsync 2>/dev/null ||
	fail "writing the second half of $efile after its handles expired"
got="$(timeout 60 md5sum "$efile" | cut -d' ' -f1)" || fail "reading $efile after its handles expired"
exec 4<&-
lg1="$(op_count "$mnt" LAYOUTGET)"
if [ "$got" != "$want" ]; then
	# Where it differs, for the next person: its size, the first differing bytes, and how the mount routed I/O.
	echo "pnfs.sh: $efile size $(stat -c %s "$efile"); cmp: $(cmp /tmp/src "$efile" 2>&1 | head -n 3)" >&2
	show "$mnt"
	fail "after the handles expired, $efile reads md5 $got, want $want"
fi
umount_settled "$mnt" || fail "umount before the expiry step's reread"
echo 3 >/proc/sys/vm/drop_caches
timeout 120 mount -t nfs4 -o "$opts" 10.0.2.2:/ "$mnt" || fail "the expiry step's remount"
got="$(timeout 60 md5sum "$mnt/p/efile" | cut -d' ' -f1)" || fail "rereading $efile"
[ "$got" = "$want" ] || fail "after a remount, $efile reads md5 $got, want $want"
echo "pnfs.sh: ok expiry eino=$eino: written across the handles' lifetime ($ttl_s s), read back equal (md5 $got): LAYOUTGET $lg0 -> $lg1"
umount_settled "$mnt" || fail "the last umount"
echo "pnfs.sh: PASS ino=$ino rino=$rino eino=$eino bytes=$((mib * 1048576)) md5=$want"
