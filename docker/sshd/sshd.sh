#!/bin/sh
# An MPIJob worker's sshd, run as the unprivileged lab user (harness/templates/k8s-mpijob.yaml):
# mpirun on the launcher pod starts the ranks through it. Port 2222, since a user cannot bind 22.
# The host key is made here, in this container's /tmp, so that no image carries a private key;
# the client key is the MPI operator's Secret, mounted at the job's sshAuthMountPath (~/.ssh).
set -eu
keys=$(mktemp -d)
ssh-keygen -q -t ed25519 -N '' -f "$keys/ssh_host_ed25519_key"
exec /usr/sbin/sshd -D -e -f /etc/ssh/distlab/sshd_config \
    -o "HostKey=$keys/ssh_host_ed25519_key" -o "PidFile=$keys/sshd.pid" "$@"
