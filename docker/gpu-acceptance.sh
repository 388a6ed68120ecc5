#!/usr/bin/env bash
# `distlab acceptance` on a GPU host without internet whose Python already has a CUDA torch (the
# borrowed machine: one H200, python3 a venv with torch 2.11.0+cu130, no MPI; docs/gpu-acceptance.md).
#
#     here (with internet):  make gpu-wheels        # .nox/gpu-wheels: distlab's wheel and what that machine lacks
#     there (offline):       docker/gpu-acceptance.sh --out DIR [--dry-run] [more distlab acceptance options]
#
# No venv (one made from that python3 would not see its torch) and no nox: docker/gpu-install.py adds
# to the host's own Python only what it lacks, from the wheels, into SITE (made afresh every run, so
# the project's code is the wheel's and the wheel is this checkout's), and PYTHONPATH points there.
# The deadline (--deadline, default 510 s on one GPU) counts from the first line of this script.
#
# Settings (environment): PYTHON (default python3), WHEELS (default .nox/gpu-wheels), SITE (default
# .nox/gpu-site), RESULTS_DIR (default ./results), DRY_RUN=1 prints the commands.
set -euo pipefail
DISTLAB_ACCEPTANCE_STARTED=$(date +%s.%N)
export DISTLAB_ACCEPTANCE_STARTED
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR/..
. docker/lib.sh

PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-.nox/gpu-wheels}
SITE=${SITE:-.nox/gpu-site}
case $SITE in /*) ;; *) SITE=$PWD/$SITE ;; esac  # PYTHONPATH must not depend on where a step runs
RESULTS_DIR=${RESULTS_DIR:-results}
TORCH_MIN=2.11  # the oldest torch the labs were written against (DTensor, pipelining, torch.amp)

command -v "$PYTHON" > /dev/null || die "no $PYTHON on PATH; set PYTHON=/path/to/python3 (the one with torch)"
compgen -G "$WHEELS/distlab-*.whl" > /dev/null \
    || die "no distlab wheel in $WHEELS; run \`make gpu-wheels\` on a host with internet and copy $WHEELS here"
torch_version=$("$PYTHON" -c 'import torch; print(torch.__version__.split("+")[0])' 2> /dev/null) \
    || die "$PYTHON cannot import torch; set PYTHON to the python3 that has torch >= $TORCH_MIN with CUDA"
"$PYTHON" - "$torch_version" "$TORCH_MIN" << 'EOF' || die "torch $torch_version is older than $TORCH_MIN; install a newer one, or set PYTHON"
import sys
have, need = ([int(part) for part in v.split(".")[:2]] for v in sys.argv[1:])
sys.exit(0 if have >= need else 1)
EOF

also=()
"$PYTHON" -c 'import torchvision' 2> /dev/null || also=(--also torchvision)  # paired with torch 2.11 (gpu-wheels)
run "$PYTHON" docker/gpu-install.py --wheels "$WHEELS" --target "$SITE" --checkout . "${also[@]}"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export DISTLAB_CHECKOUT=$PWD  # its docker/gpu-claim-spread.py, which the wheel does not carry
# The console script, not `python -m` from here: the checkout beside would be imported before the wheel.
run "$PYTHON" "$SITE/bin/distlab" acceptance --results "$RESULTS_DIR" "$@"
