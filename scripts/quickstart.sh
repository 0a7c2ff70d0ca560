#!/usr/bin/env bash
# The main job on the built-in example. For now: build hapwright in release mode and
# show its version; the quickstart demo (managed HAProxy routing live) grows here.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release -p hapwright-app --bin hapwright
exec ./target/release/hapwright version
