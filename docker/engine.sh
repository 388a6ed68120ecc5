#!/usr/bin/env bash
# Print the container engine to use, and the base image for the CPU image, installing podman if need be.
#
#     docker/engine.sh          -> "ENGINE BASE", e.g. "podman localhost/distlab-base:bookworm"
#
# ENGINE if set (it must answer `ENGINE info`), else the first of docker and podman that answers;
# with neither, as root on Debian, podman is installed (with runc and debootstrap) and set up for
# running as root inside a container, where it cannot set rlimits or manage cgroups through systemd.
# BASE if set; else the Dockerfile's base if present or pullable; else a Debian base made locally
# by docker/local-base.sh. Progress goes to stderr, the answer to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR/..
. docker/lib.sh

cpu_base=docker.io/library/python:3.11-slim-bookworm  # the default BASE of docker/Dockerfile.cpu
local_base=localhost/distlab-base:bookworm

answers() {
    command -v "$1" >/dev/null && timeout 120 "$1" info >/dev/null 2>&1
}

apt_install() {
    { [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; } ||
        die "$* missing; install them (Debian: apt-get install $*) or run this as root on Debian"
    # apt verifies signatures as the unprivileged user _apt, in TMPDIR; some machines keep /tmp
    # closed to other users, /var/tmp is world-writable by design.
    DEBIAN_FRONTEND=noninteractive TMPDIR=/var/tmp apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive TMPDIR=/var/tmp apt-get install -y -qq --no-install-recommends "$@" >&2
}

engine=""
for candidate in ${ENGINE:-docker podman}; do
    if answers "$candidate"; then engine=$candidate; break; fi
done
if [ -z "$engine" ]; then
    [ -z "${ENGINE:-}" ] || [ "${ENGINE}" = podman ] ||
        die "ENGINE=$ENGINE does not answer \`$ENGINE info\`; start its daemon or use ENGINE=podman"
    apt_install podman runc debootstrap
    conf=/etc/containers/containers.conf
    if [ ! -e "$conf" ]; then
        printf '%s\n' "# Written by distlab's docker/engine.sh after it installed podman on this machine." \
            "[containers]" "default_ulimits = []" "[engine]" 'cgroup_manager = "cgroupfs"' 'runtime = "runc"' >"$conf"
        echo "wrote $conf: no rlimits by default, cgroupfs, runc" >&2
    fi
    answers podman || die "podman was installed but \`podman info\` fails; run it by hand to see why"
    engine=podman
fi

base=${BASE:-}
if [ -z "$base" ]; then
    for image in "$cpu_base" "$local_base"; do
        if "$engine" image inspect "$image" >/dev/null 2>&1; then base=$image; break; fi
    done
fi
if [ -z "$base" ]; then
    if timeout 300 "$engine" pull "$cpu_base" >&2; then
        base=$cpu_base
    else
        echo "cannot pull $cpu_base: building $local_base with debootstrap" >&2
        command -v debootstrap >/dev/null || apt_install debootstrap
        ENGINE=$engine docker/local-base.sh "$local_base" >&2
        base=$local_base
    fi
fi
echo "$engine $base"
