#!/usr/bin/env bash
# Make a Debian bookworm base image on this host, for when no registry can be reached.
#
#     docker/local-base.sh [IMAGE]          (default localhost/distlab-base:bookworm; needs root)
#     docker/build-image.sh cpu             with BASE=localhost/distlab-base:bookworm
#
# It holds what docker/Dockerfile.cpu expects from python:3.11-slim-bookworm: Python 3.11 with
# venv and headers, CA certificates and useradd. ENGINE (docker|podman), DEBIAN_MIRROR.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR/..
. docker/lib.sh

image=${1:-localhost/distlab-base:bookworm}
engine=${ENGINE:-docker}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
[ "$(id -u)" -eq 0 ] || die "debootstrap needs root; run as root, or pull the base image instead"
command -v debootstrap >/dev/null || die "debootstrap is missing; install it (Debian: apt-get install debootstrap)"

rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,python3-dev,ca-certificates,passwd \
    bookworm "$rootfs" "$mirror"
# The package lists and downloaded .debs are only build leftovers.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | "$engine" import --change 'CMD ["/bin/bash"]' - "$image"
