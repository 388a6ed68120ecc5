#!/usr/bin/env bash
# Run distlab in the distlab image (RUNTIME=container, the default) or on this host (RUNTIME=local):
# what `make lab-NAME` and `make grade-gpu` call. Everything is checked before anything starts.
#
#     docker/run-lab.sh lab NAME     distlab run NAME --world-size N [--backend B] -- $LAB_ARGS
#     docker/run-lab.sh grade        distlab grade [--profile P] [--world-sizes W] $GRADE_ARGS
#     docker/run-lab.sh acceptance   distlab acceptance: every lab on the GPUS, calibrate, grade
#
# Settings (environment; the Makefile passes its variables of the same names):
#   GPUS=N         GPUs to use, one rank each; at most what `nvidia-smi -L` lists (or the GPUs named
#                  in CUDA_VISIBLE_DEVICES). lab: default 0; grade: default all visible
#   NP=N           ranks on the CPU when GPUS is 0 (default 1)
#   BACKEND, LAB_ARGS            lab: distlab run's --backend, the lab's own arguments
#   PROFILE, WORLD_SIZES, GRADE_ARGS   grade: distlab grade's --profile, --world-sizes, more options
#   RUNTIME        container (default) or local (.nox/env/bin/distlab, made by `make setup`)
#   ENGINE         docker (default) or podman
#   IMAGE          default distlab:gpu with GPUs, distlab:cpu without
#   ENGINE_ARGS    more options for `ENGINE run`
#   DATA_DIR, RESULTS_DIR   host folders mounted at /workspace/data and /workspace/results
#                  (default ./data, ./results)
#   CONTAINER_UID  uid of the image's lab user (default 1000, the Dockerfiles' DISTLAB_UID)
#   DRY_RUN=1      print the command instead of running it (`make -n lab-NAME` sets it)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR/..
. docker/lib.sh

what=${1:-}
runtime=${RUNTIME:-container}
engine=${ENGINE:-docker}
data_dir=${DATA_DIR:-data}
results_dir=${RESULTS_DIR:-results}
container_uid=${CONTAINER_UID:-1000}

case $runtime in container | local) ;; *) die "RUNTIME=$runtime: use RUNTIME=container or RUNTIME=local" ;; esac
case $engine in docker | podman) ;; *) die "ENGINE=$engine: use ENGINE=docker or ENGINE=podman" ;; esac

# The GPUs this host offers: those CUDA_VISIBLE_DEVICES names, else every GPU nvidia-smi lists.
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    IFS=, read -r -a devices <<<"$CUDA_VISIBLE_DEVICES"
else
    count=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU ' || true)
    devices=()
    for ((i = 0; i < count; i++)); do devices+=("$i"); done
fi
visible=${#devices[@]}

case $what in
    lab) gpus=${GPUS:-0} ;;
    grade | acceptance)
        gpus=${GPUS:-$visible}
        [ "$gpus" != 0 ] || die "no GPU to $what on (nvidia-smi -L lists none); make grade grades the CPU"
        ;;
    *) die "say what to run: docker/run-lab.sh lab NAME, docker/run-lab.sh grade or docker/run-lab.sh acceptance" ;;
esac
is_count "$gpus" || die "GPUS=$gpus is not a whole number; use e.g. GPUS=2"
if [ "$gpus" -gt "$visible" ]; then
    cpu_hint="NP=$gpus for $gpus ranks on the CPU"
    [ "$what" = lab ] || cpu_hint="make grade for the CPU"
    [ "$visible" -eq 0 ] && die "GPUS=$gpus but this host shows no GPU (nvidia-smi -L); use $cpu_hint"
    die "GPUS=$gpus but this host shows $visible GPU(s) (nvidia-smi -L); use GPUS=$visible or fewer, or $cpu_hint"
fi
np=${NP:-}
if [ -n "$np" ]; then
    { is_count "$np" && [ "$np" -ge 1 ]; } || die "NP=$np is not a whole number of at least 1; use e.g. NP=2"
    [ "$gpus" -eq 0 ] || [ "$np" -eq "$gpus" ] ||
        die "GPUS=$gpus and NP=$np disagree: with GPUs each rank has one; set GPUS alone (or NP with GPUS=0)"
fi

