#!/usr/bin/env bash
# The test command: installs what the tests need, then checks formatting, lints and
# runs the whole test suite. CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v haproxy >/dev/null 2>&1 || missing+=(haproxy)
# The webhook tests make their TLS certificates with the openssl command.
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
# Headless browser for tests/browser.rs (Debian's package; the test expects this path).
[ -x /usr/bin/chromium ] || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ]; then
    echo "==> installing ${missing[*]}"
    if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
    $sudo apt-get update
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends "${missing[@]}"
fi
echo "==> $(haproxy -v | head -n 1)"
# A clean run builds about 6.5 GB under target/ (dev profile: line tables only, no
# debug info for dependencies; see Cargo.toml). Say so up front when the disk is short.
target_dir="${CARGO_TARGET_DIR:-target}"
mkdir -p "$target_dir"
free_kb=$(df -Pk "$target_dir" | awk 'NR == 2 { print $4 }')
echo "==> $((free_kb / 1024 / 1024)) GiB free for $target_dir"
if [ "$free_kb" -lt $((8 * 1024 * 1024)) ]; then
    echo "warning: a clean test run needs about 8 GiB free under $target_dir" >&2
fi

echo "==> cargo fmt --check"
cargo fmt --all --check

echo "==> cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

# The container image test (tests/e2e_image.rs) runs the image scripts/image.sh builds.
# It is built here from the debug binary `cargo test` uses anyway: what the test checks
# (root file system, user, entry point, default config path, HAProxy inside) does not
# depend on the compile profile, and a release build would add 10+ minutes on 2 cores.
if [ "${HAPWRIGHT_SKIP_IMAGE:-}" = 1 ]; then
    echo "==> skipping the container image test (HAPWRIGHT_SKIP_IMAGE=1)"
else
    echo "==> container image (scripts/image.sh)"
    cargo build -p hapwright-app --bin hapwright
    if ! ./scripts/image.sh --binary "${CARGO_TARGET_DIR:-target}/debug/hapwright" \
        --tag localhost/hapwright:test; then
        echo "error: the container image could not be built or run on this machine (see above)." >&2
        echo "       tests/e2e_image.rs needs podman (as root) able to run containers;" >&2
        echo "       set HAPWRIGHT_SKIP_IMAGE=1 to run the other tests without it." >&2
        exit 1
    fi
    export HAPWRIGHT_TEST_IMAGE=localhost/hapwright:test
fi

echo "==> cargo test"
export CI="${CI:-true}"   # insta: never write snapshots, fail on mismatch
export HAPWRIGHT_REQUIRE_BROWSER=1   # tests/browser.rs fails instead of skipping
cargo test --workspace
