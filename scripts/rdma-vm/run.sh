#!/usr/bin/env bash
# Boot a throw-away Linux VM with a Soft-RoCE (rdma_rxe) device and run one test script inside it.
#
# Why a VM: this host has no RDMA device and its KVM cannot boot a stock kernel, so the harness boots Debian's own
# kernel under qemu TCG with a busybox initramfs. Everything comes from Debian's packages (apt-get download +
# dpkg -x into a cache under target/, never installed on the host), so the guest runs the same rdma-core as a
# real deployment would.
#
# usage: scripts/rdma-vm/run.sh [--timeout-s N] [--file HOST_PATH]... GUEST_SCRIPT [ARGS...]
#   --file    copies a host file (e.g. a test binary) into the guest's /bin; its shared libraries come along (ldd).
#   GUEST_SCRIPT runs with /bin/sh inside the guest after rxe0 is up; its exit status is the verdict.
# Prints the guest console; exits 0 only when the guest printed "RDMA-VM-RESULT: PASS".
# Environment: RDMA_VM_CACHE (default <repo>/target/rdma-vm), RDMA_VM_MEM_MB (default 1024).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cache="${RDMA_VM_CACHE:-$repo/target/rdma-vm}"
mem_mb="${RDMA_VM_MEM_MB:-1024}"
timeout_s=300
files=()
while [ $# -gt 0 ]; do
	case "$1" in
	--timeout-s) timeout_s="$2"; shift 2 ;;
	--file) files+=("$2"); shift 2 ;;
	--) shift; break ;;
	-*) echo "run.sh: unknown option $1" >&2; exit 2 ;;
	*) break ;;
	esac
