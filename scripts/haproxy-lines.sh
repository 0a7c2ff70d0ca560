#!/usr/bin/env bash
# Installs the real `haproxy` of each newer supported HAProxy line from Debian's own
# suites, side by side, without touching the system's haproxy (bookworm's 2.6, which
# `apt-get install haproxy` gives and scripts/test.sh uses by default):
#
#   line  suite          directory
#   3.0   trixie         target/haproxy-lines/3.0/usr/sbin/haproxy
#   3.2   sid            target/haproxy-lines/3.2/usr/sbin/haproxy
#   3.4   experimental   target/haproxy-lines/3.4/usr/sbin/haproxy
#
# (docs/haproxy-versions.md: what differs between the lines and how tests use them.)
#
# The newer packages need a newer libc than bookworm's, so they are not installed with
# dpkg: a private apt configuration (its own sources.list, state and cache under the
# lines directory) downloads the haproxy package of the line's suite and its library
# packages from sid, `dpkg-deb -x` unpacks them into the line's directory, and patchelf
# points the binary at that directory's dynamic loader and libraries (an RPATH, not a
# RUNPATH, so the libraries' own dependencies resolve there too). The binary then runs
# in place, and master-worker re-exec works because /proc/self/exe is the binary itself.
#
# Versions are pinned loosely: each line takes what its suite offers today and the
# script prints it. A line already installed is kept (a second run only checks the
# binaries); --refresh downloads again.
#
# Usage: scripts/haproxy-lines.sh [--refresh] [LINE...]     (default: 3.0 3.2 3.4)
# Prints, last, one line per installed line: "<line> <dir>/usr/sbin <version>".
# Environment: HAPWRIGHT_HAPROXY_LINES_DIR (default: $CARGO_TARGET_DIR/haproxy-lines,
# that is target/haproxy-lines).
set -euo pipefail
cd "$(dirname "$0")/.."

refresh=0
lines=()
for arg in "$@"; do
    case "$arg" in
    --refresh) refresh=1 ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
        exit 0
        ;;
    *) lines+=("$arg") ;;
    esac
done
[ ${#lines[@]} -gt 0 ] || lines=(3.0 3.2 3.4)

suite_of() {
    case "$1" in
    3.0) echo trixie ;;
    3.2) echo sid ;;
    3.4) echo experimental ;;
    *)
        echo "error: unknown HAProxy line $1 (known: 3.0 3.2 3.4; 2.6 is the system's haproxy)" >&2
        return 1
        ;;
    esac
}

root="${HAPWRIGHT_HAPROXY_LINES_DIR:-${CARGO_TARGET_DIR:-target}/haproxy-lines}"
mkdir -p "$root"
root="$(cd "$root" && pwd)"

arch="$(dpkg --print-architecture)"
case "$arch" in
amd64) multiarch=x86_64-linux-gnu loader=ld-linux-x86-64.so.2 ;;
arm64) multiarch=aarch64-linux-gnu loader=ld-linux-aarch64.so.1 ;;
*)
    echo "error: no loader known for architecture $arch" >&2
    exit 1
    ;;
esac

# The libraries the four lines' packages depend on, and theirs, all taken from sid so
# that they match each other (sid's libc is new enough for every line).
libraries=(libc6 libcrypt1 libjemalloc2 liblua5.4-0 libopentracing-c-wrapper0t64
    libopentracing1 libpcre2-8-0 libssl3t64 libstdc++6 libgcc-s1 zlib1g libzstd1)

# A line counts as installed when its marker exists and its binary still runs.
installed() {
    local dir="$root/$1"
    [ -f "$dir/.installed" ] && "$dir/usr/sbin/haproxy" -v >/dev/null 2>&1
}

pending=()
for line in "${lines[@]}"; do
    suite_of "$line" >/dev/null
    if [ "$refresh" = 1 ] || ! installed "$line"; then
        pending+=("$line")
    fi
done

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

