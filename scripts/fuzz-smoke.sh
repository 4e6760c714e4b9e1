#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for a short while (FUZZ_SECONDS each, default 30): frame, layout,
# journal (the metadata journal decoder), stale (the stale-range records), …, found by `cargo fuzz list`.
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
for target in $targets; do
    echo "fuzz-smoke: $target for ${FUZZ_SECONDS}s (log: fuzz/target/smoke-$target.log)"
    mkdir -p "corpus/$target"
    if ! cargo +nightly fuzz run "$target" -- -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=2048 \
        >"target/smoke-$target.log" 2>&1; then
        tail -n 60 "target/smoke-$target.log" >&2
        echo "fuzz-smoke: $target FAILED; the input is in fuzz/artifacts/$target/" >&2
        exit 1
    fi
    grep -E '^Done [0-9]+ runs' "target/smoke-$target.log" | sed "s/^/fuzz-smoke: $target: /"
done
echo "fuzz-smoke: all targets ran ${FUZZ_SECONDS}s without a crash"
