#!/usr/bin/env bash
# The benchmark suite: writes docs/benchmarks.md (tables, targets, the machine, the
# commands) and docs/benchmarks.png. See docs/benchmarks.md for what each part measures.
#
#   scripts/bench.sh                  full run (roughly 30–45 minutes on 2 cores)
#   scripts/bench.sh --quick          smoke run: few samples, short criterion runs
#                                     (about 20 minutes, mostly building and running
#                                     the criterion benches)
#   scripts/bench.sh --skip-criterion reuse the criterion results already under
#                                     target/criterion/ (the report lists what ran)
#
# Sections (h) route propagation and (i) certificates at scale also run on their
# own, printing their sections (for a quick look; the report comes from full runs):
#   target/release/hapwright-benchsuite --route-propagation 100,1000 --haproxy-3.4 BIN
#   target/release/hapwright-benchsuite --certificates 1000,10000
#
# The hand-written "Analysis" section of docs/benchmarks.md (between the
# `analysis:begin` and `analysis:end` markers) is kept across runs; the figures it
# quotes between `figure` markers are filled in from each run.
# Run it on a quiet machine: other builds on the same cores skew every number.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
criterion=1
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1 ;;
    --skip-criterion) criterion=0 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg (see --help)" >&2; exit 2 ;;
  esac
done

# --- what the suite needs: HAProxy (phase 2 and the e2e scenarios), a font (chart) ---
font=/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf
missing=()
command -v haproxy >/dev/null 2>&1 || missing+=(haproxy)
[ -f "$font" ] || missing+=(fonts-dejavu-core)
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  echo "installing ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi

mkdir -p target
commands=target/bench-commands.txt
: > "$commands"
run() {
  echo "$*" >> "$commands"
  echo "+ $*" >&2
  "$@"
}

# A criterion bench that fails is recorded in the report's command list; the suite
# goes on (its section then shows "not run" or older results).
bench() {
  echo "$*" >> "$commands"
  echo "+ $*" >&2
  "$@" || echo "# ^ failed with exit code $? (results of an earlier run may be shown)" >> "$commands"
}

run cargo build --release -p hapwright-app -p hapwright-benchsuite

if [ "$criterion" -eq 1 ]; then
  # Only this run's results: a bench renamed or removed since an earlier run must not
  # leave its old numbers in the report.
  rm -rf target/criterion
  if [ "$quick" -eq 1 ]; then
    crit=(--warm-up-time 1 --measurement-time 1 --sample-size 10)
  else
    crit=(--warm-up-time 2 --measurement-time 5)
  fi
  bench cargo bench -p hapwright-eventbus --bench bus -- "${crit[@]}"
  bench cargo bench -p hapwright-watchers --bench files -- "${crit[@]}"
  bench cargo bench -p hapwright-watchers --bench kubernetes -- "${crit[@]}"
  bench cargo bench -p hapwright-reconciler --bench render -- "${crit[@]}"
  bench cargo bench -p hapwright-deployer --bench plan -- "${crit[@]}"
  bench cargo bench -p hapwright-deployer --bench deploy -- "${crit[@]}"
  bench cargo bench -p hapwright-deployer --bench validate -- "${crit[@]}"
  if [ -f crates/deployer/benches/fleet.rs ]; then
    bench cargo bench -p hapwright-deployer --bench fleet -- "${crit[@]}"
  fi
else
  echo "# criterion benches not rerun (--skip-criterion): results from earlier runs under target/criterion/" >> "$commands"
fi

suite=(target/release/hapwright-benchsuite --repo . --font "$font" --commands "$commands")
[ "$quick" -eq 1 ] && suite+=(--quick)
# Section (h) compares HAProxy 3.4 with dynamic backends against 3.4 without them and
# the haproxy on PATH: the 3.4 binary comes from Debian's experimental suite, beside
# the system's (scripts/haproxy-lines.sh). Without it, (h) has the PATH rows only.
echo "scripts/haproxy-lines.sh 3.4" >> "$commands"
if lines_output="$(scripts/haproxy-lines.sh 3.4)"; then
  newer="$(printf '%s\n' "$lines_output" | awk '$1 == "3.4" { print $2 }' | tail -n 1)"
  [ -n "$newer" ] && suite+=(--haproxy-3.4 "$newer/haproxy")
else
  echo "# ^ failed: section (h) runs without HAProxy 3.4" >> "$commands"
fi
echo "${suite[*]}" >> "$commands"
echo "+ ${suite[*]}" >&2
"${suite[@]}"
