#!/usr/bin/env bash
# Boot a throw-away Linux VM with a Soft-RoCE (rdma_rxe) device and the kernel NFS client, and run one test script
# inside it.
#
# Why a VM: this host has no RDMA device and its KVM cannot boot a stock kernel, so the harness boots Debian's own
# kernel under qemu TCG with a busybox initramfs. Everything comes from Debian's packages (apt-get download +
# dpkg -x into a cache under target/, never installed on the host), so the guest runs the same rdma-core and the
# same NFS client as a real deployment would. The guest's userspace for the NFS tests (tar, git, rsync, sqlite3,
# fio, setpriv, flock) is the host's, installed by `make deps`, copied with its libraries.
#
# usage: scripts/rdma-vm/run.sh [--timeout-s N] [--file HOST_PATH]... [--tree HOST_DIR]... [--control CMD]
#                               GUEST_SCRIPT [ARGS...]
#   --file     copies a host file (e.g. a test binary) into the guest's /bin; its shared libraries come along (ldd).
#   --tree     copies a host directory into the guest as /data/<its name> (test data, e.g. a source tree).
#   --control  the guest's control channel to the host: each TCP connection the guest opens to 10.0.2.100:5555
#              runs CMD on the host (qemu's guestfwd) with the connection as its stdin and stdout.
#   GUEST_SCRIPT runs with /bin/sh inside the guest after rxe0 is up; its exit status is the verdict.
# Prints the guest console; exits 0 only when the guest printed "RDMA-VM-RESULT: PASS".
# Environment: RDMA_VM_CACHE (default <repo>/target/rdma-vm), RDMA_VM_MEM_MB (default 1024), RDMA_VM_SMP (default 2),
# RDMA_VM_LOG (the console log, default $RDMA_VM_CACHE/console.log).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cache="${RDMA_VM_CACHE:-$repo/target/rdma-vm}"
mem_mb="${RDMA_VM_MEM_MB:-1024}"
smp="${RDMA_VM_SMP:-2}"
log="${RDMA_VM_LOG:-$cache/console.log}"
timeout_s=300
files=()
trees=()
control=""
while [ $# -gt 0 ]; do
	case "$1" in
	--timeout-s) timeout_s="$2"; shift 2 ;;
	--file) files+=("$2"); shift 2 ;;
	--tree) trees+=("$2"); shift 2 ;;
	--control) control="$2"; shift 2 ;;
	--) shift; break ;;
	-*) echo "run.sh: unknown option $1" >&2; exit 2 ;;
	*) break ;;
	esac
done
[ $# -ge 1 ] || { echo "usage: run.sh [--timeout-s N] [--file PATH]... [--tree DIR]... [--control CMD] GUEST_SCRIPT [ARGS...]" >&2; exit 2; }
guest_script="$1"; shift
guest_args=("$@")

export PATH="$PATH:/usr/sbin:/sbin" # depmod lives there
for tool in qemu-system-x86_64 cpio depmod gzip apt-get dpkg sha256sum; do
	command -v "$tool" >/dev/null || { echo "run.sh: $tool missing (make test-rdma installs it)" >&2; exit 2; }
done

# ---- 1. fetch: Debian packages into the cache (once) ----
root="$cache/root"
# librdmacm (NFS over RDMA's connection manager) came later: a cache fetched before it is fetched again.
if [ ! -e "$cache/.fetched" ] || [ ! -e "$root/usr/lib/x86_64-linux-gnu/librdmacm.so.1" ]; then
	rm -rf "$cache/debs" "$root"
	mkdir -p "$cache/debs" "$root"
	kernel_pkg="$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')"
	[ -n "$kernel_pkg" ] || { echo "run.sh: cannot resolve linux-image-amd64 (apt-get update?)" >&2; exit 2; }
	# The userspace: rdma-core (verbs + the rxe provider + the pingpong tools), its libnl, and iproute2's `rdma`.
	pkgs=("$kernel_pkg" busybox-static libibverbs1 librdmacm1 ibverbs-providers ibverbs-utils libnl-3-200 libnl-route-3-200
		iproute2 libmnl0 libelf1 libbpf1 libcap2 libbsd0 libmd0 zlib1g)
	echo "run.sh: fetching ${pkgs[*]}"
	# apt's sandbox user cannot write into root-owned dirs; download in a world-writable scratch dir.
	scratch="$(mktemp -d)"
	chmod 0777 "$scratch"
	(cd "$scratch" && apt-get download -q "${pkgs[@]}")
	mv "$scratch"/*.deb "$cache/debs/"
	rmdir "$scratch"
	for deb in "$cache"/debs/*.deb; do dpkg -x "$deb" "$root"; done
	touch "$cache/.fetched"
fi
kver="$(basename "$(ls -d "$root"/lib/modules/*/ | head -1)")"
kernel="$root/boot/vmlinuz-$kver"
[ -f "$kernel" ] || { echo "run.sh: no kernel in $root/boot" >&2; exit 2; }
[ -f "$root/lib/modules/$kver/modules.dep" ] || depmod -b "$root" "$kver"