case $what in
    lab)
        lab=${2:-}
        [ -n "$lab" ] || die "say which lab: docker/run-lab.sh lab NAME (make lab-NAME)"
        read -r -a lab_args <<<"${LAB_ARGS:-}"
        args=(run "$lab" --world-size "$([ "$gpus" -gt 0 ] && echo "$gpus" || echo "${np:-1}")")
        [ -z "${BACKEND:-}" ] || args+=(--backend "$BACKEND")
        args+=(-- ${lab_args[@]+"${lab_args[@]}"})  # the +: bash 3 (macOS) calls an empty array unbound
        ;;
    grade)
        read -r -a grade_args <<<"${GRADE_ARGS:-}"
        args=(grade)
        [ -z "${PROFILE:-}" ] || args+=(--profile "$PROFILE")
        [ -z "${WORLD_SIZES:-}" ] || args+=(--world-sizes "$WORLD_SIZES")
        args+=(${grade_args[@]+"${grade_args[@]}"})
        ;;
    acceptance) args=(acceptance) ;;  # on the GPUS handed to the container (CUDA_VISIBLE_DEVICES/--gpus)
esac
# The first GPUS of the visible GPUs; none when GPUS=0, so that CPU ranks do not pick up a GPU.
use=$(IFS=,; echo "${devices[*]+${devices[*]:0:$gpus}}")

if [ "$runtime" = local ]; then
    run "${MAKE:-make}" --no-print-directory setup
    run env CUDA_VISIBLE_DEVICES="$use" .nox/env/bin/distlab "${args[@]}"
    exit
fi

image=${IMAGE:-distlab:$([ "$gpus" -gt 0 ] && echo gpu || echo cpu)}
if ! dry_run; then
    command -v "$engine" >/dev/null || die "ENGINE=$engine is not installed; install it, use the other ENGINE, or RUNTIME=local"
    if ! "$engine" image inspect "$image" >/dev/null 2>&1; then
        "$engine" info >/dev/null 2>&1 || die "the $engine engine does not answer; start it (or use RUNTIME=local)"
        die "image $image is missing; build it with make $([ "$gpus" -gt 0 ] && echo image || echo image-cpu)"
    fi
fi

absolute() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac }
# --ipc=host: PyTorch's DataLoader workers and NCCL share memory through /dev/shm, which is 64 MB
# in a container. memlock unlimited: NCCL and MPI pin memory for RDMA. A 64 MB stack: NVIDIA's
# recommended setting for its PyTorch images.
limits=(--ulimit memlock=-1 --ulimit stack=67108864)
if [ "$engine" = podman ] && ! dry_run && ! podman run --rm "${limits[@]}" "$image" true >/dev/null 2>&1; then
    # Podman sets limits from its own process: rootless, or as root without CAP_SYS_RESOURCE (in a
    # container), it cannot raise them and the run would fail. The labs run without (no RDMA here).
    echo "run-lab.sh: note: podman cannot set --ulimit here (rootless or no CAP_SYS_RESOURCE); running without" >&2
    limits=()
fi
# SYS_PTRACE: on a hang, distlab runs py-spy on the ranks to show where each one waits; reading
# another process's stack needs it inside a container.
cmd=("$engine" run --rm --ipc=host --cap-add SYS_PTRACE ${limits[@]+"${limits[@]}"})
if [ "$gpus" -gt 0 ]; then
    if [ "$engine" = docker ]; then
        # The quotes are part of the value: docker splits --gpus at commas otherwise.
        cmd+=(--gpus "\"device=$use\"")
    else
        # Podman reaches GPUs through CDI (nvidia-ctk cdi generate), one device name per GPU.
        for device in ${use//,/ }; do cmd+=(--device "nvidia.com/gpu=$device"); done
    fi
fi
if ! dry_run; then
    mkdir -p "$data_dir" "$results_dir"  # else the engine creates them, owned by root
fi
# Files written into the mounted results folder must belong to whoever runs this. A non-root
# caller runs the container as itself; a root caller keeps the image's unprivileged user and
# hands the results folder to it.
if [ "$(id -u)" -ne 0 ]; then
    if [ "$engine" = docker ]; then
        cmd+=(--user "$(id -u):$(id -g)")
    else
        cmd+=(--userns=keep-id)  # rootless podman: the caller's uid inside is the caller's outside
    fi
    cmd+=(--env HOME=/tmp)  # that uid has no home in the image
elif ! dry_run; then
    chown -R "$container_uid:$container_uid" "$results_dir"
fi
cmd+=(--volume "$(absolute "$data_dir"):/workspace/data" --volume "$(absolute "$results_dir"):/workspace/results")
if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
    # distlab grade appends its report to GitHub's job summary: hand the file in.
    cmd+=(--volume "$GITHUB_STEP_SUMMARY:/workspace/step-summary.md" --env GITHUB_STEP_SUMMARY=/workspace/step-summary.md)
fi
read -r -a engine_args <<<"${ENGINE_ARGS:-}"
cmd+=(${engine_args[@]+"${engine_args[@]}"} "$image" distlab "${args[@]}")
run "${cmd[@]}"
