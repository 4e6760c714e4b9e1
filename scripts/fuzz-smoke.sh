#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for a short while (FUZZ_SECONDS each, default 30; FUZZ_JOBS at once,
# default one per core): frame, layout, journal (the metadata journal decoder), stale (the stale-range records), …,
# found by `cargo fuzz list`.
# Installs the nightly toolchain and cargo-fuzz first when they are missing. Exits non-zero on a crash; the
# crashing input is left in fuzz/artifacts/TARGET/ (replay it with `cargo +nightly fuzz run TARGET FILE`). A stale
# fuzz/Cargo.lock fails before anything is built.
set -euo pipefail

FUZZ_SECONDS="${FUZZ_SECONDS:-30}"
cd "$(dirname "${BASH_SOURCE[0]}")/../fuzz"

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "fuzz-smoke: installing the nightly toolchain"
    rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz-smoke: installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

# cargo-fuzz has no --locked (rust-fuzz/cargo-fuzz#312): check the committed lock first, so a stale
# fuzz/Cargo.lock fails here instead of being rewritten by the builds below.
if ! cargo +nightly fetch --locked; then
    echo "fuzz-smoke: fuzz/Cargo.lock is stale; update it (cargo +nightly update -p CRATE in fuzz/) and commit it" >&2
    exit 1
fi

targets=$(cargo +nightly fuzz list)
if [ -z "$targets" ]; then
    echo "fuzz-smoke: no fuzz targets found" >&2
    exit 1
fi

mkdir -p target
# Build every target first (one cargo at a time), then run FUZZ_JOBS of them at once (default: one per core): each
# libFuzzer run is single-threaded, so on two cores two targets get their full FUZZ_SECONDS each in half the time.
echo "fuzz-smoke: building every target"
cargo +nightly fuzz build >target/smoke-build.log 2>&1 || { tail -n 60 target/smoke-build.log >&2; exit 1; }
FUZZ_JOBS="${FUZZ_JOBS:-$(nproc)}"

# Runs one target; prints its summary, or its log's tail and where the crashing input is, and fails.
run_one() {
    target="$1"
    mkdir -p "corpus/$target"
    if ! cargo +nightly fuzz run "$target" -- -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=2048 \
        >"target/smoke-$target.log" 2>&1; then
        tail -n 60 "target/smoke-$target.log" >&2
        echo "fuzz-smoke: $target FAILED; the input is in fuzz/artifacts/$target/" >&2
        return 1
    fi
    grep -E '^Done [0-9]+ runs' "target/smoke-$target.log" | sed "s/^/fuzz-smoke: $target: /"
}
export -f run_one
export FUZZ_SECONDS
echo "fuzz-smoke: $(echo "$targets" | wc -w) targets, ${FUZZ_SECONDS}s each, $FUZZ_JOBS at a time (logs: fuzz/target/smoke-TARGET.log)"
if ! echo "$targets" | xargs -n 1 -P "$FUZZ_JOBS" bash -c 'run_one "$1"' run_one; then
    echo "fuzz-smoke: a target failed (above)" >&2
    exit 1
fi
echo "fuzz-smoke: all targets ran ${FUZZ_SECONDS}s without a crash"