# ---- 2. the initramfs: a cached base (kernel modules, busybox, tools, /init) + a small per-run overlay ----
# The kernel unpacks concatenated cpio archives in order, so the run's own files (the test script, --file
# binaries, --tree data) go in a second archive appended to the base, and the base is rebuilt only when its
# inputs change: this script, the unpacked packages, or a host tool or one of its libraries.
modules=(virtio_pci virtio_net crc32_generic ib_uverbs rdma_rxe
	ib_cm iw_cm rdma_cm rdma_ucm # RDMA CM, in the kernel and for librdmacm (NFS over RDMA connects with it)
	sunrpc grace lockd nfs_acl nfs nfsv3 nfsv4 # the kernel NFS client: v3 (with NFSACL) and v4.x
	nfs_layout_nfsv41_files # its pNFS file layout driver (pnfs.sh)
	rpcrdma) # the NFS client's RPC-over-RDMA transport (mount -o proto=rdma)
host_tools=(tar git rsync sqlite3 fio setpriv flock) # the NFS tests' userspace (make deps installs them)
libpath="$root/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu"
tool_paths=()
for t in "${host_tools[@]}"; do
	p="$(command -v "$t")" || { echo "run.sh: $t missing on the host (make deps installs it)" >&2; exit 2; }
	tool_paths+=("$(readlink -f "$p")")
done
# The base's key: this script, the fetch stamp, and every host tool and library it copies (path, size, mtime).
key="$({
	sha256sum <"$0" # the content, not the path it was called by
	stat -c '%n %s %Y' "$cache/.fetched"
	for p in "${tool_paths[@]}"; do
		stat -L -c '%n %s %Y' "$p"
		ldd "$p" | awk '/=> \// {print $3} /^\t\/[^ ]+ \(/ {print $1}' | xargs -r stat -L -c '%n %s %Y'
	done
} | sha256sum | cut -c1-16)"
base="$cache/base"

# copy_lib ROOT HOST_PATH: HOST_PATH into the tree ROOT at the same path minus the unpacked root's prefix, unless
# the base already has it.
copy_lib() {
	local into="$1" src="$2" dst="${2#"$root"}"
	[ -e "$base$dst" ] || [ -e "$into$dst" ] && return 0
	mkdir -p "$into$(dirname "$dst")"
	cp -L "$src" "$into$dst"
}
# copy_deps ROOT BINARY: every library ldd finds for BINARY (the unpacked packages first, then the host: same
# Debian) into ROOT.
copy_deps() {
	local into="$1" out
	out="$(LD_LIBRARY_PATH="$libpath" ldd "$2" 2>&1)" || true
	if grep -q "not found" <<<"$out"; then
		echo "run.sh: unresolved libraries for $2:" >&2; grep "not found" <<<"$out" >&2; exit 2
	fi
	awk '/=> \// {print $3} /^\t\/[^ ]+ \(/ {print $1}' <<<"$out" | while read -r lib; do copy_lib "$into" "$lib"; done
}
# add_bin ROOT BINARY: BINARY into ROOT/bin, with its libraries.
add_bin() {
	cp -L "$2" "$1/bin/$(basename "$2")"
	chmod 0755 "$1/bin/$(basename "$2")"
	copy_deps "$1" "$2"
}

