#!/usr/bin/env bash
# Runs each fuzz target of fuzz/ (one per parser of outside input, fuzz/README.md)
# for a bounded time, starting from the committed seeds under fuzz/seeds/<target>/.
# New inputs the fuzzer finds go to a scratch directory, never into the seeds; a
# crash stops the run with the input under fuzz/artifacts/<target>/.
#   HAPWRIGHT_FUZZ_SECONDS   seconds per target (default 20; 0 skips fuzzing)
#   scripts/fuzz.sh [TARGET...]  only these targets
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${HAPWRIGHT_FUZZ_SECONDS:-20}"
if [ "$seconds" = 0 ]; then
    echo "==> fuzzing skipped (HAPWRIGHT_FUZZ_SECONDS=0)"
    exit 0
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "==> installing cargo-fuzz"
    cargo install cargo-fuzz --locked --version 0.13.2
fi
# cargo-fuzz passes the compiler a few unstable flags; the stable toolchain accepts
# them with RUSTC_BOOTSTRAP. No sanitizer: hapwright forbids `unsafe`, so what the
# fuzzer looks for is panics, endless loops and runaway memory.
export RUSTC_BOOTSTRAP=1
flags=(--sanitizer none)

if [ $# -gt 0 ]; then targets=("$@"); else mapfile -t targets < <(cargo fuzz list); fi
echo "==> cargo fuzz build (${#targets[@]} targets)"
cargo fuzz build "${flags[@]}"

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
for target in "${targets[@]}"; do
    seeds="fuzz/seeds/$target"
    [ -d "$seeds" ] || { echo "error: no seeds for $target ($seeds)" >&2; exit 1; }
    mkdir -p "$scratch/$target"
    echo "==> fuzzing $target for ${seconds} s"
    # -timeout: one input over 10 s is a hang; -rss_limit_mb: runaway memory.
    if ! cargo fuzz run "${flags[@]}" "$target" "$scratch/$target" "$seeds" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
        -print_final_stats=1 >"$scratch/$target.log" 2>&1; then
        tail -n 60 "$scratch/$target.log" >&2
        echo "error: fuzz target $target failed; the input is under fuzz/artifacts/$target/" >&2
        exit 1
    fi
    grep -E '^stat::number_of_executed_units|^Done' "$scratch/$target.log" | tail -n 2
done
