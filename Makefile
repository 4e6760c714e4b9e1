# Weft developer entry points. `make test` is what CI runs (.ci/run).

SERVERS ?= 4
DATA_DIR ?= weft-data
MOUNT ?= weft-mnt
CARGO ?= cargo
# bash with pipefail, so a failing command piped into tee still fails the target.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c

.PHONY: up deps lint test bench bench-deps bench-mount clean-data

# up: build the release binary, start a local cluster (one MDS + $(SERVERS) data servers) in $(DATA_DIR) and
# mount it on $(MOUNT) (FUSE). Ctrl-C unmounts and stops everything.
up: deps
	$(CARGO) build --release -p weft
	mkdir -p $(MOUNT)
	./target/release/weft up --data-dir $(DATA_DIR) --servers $(SERVERS) --mount $(MOUNT)

# deps: install what a fresh Debian lacks (iperf3, pkg-config, fuse3 for the mount, and fio, dbench, rsync,
# sqlite3 which the mount's tests run; rustfmt and clippy), as root or with sudo.
deps:
	@set -eu; \
	sudo=""; [ "$$(id -u)" -eq 0 ] || sudo="sudo"; \
	missing=""; \
	command -v iperf3 >/dev/null 2>&1 || missing="$$missing iperf3"; \
	command -v pkg-config >/dev/null 2>&1 || missing="$$missing pkg-config"; \
	command -v fusermount3 >/dev/null 2>&1 || missing="$$missing fuse3"; \
	for tool in fio dbench rsync sqlite3; do \
		command -v $$tool >/dev/null 2>&1 || missing="$$missing $$tool"; \
	done; \
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
	$(CARGO) clippy --workspace --all-targets --features weft/fault-injection -- -D warnings

# test: everything CI checks, in order: lint, the whole test suite in release (the 1 GiB round trip needs it),
# then a short run of every fuzz target (FUZZ_SECONDS each, default 30). Stops at the first failure.
test: deps
	@echo "==================== lint ===================="
	@$(MAKE) --no-print-directory lint
	@echo "==================== cargo test (release, fault-injection) ===================="
	mkdir -p target
	$(CARGO) test --workspace --release --features weft/fault-injection 2>&1 | tee target/cargo-test.log
	@echo "==================== data tests again over tcp (the run above used shm: same host) ===================="
	WEFT_FABRIC=tcp $(CARGO) test -p weft --release --features weft/fault-injection --test data_path --test cli \
		--test concurrency --test exactly_once --test crash 2>&1 | tee -a target/cargo-test.log
	@echo "==================== fuzz smoke ===================="
	scripts/fuzz-smoke.sh
	@echo "==================== make test: all steps passed ===================="
	@awk '/^test result:/ {p += $$4; f += $$6} END {printf "tests: %d passed, %d failed\n", p, f}' target/cargo-test.log

# bench: throughput over 1, 2 and 4 data servers; results in docs/bench/throughput.json (+ an SVG beside it).
bench:
	mkdir -p docs/bench
	$(CARGO) run --release -p weft -- bench throughput --servers 1,2,4 --record 1M --size 2G --json docs/bench/throughput.json

# bench-deps: the peers `weft bench mount` compares with, from Debian's packages (libfuse's passthrough_ll is built
# from the example source in libfuse3-dev; GlusterFS from glusterfs-server).
bench-deps: deps
	@set -eu; \
	sudo=""; [ "$$(id -u)" -eq 0 ] || sudo="sudo"; \
	missing=""; \
	command -v gcc >/dev/null 2>&1 || missing="$$missing gcc"; \
	pkg-config --exists fuse3 2>/dev/null || missing="$$missing libfuse3-dev"; \
	command -v glusterd >/dev/null 2>&1 || missing="$$missing glusterfs-server"; \
	if [ -n "$$missing" ]; then \
		$$sudo apt-get update; \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing; \
	fi; \
	echo "bench-deps: ok"

# bench-mount: fio and a create/stat loop on Weft's FUSE mount, passthrough_ll and GlusterFS, in one run.
bench-mount: bench-deps
	mkdir -p docs/bench
	$(CARGO) run --release -p weft -- bench mount --json docs/bench/mount.json

# clean-data: remove the data directory `make up` uses.
clean-data:
	rm -rf $(DATA_DIR)