build_base() {
	local work="$base.new"
	rm -rf "$work" "$base"
	mkdir -p "$work"/{bin,dev,proc,sys,tmp,mnt,etc/libibverbs.d,lib64,usr/lib/x86_64-linux-gnu/libibverbs}
	cp "$root/bin/busybox" "$work/bin/busybox"
	ln -s busybox "$work/bin/sh" # programs run commands with /bin/sh -c (git its helpers, sqlite3, fio)

	# Kernel modules in load order: a depth-first walk of modules.dep, dependencies before dependents.
	local moddir="$root/lib/modules/$kver"
	declare -A seen=()
	local order=()
	visit() {
		local mod="$1" line dep
		[ -n "${seen[$mod]:-}" ] && return 0
		seen[$mod]=1
		line="$(grep -E "(^|/)$mod\.ko(\.[a-z]+)?:" "$moddir/modules.dep" | head -1)" || {
			echo "run.sh: module $mod not in modules.dep" >&2; exit 2; }
		for dep in ${line#*:}; do
			dep="$(basename "$dep")"; visit "${dep%%.ko*}"
		done
		order+=("${line%%:*}")
	}
	for mod in "${modules[@]}"; do visit "$mod"; done
	: >"$work/modules.order"
	for path in "${order[@]}"; do
		mkdir -p "$work/lib/modules/$kver/$(dirname "$path")"
		cp "$moddir/$path" "$work/lib/modules/$kver/$path"
		echo "/lib/modules/$kver/$path" >>"$work/modules.order"
	done

	for tool in usr/bin/ibv_devices usr/bin/ibv_devinfo usr/bin/ibv_rc_pingpong usr/bin/rdma bin/rdma sbin/rdma; do
		[ -e "$root/$tool" ] && add_bin "$work" "$root/$tool"
	done
	[ -e "$work/bin/rdma" ] || { echo "run.sh: iproute2's rdma tool not found in the unpacked packages" >&2; exit 2; }
	# libibverbs is dlopen()ed by programs built with weft-fabric's `rdma` feature, so ldd cannot see it: add it
	# explicitly, and the rxe provider that libibverbs loads from its compiled-in directory.
	copy_lib "$work" "$root/usr/lib/x86_64-linux-gnu/libibverbs.so.1"
	copy_deps "$work" "$root/usr/lib/x86_64-linux-gnu/libibverbs.so.1"
	# librdmacm likewise (the NFS gateway's RDMA CM listener).
	copy_lib "$work" "$root/usr/lib/x86_64-linux-gnu/librdmacm.so.1"
	copy_deps "$work" "$root/usr/lib/x86_64-linux-gnu/librdmacm.so.1"
	local provider
	provider="$(ls "$root"/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so | head -1)"
	copy_lib "$work" "$provider"
	copy_deps "$work" "$provider"
	cp "$root/etc/libibverbs.d/rxe.driver" "$work/etc/libibverbs.d/"
	# The NFS tests' tools (GNU tar, git, …) shadow busybox's applets of the same name (see PATH in /init).
	# busybox's sh runs its own applets before PATH (a standalone shell): call those GNU tools by path, /bin/tar.
	for p in "${tool_paths[@]}"; do add_bin "$work" "$p"; done
	# git runs its helpers (upload-pack for a clone, …) from GIT_EXEC_PATH (/bin in the guest): they are git itself.
	for h in git-upload-pack git-receive-pack git-upload-archive; do ln -s git "$work/bin/$h"; done
	# Users for `setpriv --reuid` and for git's and sqlite's lookups of the current user.
	printf 'root:x:0:0:root:/tmp:/bin/sh\nuser:x:1000:1000:user:/tmp:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' \
		>"$work/etc/passwd"
	printf 'root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n' >"$work/etc/group"

	cat >"$work/init" <<'INIT'
#!/bin/busybox sh
# busybox's applets go to /bbin, after /bin in PATH: the copied GNU tools keep their names.
/bin/busybox mkdir /bbin
/bin/busybox --install -s /bbin
export PATH=/bin:/bbin LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu HOME=/tmp GIT_EXEC_PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
verdict() { echo "RDMA-VM-RESULT: $*"; sync; poweroff -f; }
for m in $(cat /modules.order); do insmod "$m" || verdict "FAIL insmod $m"; done
ip link set lo up
ip link set eth0 up || verdict "FAIL no eth0"
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
rdma link add rxe0 type rxe netdev eth0 || verdict "FAIL rdma link add"
rdma link show
ibv_devices
echo "RDMA-VM: running test"
cd /tmp
eval "set -- $(cat /test.args)"
sh /test.sh "$@"
rc=$?
if [ "$rc" -eq 0 ]; then verdict PASS; else verdict "FAIL rc=$rc"; fi
INIT
	chmod 0755 "$work/init"
	(cd "$work" && find . -print0 | cpio --null -o -H newc --quiet) | gzip -1 >"$work.cpio.gz"
	mv "$work.cpio.gz" "$cache/base.cpio.gz"
	mv "$work" "$base"
	echo "$key" >"$cache/base.key"
}
if [ "$(cat "$cache/base.key" 2>/dev/null)" != "$key" ] || [ ! -d "$base" ]; then
	echo "run.sh: building the base initramfs (key $key)"
	build_base
fi

# The run's overlay: the test script and its arguments, --file binaries (with libraries the base lacks), --tree data.
over="$cache/overlay"
rm -rf "$over"
mkdir -p "$over/bin" "$over/data"
for f in "${files[@]}"; do
	add_bin "$over" "$f"
	# Debug info only makes the initramfs (held in guest RAM) bigger.
	if command -v strip >/dev/null; then strip --strip-debug "$over/bin/$(basename "$f")"; fi
done
for d in "${trees[@]}"; do cp -a "$d" "$over/data/$(basename "$d")"; done
cp "$guest_script" "$over/test.sh"
: >"$over/test.args"
[ ${#guest_args[@]} -eq 0 ] || printf '%q ' "${guest_args[@]}" >"$over/test.args"
(cd "$over" && find . -print0 | cpio --null -o -H newc --quiet) | gzip -1 >"$cache/overlay.cpio.gz"
cat "$cache/base.cpio.gz" "$cache/overlay.cpio.gz" >"$cache/initrd.gz"

# ---- 3. boot (TCG: this host's KVM cannot boot a stock kernel) ----
netdev="user,id=n0"
[ -z "$control" ] || netdev="$netdev,guestfwd=tcp:10.0.2.100:5555-cmd:$control"
echo "run.sh: booting $kver with $(basename "$guest_script") (timeout ${timeout_s}s, console in $log)"
set +e
timeout --foreground -k 5 "$timeout_s" qemu-system-x86_64 -machine q35,accel=tcg -cpu max -m "$mem_mb" -smp "$smp" \
	-nographic -no-reboot -kernel "$kernel" -initrd "$cache/initrd.gz" \
	-append "console=ttyS0 panic=-1 quiet loglevel=4" \
	-netdev "$netdev" -device virtio-net-pci,netdev=n0 </dev/null 2>&1 | tee "$log"
qemu_rc=${PIPESTATUS[0]}
set -e
if grep -q "^RDMA-VM-RESULT: PASS" "$log"; then
	echo "run.sh: PASS"
	exit 0
fi
if [ "$qemu_rc" -eq 124 ]; then echo "run.sh: FAIL (timed out after ${timeout_s}s)" >&2; exit 1; fi
echo "run.sh: FAIL ($(grep -a "^RDMA-VM-RESULT:" "$log" | tr -d '\r' || echo "no verdict from the guest"))" >&2
exit 1
