#!/bin/sh
# Create the unprivileged user that runs the labs, and the folders it writes to.
#
#     add-user.sh UID
#
# Labs never need root: a student runs them as a normal user on a cluster too, and a lab that
# goes wrong cannot overwrite the image. Ubuntu 24.04 bases (the NGC images) already have a user
# `ubuntu` with uid 1000; it is removed so that the lab user can take uid 1000, the usual uid of
# the first user on a laptop, whose bind-mounted folders then need no chown.
set -eu

uid=$1
taken_by=$(getent passwd "$uid" | cut -d: -f1 || true)
if [ -n "$taken_by" ] && [ "$taken_by" != distlab ]; then
    userdel --remove "$taken_by" 2>/dev/null || userdel "$taken_by"
fi
if ! getent group "$uid" >/dev/null; then
    groupadd --gid "$uid" distlab
fi
useradd --uid "$uid" --gid "$uid" --create-home --shell /bin/bash distlab
# No password, yet not locked ('!', useradd's default): sshd refuses a locked account even with a
# key, and MPIJob workers let mpirun in by key (docker/sshd/).
usermod --password '*' distlab

# /workspace/data and /workspace/results are where `docker/run-lab.sh` mounts the host's data and
# results folders; they exist in the image so that runs without mounts work too.
mkdir -p /workspace/data /workspace/results
chown distlab:distlab /workspace/data /workspace/results
