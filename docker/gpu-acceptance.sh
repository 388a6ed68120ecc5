#!/usr/bin/env bash
# `distlab acceptance` on a GPU host without internet that already has Python and a CUDA torch
# (the borrowed machine: one H200, Python 3.12, torch 2.11 with CUDA 13, no MPI).
#
#     here (with internet):  make gpu-wheels        # .nox/gpu-wheels: distlab and its pure-Python needs
#     there (offline):       docker/gpu-acceptance.sh [--dry-run] [more distlab acceptance options]
#
# It makes a virtual environment that sees the host's own packages (--system-site-packages: the
# torch it finds is used, never replaced), installs distlab from the wheels with no index at all,
# torchvision from them only when the host lacks it, and runs the acceptance: one archive of
# everything measured under RESULTS_DIR/acceptance/. Horovod is not there unless the host has it
# built with NCCL; the acceptance then names that step as skipped and goes on.
#
# Settings (environment): PYTHON (default python3), WHEELS (default .nox/gpu-wheels),
# VENV (default .nox/gpu-acceptance), RESULTS_DIR (default ./results), DRY_RUN=1 prints the commands.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR/..
. docker/lib.sh

PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-.nox/gpu-wheels}
VENV=${VENV:-.nox/gpu-acceptance}
RESULTS_DIR=${RESULTS_DIR:-results}
TORCH_MIN=2.11  # the oldest torch the labs were written against (DTensor, pipelining, torch.amp)

command -v "$PYTHON" > /dev/null || die "no $PYTHON on PATH; set PYTHON=/path/to/python3 (the one with torch)"
compgen -G "$WHEELS/distlab-*.whl" > /dev/null \
    || die "no distlab wheel in $WHEELS; run \`make gpu-wheels\` on a host with internet and copy $WHEELS here"
torch_version=$("$PYTHON" -c 'import torch; print(torch.__version__.split("+")[0])' 2> /dev/null) \
    || die "$PYTHON cannot import torch; install torch >= $TORCH_MIN with CUDA there, or set PYTHON"
"$PYTHON" - "$torch_version" "$TORCH_MIN" << 'EOF' || die "torch $torch_version is older than $TORCH_MIN; install a newer one, or set PYTHON"
import sys
have, need = ([int(part) for part in v.split(".")[:2]] for v in sys.argv[1:])
sys.exit(0 if have >= need else 1)
EOF

run "$PYTHON" -m venv --system-site-packages "$VENV"
pip=("$VENV/bin/python" -m pip install --no-index --find-links "$WHEELS" --quiet)
if ! "$PYTHON" -c 'import torchvision' 2> /dev/null; then
    run "${pip[@]}" --no-deps torchvision  # paired with torch 2.11 (noxfile.py, gpu-wheels)
fi
run "${pip[@]}" distlab
run "$VENV/bin/distlab" acceptance --results "$RESULTS_DIR" "$@"