done
[ $# -ge 1 ] || { echo "usage: run.sh [--timeout-s N] [--file PATH]... GUEST_SCRIPT [ARGS...]" >&2; exit 2; }
guest_script="$1"; shift
guest_args=("$@")

export PATH="$PATH:/usr/sbin:/sbin" # depmod lives there
for tool in qemu-system-x86_64 cpio depmod gzip apt-get dpkg; do
	command -v "$tool" >/dev/null || { echo "run.sh: $tool missing (make test-rdma installs it)" >&2; exit 2; }
done

# ---- 1. fetch: Debian packages into the cache (once) ----
root="$cache/root"
if [ ! -e "$cache/.fetched" ]; then
	rm -rf "$cache/debs" "$root"
	mkdir -p "$cache/debs" "$root"
	kernel_pkg="$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')"
	[ -n "$kernel_pkg" ] || { echo "run.sh: cannot resolve linux-image-amd64 (apt-get update?)" >&2; exit 2; }
	# The userspace: rdma-core (verbs + the rxe provider + the pingpong tools), its libnl, and iproute2's `rdma`.
	pkgs=("$kernel_pkg" busybox-static libibverbs1 ibverbs-providers ibverbs-utils libnl-3-200 libnl-route-3-200
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

# ---- 2. the initramfs ----
work="$cache/initramfs"
rm -rf "$work"
mkdir -p "$work"/{bin,dev,proc,sys,tmp,etc/libibverbs.d,lib64,usr/lib/x86_64-linux-gnu/libibverbs}
cp "$root/bin/busybox" "$work/bin/busybox"

# Kernel modules in load order: a depth-first walk of modules.dep, dependencies before dependents.
moddir="$root/lib/modules/$kver"
declare -A seen=()
order=()
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
for mod in virtio_pci virtio_net crc32_generic ib_uverbs rdma_rxe; do visit "$mod"; done
: >"$work/modules.order"
for path in "${order[@]}"; do
	mkdir -p "$work/lib/modules/$kver/$(dirname "$path")"
	cp "$moddir/$path" "$work/lib/modules/$kver/$path"
	echo "/lib/modules/$kver/$path" >>"$work/modules.order"
done

# Binaries and libraries. Libraries resolve against the unpacked packages first, then the host (same Debian).
libpath="$root/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu"
copy_lib() { # host path -> the same path in the guest, with the unpacked root's prefix removed
	local src="$1" dst="${1#"$root"}"
	[ -e "$work$dst" ] && return 0
	mkdir -p "$work$(dirname "$dst")"
	cp -L "$src" "$work$dst"
}
copy_deps() {
	local out
	out="$(LD_LIBRARY_PATH="$libpath" ldd "$1" 2>&1)" || true
	if grep -q "not found" <<<"$out"; then
		echo "run.sh: unresolved libraries for $1:" >&2; grep "not found" <<<"$out" >&2; exit 2
	fi
	awk '/=> \// {print $3} /^\t\/[^ ]+ \(/ {print $1}' <<<"$out" | while read -r lib; do copy_lib "$lib"; done
}
add_bin() {
	cp -L "$1" "$work/bin/$(basename "$1")"
	chmod 0755 "$work/bin/$(basename "$1")"
	copy_deps "$1"
}
for tool in usr/bin/ibv_devices usr/bin/ibv_devinfo usr/bin/ibv_rc_pingpong usr/bin/rdma bin/rdma sbin/rdma; do
	[ -e "$root/$tool" ] && add_bin "$root/$tool"
done
[ -e "$work/bin/rdma" ] || { echo "run.sh: iproute2's rdma tool not found in the unpacked packages" >&2; exit 2; }
# libibverbs is dlopen()ed by programs built with weft-fabric's `rdma` feature, so ldd cannot see it: add it
# explicitly, and the rxe provider that libibverbs loads from its compiled-in directory.
copy_lib "$root/usr/lib/x86_64-linux-gnu/libibverbs.so.1"
copy_deps "$root/usr/lib/x86_64-linux-gnu/libibverbs.so.1"
provider="$(ls "$root"/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so | head -1)"
copy_lib "$provider"
copy_deps "$provider"
cp "$root/etc/libibverbs.d/rxe.driver" "$work/etc/libibverbs.d/"
for f in "${files[@]}"; do
	add_bin "$f"
	# Debug info only makes the initramfs (held in guest RAM) bigger.
	if command -v strip >/dev/null; then strip --strip-debug "$work/bin/$(basename "$f")"; fi
done
cp "$guest_script" "$work/test.sh"
: >"$work/test.args"
[ ${#guest_args[@]} -eq 0 ] || printf '%q ' "${guest_args[@]}" >"$work/test.args"

cat >"$work/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
verdict() { echo "RDMA-VM-RESULT: $*"; sync; poweroff -f; }
for m in $(cat /modules.order); do insmod "$m" || verdict "FAIL insmod $m"; done
ip link set lo up
ip link set eth0 up || verdict "FAIL no eth0"
ip addr add 10.0.2.15/24 dev eth0
rdma link add rxe0 type rxe netdev eth0 || verdict "FAIL rdma link add"
rdma link show
ibv_devices
echo "RDMA-VM: running test"
cd /tmp
eval "set -- $(cat /test.args)"
sh /test.sh "$@"
rc=$?
if [ "$rc" -eq 0 ]; then verdict PASS; else verdict "FAIL rc=$rc"; fi
EOF
chmod 0755 "$work/init"
(cd "$work" && find . -print0 | cpio --null -o -H newc --quiet) | gzip -1 >"$cache/initrd.gz"

# ---- 3. boot (TCG: this host's KVM cannot boot a stock kernel) ----
log="$cache/console.log"
echo "run.sh: booting $kver with $(basename "$guest_script") (timeout ${timeout_s}s, console in $log)"
set +e
timeout --foreground -k 5 "$timeout_s" qemu-system-x86_64 -machine q35,accel=tcg -cpu max -m "$mem_mb" -smp 2 \
	-nographic -no-reboot -kernel "$kernel" -initrd "$cache/initrd.gz" \
	-append "console=ttyS0 panic=-1 quiet loglevel=4" \
	-netdev user,id=n0 -device virtio-net-pci,netdev=n0 </dev/null 2>&1 | tee "$log"
qemu_rc=${PIPESTATUS[0]}
set -e
if grep -q "^RDMA-VM-RESULT: PASS" "$log"; then
	echo "run.sh: PASS"
	exit 0
fi
if [ "$qemu_rc" -eq 124 ]; then echo "run.sh: FAIL (timed out after ${timeout_s}s)" >&2; exit 1; fi
echo "run.sh: FAIL ($(grep -a "^RDMA-VM-RESULT:" "$log" | tr -d '\r' || echo "no verdict from the guest"))" >&2
exit 1
