#!/usr/bin/env bash
# The base of the Gradescope-like image, made on this host: a fresh OS and nothing else, as
# Gradescope's "Base" variant is (its setup.sh installs the rest).
#
#     docker/gradescope/base.sh [IMAGE]     (default localhost/distlab-gradescope-base:bookworm; needs root)
#
# Gradescope's base images are Ubuntu (22.04 by default, 24.04). This makes Debian 12 (bookworm)
# with debootstrap: Debian's debootstrap can make Ubuntu 22.04 (its `jammy` script), but Debian
# ships no Ubuntu archive keyring to verify it with, and an unverified base is no base for a
# test. What differs for the bundle: Python 3.11 (Ubuntu 22.04 has 3.10, 24.04 has 3.12; distlab
# needs >= 3.10, which setup.sh checks), Debian's package versions; the package names setup.sh
# installs are the same in both. ENGINE (podman, the default, or docker), DEBIAN_MIRROR.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source-path=SCRIPTDIR/../..
. docker/lib.sh

image=${1:-localhost/distlab-gradescope-base:bookworm}
engine=${ENGINE:-podman}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
[ "$(id -u)" -eq 0 ] || die "debootstrap needs root; run as root"
command -v debootstrap >/dev/null || die "debootstrap is missing; install it (Debian: apt-get install debootstrap)"

rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
debootstrap --variant=minbase bookworm "$rootfs" "$mirror"
# The package lists and downloaded .debs are only build leftovers.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | "$engine" import --change 'CMD ["/bin/bash"]' - "$image"