if [ ${#pending[@]} -gt 0 ]; then
    if ! command -v patchelf >/dev/null 2>&1; then
        echo "==> installing patchelf"
        as_root apt-get update
        DEBIAN_FRONTEND=noninteractive as_root apt-get install -y --no-install-recommends patchelf
    fi

    # The private apt configuration: Debian's own suites, nothing of the system's apt
    # state touched (the system's sources, lists, cache and dpkg status are not read).
    apt_dir="$root/apt"
    mkdir -p "$apt_dir/etc/preferences.d" "$apt_dir/state/lists/partial" \
        "$apt_dir/cache/archives/partial" "$apt_dir/debs"
    : >"$apt_dir/state/status"
    keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    {
        for suite in trixie sid experimental; do
            echo "deb [arch=$arch signed-by=$keyring] http://deb.debian.org/debian $suite main"
        done
    } >"$apt_dir/etc/sources.list"
    apt_opts=(
        -o "Dir::Etc::SourceList=$apt_dir/etc/sources.list"
        -o "Dir::Etc::SourceParts=$apt_dir/etc/sources.list.d"
        -o "Dir::Etc::PreferencesParts=$apt_dir/etc/preferences.d"
        -o "Dir::State=$apt_dir/state"
        -o "Dir::State::status=$apt_dir/state/status"
        -o "Dir::Cache=$apt_dir/cache"
        -o "APT::Architecture=$arch"
        -o "APT::Architectures=$arch"
        -o "Acquire::Languages=none"
        -o "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false"
        -o "Debug::NoLocking=1"
    )
    mkdir -p "$apt_dir/etc/sources.list.d"
    # As root apt drops to the _apt user for downloads, who cannot write here.
    [ "$(id -u)" -ne 0 ] || apt_opts+=(-o "APT::Sandbox::User=root")
    echo "==> apt-get update (private configuration under $apt_dir)"
    apt-get "${apt_opts[@]}" -q update

    # One download of the sid libraries, shared by every line's unpacking.
    (
        cd "$apt_dir/debs"
        rm -f ./*.deb
        specs=()
        for lib in "${libraries[@]}"; do specs+=("$lib/sid"); done
        apt-get "${apt_opts[@]}" -q download "${specs[@]}"
    )

    for line in "${pending[@]}"; do
        suite="$(suite_of "$line")"
        dir="$root/$line"
        echo "==> HAProxy $line from $suite into $dir"
        rm -rf "$dir" "$root/$line.debs"
        mkdir -p "$root/$line.debs"
        version="$(apt-cache "${apt_opts[@]}" show "haproxy/$suite" |
            awk '/^Version:/ { print $2; exit }')"
        echo "    haproxy $version ($suite)"
        (cd "$root/$line.debs" && apt-get "${apt_opts[@]}" -q download "haproxy=$version")
        mkdir -p "$dir"
        for deb in "$root/$line.debs"/*.deb "$apt_dir/debs"/*.deb; do
            dpkg-deb -x "$deb" "$dir"
        done
        rm -rf "$root/$line.debs"
        libdir="$dir/usr/lib/$multiarch"
        patchelf --set-interpreter "$libdir/$loader" --force-rpath --set-rpath "$libdir" \
            "$dir/usr/sbin/haproxy"
        # Every library must come from the line's directory: one from the system (an
        # older libm, say) would be a mix nobody tested.
        # (Listed by the line's own loader: the system's ldd would use bookworm's.)
        outside="$("$libdir/$loader" --list "$dir/usr/sbin/haproxy" | awk -v dir="$dir" '
            /not found/ { print; next }
            $2 == "=>" && $1 !~ /\// && index($3, dir) != 1 { print }')"
        if [ -n "$outside" ]; then
            echo "error: HAProxy $line resolves libraries outside $dir:" >&2
            echo "$outside" >&2
            exit 1
        fi
        echo "$version" >"$dir/.installed"
    done
fi

echo "==> HAProxy lines"
for line in "${lines[@]}"; do
    dir="$root/$line"
    if ! installed "$line"; then
        echo "error: HAProxy $line in $dir does not run:" >&2
        "$dir/usr/sbin/haproxy" -v >&2 || true
        exit 1
    fi
    # The line the binary reports must be the line it was installed as.
    reported="$("$dir/usr/sbin/haproxy" -v | awk 'NR == 1 { print $3 }')"
    case "$reported" in
    "$line".*) ;;
    *)
        echo "error: $dir/usr/sbin/haproxy reports version $reported, not line $line" >&2
        exit 1
        ;;
    esac
    echo "$line $dir/usr/sbin $reported"
done
