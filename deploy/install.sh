#!/bin/sh
# Installs or upgrades one mode of hapwright on the cluster kubectl points at:
#
#   deploy/install.sh sidecar|controller|gateway-api|ingress-nginx [kubectl apply options]
#   deploy/install.sh --compose-only sidecar|controller|gateway-api|ingress-nginx
#
# It composes the mode's hapwright config from the template library in examples/
# and the mode's site.yaml (deploy/compose.sh; the result is <mode>/hapwright.yaml),
# then runs `kubectl apply -k deploy/<mode>`. An upgrade is the same command on a
# newer checkout: the new library comes from examples/, your settings stay in
# site.yaml. --compose-only writes hapwright.yaml and applies nothing.
set -eu
root="$(cd "$(dirname "$0")/.." && pwd)"
compose_only=0
if [ "${1:-}" = "--compose-only" ]; then
    compose_only=1
    shift
fi
mode="${1:-}"
case "$mode" in
    sidecar | controller) library=examples/kubernetes-ingress/hapwright.yaml ;;
    gateway-api) library=examples/gateway-api/hapwright.yaml ;;
    ingress-nginx) library=examples/ingress-nginx/hapwright.yaml ;;
    *)
        echo "usage: $0 [--compose-only] sidecar|controller|gateway-api|ingress-nginx [kubectl apply options]" >&2
        exit 2
        ;;
esac
shift
cd "$root"
# Paths relative to the repository root, so the composed file is the same on every
# checkout (tests/deploy_manifests.rs compares it with the committed one).
tmp="deploy/$mode/.hapwright.yaml.tmp"
trap 'rm -f "$tmp"' EXIT
sh deploy/compose.sh "$library" "deploy/$mode/site.yaml" > "$tmp"
mv "$tmp" "deploy/$mode/hapwright.yaml"
echo "composed deploy/$mode/hapwright.yaml from $library and deploy/$mode/site.yaml"
if [ "$compose_only" = 1 ]; then
    exit 0
fi
exec kubectl apply -k "deploy/$mode" "$@"
