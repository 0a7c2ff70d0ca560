#!/usr/bin/env bash
# Builds the hapwright container image with nothing but Debian's package archive and
# crates.io (no image registry): a Debian root filesystem holding Debian's haproxy
# package and CA certificates, made by mmdebstrap, plus the hapwright release binary,
# imported into podman as an image with the same user, entry point, default config
# path and labels as the Containerfile's. deploy/ runs the image under the default name.
#
#   scripts/image.sh [--haproxy-line LINE] [--binary PATH] [--tag NAME]
#
#   --haproxy-line LINE  the HAProxy line in the image (default 3.0), from the Debian
#                  suite that ships it (docs/haproxy-versions.md):
#                    2.6  Debian bookworm
#                    3.0  Debian trixie (stable), the default
#                    3.2  Debian sid (unstable)
#                    3.4  Debian sid, haproxy alone from experimental (pinned)
#   --binary PATH  put this hapwright binary in the image instead of building the
#                  release binary (`cargo build --release --locked --bin hapwright`)
#   --tag NAME     image name (default: ghcr.io/hapwright/hapwright:<version>, the
#                  name deploy/ uses, for 3.0; <version>-haproxy<LINE> for the others)
#
# Environment: DEBIAN_MIRROR (default http://deb.debian.org/debian) and
# DEBIAN_SECURITY_MIRROR (default http://deb.debian.org/debian-security).
#
# Installs mmdebstrap, podman and runc when missing and configures podman for this
# kind of machine (runc as runtime, no default ulimits or pids limit) through
# /etc/containers/containers.conf.d/50-hapwright.conf. Runs as root (or with sudo).
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
tag=""
binary=""
line=3.0
while [ $# -gt 0 ]; do
    case "$1" in
        --haproxy-line) line="$2"; shift 2 ;;
        --binary) binary="$2"; shift 2 ;;
        --tag) tag="$2"; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "image.sh: unknown argument \`$1\` (see --help)" >&2; exit 2 ;;
    esac
done

# The Debian suite of the root file system, and the suite haproxy alone comes from
# when that is another one. 3.2 and 3.4 are built against sid's libraries (their
# haproxy needs libpcre2-8-0 >= 10.47; trixie has 10.46), so they cannot sit on
# trixie: their base is sid, and 3.4's haproxy comes from experimental, pinned for
# haproxy alone (experimental is meant to be used on top of sid).
case "$line" in
    2.6) suite=bookworm; haproxy_suite="" ;;
    3.0) suite=trixie; haproxy_suite="" ;;
    3.2) suite=sid; haproxy_suite="" ;;
    3.4) suite=sid; haproxy_suite=experimental ;;
    *) echo "image.sh: unknown HAProxy line \`$line\` (known: 2.6 3.0 3.2 3.4)" >&2; exit 2 ;;
esac
if [ -z "$tag" ]; then
    if [ "$line" = 3.0 ]; then
        tag="ghcr.io/hapwright/hapwright:${version}"
    else
        tag="ghcr.io/hapwright/hapwright:${version}-haproxy${line}"
    fi
fi

if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi

# --- tools ---
missing=()
command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
command -v podman >/dev/null 2>&1 || missing+=(podman)
command -v runc >/dev/null 2>&1 || [ -x /usr/sbin/runc ] || missing+=(runc)
if [ ${#missing[@]} -gt 0 ]; then
    echo "==> installing ${missing[*]}"
    $sudo apt-get update
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends "${missing[@]}"
fi

# crun (podman's default) refuses this machine's hybrid cgroup layout, and runc fails
# on setrlimit unless podman leaves ulimits and the pids limit alone. A drop-in file
# keeps any containers.conf the machine already has; rewriting it is idempotent.
conf_dir=/etc/containers/containers.conf.d
conf_file="$conf_dir/50-hapwright.conf"
wanted='# Written by hapwright scripts/image.sh: runc, and no ulimits or pids limit that
# this kind of machine refuses to set.
[containers]
default_ulimits = []
pids_limit = 0

[engine]
runtime = "runc"'
if [ "$(cat "$conf_file" 2>/dev/null)" != "$wanted" ]; then
    echo "==> configuring podman ($conf_file)"
    $sudo mkdir -p "$conf_dir"
    printf '%s\n' "$wanted" | $sudo tee "$conf_file" >/dev/null
fi

# --- binary ---
if [ -z "$binary" ]; then
    echo "==> building hapwright (release; the first build takes several minutes on 2 cores)"
    cargo build --release --locked --bin hapwright
    binary="${CARGO_TARGET_DIR:-target}/release/hapwright"
fi
if [ ! -x "$binary" ]; then
    echo "image.sh: $binary is not an executable file" >&2
    exit 1
fi

# --- root file system ---
work=$(mktemp -d /tmp/hapwright-image.XXXXXX)
trap '$sudo rm -rf "$work"' EXIT
# Under its name in the image, whatever the file given was called.
cp "$binary" "$work/hapwright"
# A debug build's symbols would make the image hundreds of MB; a release build has
# none to drop (Cargo.toml [profile.release]).
if command -v strip >/dev/null 2>&1; then strip --strip-debug "$work/hapwright"; fi
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
security="${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
if [ "$suite" = sid ]; then
    # sid has no -updates or -security suites.
    sources=("deb $mirror sid main")
else
    sources=(
        "deb $mirror $suite main"
        "deb $mirror $suite-updates main"
        "deb $security $suite-security main"
    )
fi
pin_hooks=()
if [ -n "$haproxy_suite" ]; then
    # haproxy (and only haproxy) from experimental: its other packages keep priority 1,
    # as experimental's Release file sets anyway, so everything else is sid's.
    sources+=("deb $mirror $haproxy_suite main")
    # Pinned by archive name: experimental's codename is rc-buggy.
    pin_file="$work/haproxy-from-$haproxy_suite"
    printf '%s\n' \
        "Package: *" "Pin: release a=$haproxy_suite" "Pin-Priority: 1" "" \
        "Package: haproxy" "Pin: release a=$haproxy_suite" "Pin-Priority: 990" >"$pin_file"
    # Before mmdebstrap's apt-get update; it stays in the image for apt in a container.
    pin_hooks+=(--setup-hook='mkdir -p "$1/etc/apt/preferences.d"'
        --setup-hook="copy-in $pin_file /etc/apt/preferences.d")
    described="Debian $suite with HAProxy $line from $haproxy_suite"
else
    described="Debian $suite with HAProxy $line"
fi
echo "==> building the root file system ($described, ca-certificates)"
# essential + haproxy: HAProxy for `haproxy -c` and managed instances, its shared
# libraries, glibc and libgcc_s for hapwright (built on bookworm, glibc 2.36, it runs
# on that glibc and on the newer ones of trixie and sid). No shell-less tricks: the
# image keeps Debian's essential tools, so `podman exec` can inspect a running
# controller.
$sudo mmdebstrap \
    --variant=essential \
    --include=haproxy,ca-certificates \
    --aptopt='Acquire::Check-Valid-Until "false"' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    "${pin_hooks[@]}" \
    --customize-hook='echo "hapwright:x:10001:10001:hapwright:/nonexistent:/usr/sbin/nologin" >> "$1/etc/passwd"' \
    --customize-hook='echo "hapwright:x:10001:" >> "$1/etc/group"' \
    --customize-hook='mkdir -p "$1/etc/hapwright" && chown 10001:10001 "$1/etc/hapwright"' \
    --customize-hook="copy-in $work/hapwright /usr/local/bin" \
    --customize-hook='chown 0:0 "$1/usr/local/bin/hapwright" && chmod 0755 "$1/usr/local/bin/hapwright"' \
    --customize-hook='rm -rf "$1/var/cache/apt/"* "$1/var/lib/apt/lists/"* "$1/var/log/"*' \
    "$suite" "$work/rootfs.tar" "${sources[@]}"

# --- image ---
echo "==> importing the image as $tag"
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
created=$(date -u +%Y-%m-%dT%H:%M:%SZ)
$sudo podman import \
    --message "hapwright $version on $described" \
    --change 'USER 10001:10001' \
    --change 'WORKDIR /etc/hapwright' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV HAPWRIGHT_CONFIG=/etc/hapwright/hapwright.yaml' \
    --change 'ENTRYPOINT ["/usr/local/bin/hapwright"]' \
    --change 'CMD ["run"]' \
    --change 'STOPSIGNAL SIGTERM' \
    --change 'LABEL org.opencontainers.image.title="hapwright"' \
    --change "LABEL org.opencontainers.image.description=\"Renders HAProxy configs from Jinja templates and deploys them; contains HAProxy $line\"" \
    --change "LABEL org.opencontainers.image.version=\"$version\"" \
    --change "LABEL org.opencontainers.image.revision=\"$revision\"" \
    --change "LABEL org.opencontainers.image.created=\"$created\"" \
    --change 'LABEL org.opencontainers.image.licenses="Apache-2.0"' \
    --change 'LABEL org.opencontainers.image.source="https://github.com/hapwright/hapwright"' \
    --change "LABEL org.opencontainers.image.base.name=\"debian:$suite\"" \
    --change "LABEL io.hapwright.haproxy.line=\"$line\"" \
    "$work/rootfs.tar" "$tag" >/dev/null

# --- smoke check: the image runs here ---
echo "==> checking the image runs"
if ! $sudo podman run --rm --network=none "$tag" version; then
    echo "image.sh: podman cannot run containers on this machine (see the error above);" \
        "the image $tag was built but not checked" >&2
    exit 1
fi
haproxy_version=$($sudo podman run --rm --network=none --entrypoint haproxy "$tag" -v)
echo "${haproxy_version%%$'\n'*}"
case "$haproxy_version" in
    "HAProxy version $line."*) ;;
    *) echo "image.sh: the image's HAProxy is not the $line line (see above)" >&2; exit 1 ;;
esac
$sudo podman image prune -f >/dev/null
echo "==> built $tag ($($sudo podman image inspect --format '{{.Size}}' "$tag") bytes)"
echo "    push it with: podman push $tag [docker://REGISTRY/hapwright:$version]"
