#!/usr/bin/env bash
# The main job on the built-in example: builds hapwright (release) and runs it in the
# foreground on examples/quickstart. hapwright starts and supervises its own HAProxy on
# 127.0.0.1:8080 and serves its status page on http://127.0.0.1:9400/.
# Stop it with Ctrl-C: it stops its HAProxy too.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v haproxy >/dev/null 2>&1; then
    echo "==> installing haproxy"
    if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
    $sudo apt-get update
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends haproxy
fi

echo "==> building hapwright (release; the first build takes several minutes on 2 cores)"
cargo build --release -p hapwright-app --bin hapwright

cat <<'TRY'
==> starting hapwright on examples/quickstart (Ctrl-C to stop)

Try, from another terminal:
    curl -H 'Host: web.example.test' http://127.0.0.1:8080/   # -> web v1 (port 9101)
    curl -H 'Host: api.example.test' http://127.0.0.1:8080/   # -> api (port 9201)
    open http://127.0.0.1:9400/                               # status page

Then change port 9101 to 9102 in examples/quickstart/resources/web.yaml and save:
the web route moves to "web v2" through HAProxy's runtime API, without a reload.

TRY
exec ./target/release/hapwright run -c examples/quickstart/hapwright.yaml
