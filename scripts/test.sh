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

echo "==> cargo fmt --check"
cargo fmt --all --check

echo "==> cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

echo "==> cargo test"
export CI="${CI:-true}"   # insta: never write snapshots, fail on mismatch
export HAPWRIGHT_REQUIRE_BROWSER=1   # tests/browser.rs fails instead of skipping
cargo test --workspace
