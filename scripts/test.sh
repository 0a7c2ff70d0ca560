#!/usr/bin/env bash
# The test command: installs what the tests need, then checks formatting, lints and
# runs the whole test suite on the system's HAProxy (2.6), then the test files that
# start a real HAProxy on HAProxy 3.0, 3.2 and 3.4 (scripts/haproxy-lines.sh), then
# fuzzes every parser of outside input for a bounded time (scripts/fuzz.sh). CI runs
# exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v haproxy >/dev/null 2>&1 || missing+=(haproxy)
# The webhook tests make their TLS certificates with the openssl command.
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
# Headless browser for tests/browser.rs (Debian's package; the test expects this path).
[ -x /usr/bin/chromium ] || missing+=(chromium)
# promtool (Debian's prometheus package) checks and unit-tests the alert rules of
# deploy/monitoring/ (tests/deploy_manifests.rs).
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
if [ ${#missing[@]} -gt 0 ]; then
    echo "==> installing ${missing[*]}"
    if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
    $sudo apt-get update
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends "${missing[@]}"
fi
echo "==> $(haproxy -v | head -n 1)"
# kubernetes-validate (PyPI; it bundles the Kubernetes schemas, so it works offline)
# validates every manifest of deploy/ (tests/deploy_manifests.rs).
if ! command -v kubernetes-validate >/dev/null 2>&1; then
    echo "==> installing kubernetes-validate"
    python3 -m pip install --quiet kubernetes-validate==1.37.0
fi

# The other supported HAProxy lines, from Debian's suites, side by side with the
# system's 2.6 (docs/haproxy-versions.md). Installed first, so a failed download stops
# the run before the long part; a second run finds them in place.
# HAPWRIGHT_HAPROXY_LINES="3.4" tests only that line on top of 2.6; "" none.
read -r -a haproxy_lines <<<"${HAPWRIGHT_HAPROXY_LINES-3.0 3.2 3.4}"
declare -A haproxy_line_dir=()
if [ ${#haproxy_lines[@]} -gt 0 ]; then
    echo "==> HAProxy ${haproxy_lines[*]} (scripts/haproxy-lines.sh)"
    lines_output="$(./scripts/haproxy-lines.sh "${haproxy_lines[@]}")"
    echo "$lines_output"
    # Its last lines are "<line> <directory of the haproxy binary> <version>".
    while read -r line dir version; do
        [ -n "$version" ] && [ -x "$dir/haproxy" ] && haproxy_line_dir[$line]="$dir"
    done < <(grep -E '^[0-9]+\.[0-9]+ /' <<<"$lines_output")
fi
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
# It is built here, the default image (Debian trixie, HAProxy 3.0), from the debug
# binary `cargo test` uses anyway: what the test checks (root file system, user, entry
# point, default config path, the HAProxy line inside) does not depend on the compile
# profile, and a release build would add 10+ minutes on 2 cores.
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
suite_start=$SECONDS
cargo test --workspace
echo "==> whole suite on HAProxy $(haproxy -v | awk 'NR == 1 { print $3 }'): $((SECONDS - suite_start)) s"

# Then every test file that starts a real HAProxy (or runs `haproxy -c`) again on each
# other line, with that line's binary first on PATH: hapwright and the test harnesses
# run `haproxy` from PATH. Left out: e2e_image (the container image brings its own
# HAProxy) and browser (the status page in a browser; HAProxy plays no part in it).
line_tests=(
    # crates/deployer: socket and managed drivers against real HAProxy processes,
    # reload confirmation, runtime changes, faults, fleets; `haproxy -c`.
    certificate_equivalence deploy_faults deployment_deadline equivalence files fleet lossless_runtime managed
    managed_leftovers managed_restart reload_confirmation runtime_certificates runtime_errors
    socket_reload socket_runtime validator
    # Dynamic backends: runtime changes on 3.4, the reload fallback on older lines.
    dynamic_backends dynamic_backends_differential dynamic_backends_equivalence
    # `hapwright plan`: its verdict against what the socket driver then does, and the
    # command on real files with `haproxy -c`.
    plan_differential plan_command
    # crates/reconciler: random values escaped for where they land, read back by HAProxy.
    escaping
    # tests/: the hapwright binary with managed HAProxy.
    e2e_config e2e_crash e2e_fleet e2e_http_source e2e_lifecycle e2e_logs e2e_quarantine
    e2e_routing e2e_safety e2e_secrets e2e_status e2e_traces e2e_webhook
    # tests/: the template libraries with a sidecar HAProxy: routing, tenants, injection.
    gateway_library gateway_tenants gateway_injection
    ingress_library ingress_tenants ingress_injection ingress_nginx_library
    # tests/: both libraries' new routes without a reload on 3.4 (a reload elsewhere).
    library_dynamic_backends
)
if [ ${#haproxy_lines[@]} -gt 0 ]; then
    # The test executables `cargo test --workspace` just built, run as they are (from
    # their package's directory, as cargo runs them): a `cargo test -p …` here could
    # resolve features differently and build again.
    artifacts="$(cargo test --workspace --no-run --message-format=json)"
    failed_lines=()
    for line in "${haproxy_lines[@]}"; do
        dir="${haproxy_line_dir[$line]:-}"
        if [ -z "$dir" ]; then
            echo "error: HAProxy $line was not installed (see scripts/haproxy-lines.sh above)" >&2
            exit 1
        fi
        echo "==> HAProxy $line: $("$dir/haproxy" -v | head -n 1)"
        line_start=$SECONDS
        for name in "${line_tests[@]}"; do
            artifact="$(grep '"kind":\["test"\]' <<<"$artifacts" | grep -F "\"name\":\"$name\"" || true)"
            executable="$(sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' <<<"$artifact")"
            manifest="$(sed -n 's/.*"manifest_path":"\([^"]*\)".*/\1/p' <<<"$artifact")"
            if [ -z "$executable" ] || [ -z "$manifest" ]; then
                echo "error: no test executable named $name (scripts/test.sh lists it)" >&2
                exit 1
            fi
            echo "    $name"
            if ! (cd "$(dirname "$manifest")" && PATH="$dir:$PATH" "$executable" -q); then
                failed_lines+=("HAProxy $line: $name")
            fi
        done
        echo "==> HAProxy $line: ${#line_tests[@]} test files in $((SECONDS - line_start)) s"
    done
    if [ ${#failed_lines[@]} -gt 0 ]; then
        echo "error: test files failed on other HAProxy lines:" >&2
        printf '  %s\n' "${failed_lines[@]}" >&2
        exit 1
    fi
fi

# Every parser of outside input fuzzed for a bounded time from the committed seeds
# (fuzz/README.md; HAPWRIGHT_FUZZ_SECONDS per target, 0 skips).
fuzz_start=$SECONDS
./scripts/fuzz.sh
echo "==> fuzzing: $((SECONDS - fuzz_start)) s"
