#!/usr/bin/env bash
# Build the gateway's image with podman, as the opt-in container test does:
#
#   tests/container/build.sh [IMAGE]        (default IMAGE: localhost/mcp-context-gateway:test)
#
# Where no registry is reachable (only Debian's, PyPI's and npm's package mirrors), the Dockerfile's base
# (debian:bookworm-slim) is stood in for by the same release made with debootstrap, carrying this machine's
# CA certificates (HTTPS may go through an intercepting proxy) and a pip.conf that trusts them. Needs root.
set -euo pipefail
cd "$(dirname "$0")/../.."
image="${1:-localhost/mcp-context-gateway:test}"
base="localhost/debian:bookworm-slim"
export CONTAINERS_CONF="$PWD/tests/container/containers.conf"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/mcp-context-gateway-container"

missing=()
for tool in podman runc debootstrap; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if [ "${#missing[@]}" -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap >/dev/null
fi

if ! podman image exists "$base"; then
  mkdir -p "$cache"
  if [ ! -f "$cache/bookworm.tar" ]; then
    rm -rf "$cache/rootfs"
    debootstrap --variant=minbase bookworm "$cache/rootfs" http://deb.debian.org/debian >"$cache/debootstrap.log"
    mkdir -p "$cache/rootfs/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$cache/rootfs/usr/local/share/ca-certificates/" 2>/dev/null || true
    printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$cache/rootfs/etc/pip.conf"
    rm -rf "$cache/rootfs/var/cache/apt/archives/"*.deb
    tar -C "$cache/rootfs" -cf "$cache/bookworm.tar" .
    rm -rf "$cache/rootfs"
  fi
  podman import "$cache/bookworm.tar" "$base" >/dev/null
fi

podman build --quiet --network host --build-arg BASE="$base" -t "$image" . >/dev/null
echo "$image"
