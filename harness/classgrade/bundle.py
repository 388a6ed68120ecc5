"""`distlab grade-class SUBMISSIONS --autograder gradescope.zip`: a Gradescope autograder bundle.

Gradescope runs `setup.sh` once, as root, when it builds the assignment's image, and
`run_autograder` once per submission, with the student's files in /autograder/submission, and
reads /autograder/results/results.json. The bundle carries:

    setup.sh           Debian/Ubuntu packages, then a venv with only what grading needs: CPU torch
                       from a configurable index (TORCH_INDEX_URL), distlab's own dependencies; no
                       DeepSpeed, no test tools. It times itself (setup-seconds.txt, and its output).
    run_autograder     the Python step (harness/classgrade/gradescope.py), inside a shell trap that
                       writes a results.json of its own if that step cannot even start
    autograder.json    what to grade: lab, profile, world sizes, rubric, where lessons are linked,
                       the CPUs and memory the grade needs, Gradescope's timeout
    rubric.toml, profile.toml (a profile file of the course's own), distlab.tar (harness/ and labs/
                       as this installation has them, with the course's own calibrated profiles)

Each submission is a class of one, graded by `distlab grade-class` as a class is here; its
gradescope/<id>/results.json is what Gradescope shows. Gradescope's base images are Ubuntu (22.04
and 24.04 have Python >= 3.10, as distlab needs); setup.sh refuses an older one in one line.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import os
import re
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

from harness.catalog import REPO, find_lab
from harness.classgrade import lessons, rubric
from harness.usage import UsageError
from harness.verdict import profiles
from labs.common.host import fingerprint, git_commit

# The default grade: the course lab's observed checks and its speed beside the course lab, at two
# ranks, in seconds-long runs (cpu-smoke's ddp row; the class benchmark of docs/grading-class.md used
# it), so that a submission grades within Gradescope's default 10 minutes on the CPUs the grade needs.
DEFAULT_PROFILE, DEFAULT_WORLD_SIZES = "cpu-smoke", [2]
# The smallest box one submission's grade works in, measured (docs/grading-class.md, "The smallest box":
# `distlab bench submission --profile cpu-smoke --world-sizes 2 --cpus C --memory M`, PyPI's CUDA torch,
# 2026-12-06). Memory: at 768 MB (Gradescope's default) the limit killed a rank in the first run; at
# 1.5 GB every run ended well (the evaluator then does not wait beside the runs: observe/accuracy.py,
# keeps_warm); 512 MiB for the grader, the launcher and the evaluator, 512 MiB per rank. CPUs: half a
# CPU graded in 297 s, within Gradescope's default 10 minutes; speed is judged only with a CPU per rank
# (fewer, and it is "not comparable", its points kept), which the bundle asks for too.
MEMORY_PER_RANK_BYTES = 1 << 29
MEMORY_BASE_BYTES = 1 << 29
MIN_CPUS = 0.5
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
GRADESCOPE_TIMEOUT_S = 600  # Gradescope's default autograder timeout; raise both together (AUTOGRADER_TIMEOUT_S)
NOT_YET_DUE = dt.datetime.max.replace(tzinfo=dt.timezone.utc)  # Gradescope gives each submission its due date
PACKAGES = ("harness", "labs")
SKIPPED = re.compile(r"(^|/)(__pycache__|\.pytest_cache)(/|$)|\.py[co]$")

SETUP = """#!/usr/bin/env bash
# Gradescope: runs once, as root, when the autograder image is built. Installs only what grading
# needs: Python, bubblewrap (used where the container grants namespaces), CPU torch, distlab's own
# dependencies. Its time goes to its output and to /autograder/source/setup-seconds.txt.
set -euo pipefail
started=$SECONDS
source=/autograder/source
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends python3 python3-venv ca-certificates bubblewrap util-linux procps
python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' || {{
    echo "setup.sh: distlab needs Python >= 3.10; select the Ubuntu 22.04 or 24.04 base image" >&2; exit 2; }}
mkdir -p "$source/distlab"
tar -C "$source/distlab" -xf "$source/distlab.tar"
python3 -m venv /autograder/venv
pip=(/autograder/venv/bin/pip install --quiet --disable-pip-version-check)
"${{pip[@]}}" {torch_index}"torch=={torch}" "torchvision=={torchvision}"
"${{pip[@]}}" --requirement "$source/distlab/requirements.txt"
/autograder/venv/bin/python -c "import torch, torchvision; print('torch', torch.__version__)"
echo "$(( SECONDS - started ))" > "$source/setup-seconds.txt"
echo "setup.sh: done in $(( SECONDS - started )) s"
"""

RUN = """#!/usr/bin/env bash
# Gradescope: runs once per submission, as root, in /autograder. Every way it can end leaves a
# results.json: the grading step writes one whatever the grade did (harness/classgrade/gradescope.py);
# if that step cannot start or is killed, the traps below write one saying so.
set -u
autograder=${{AUTOGRADER_ROOT:-/autograder}}  # another root only where tests lay out Gradescope's folders
results=$autograder/results/results.json
started=$SECONDS
mkdir -p "$autograder/results"
rm -f "$results"
fallback() {{  # the messages are this script's own: JSON as they stand
    [ -s "$results" ] && return
    local why="The autograder $1: this is not a grade of your program."
    {{
        printf '{{"score": 0.0, "execution_time": %d, "output": "%s", ' "$(( SECONDS - started ))" "$why"
        printf '"output_format": "text", "visibility": "visible", "stdout_visibility": "hidden", '
        printf '"tests": [{{"name": "gradable", "score": 0.0, "max_score": {max_score}, "status": "failed", '
        printf '"output": "%s", "tags": ["error"], "visibility": "visible"}}], ' "$why"
        printf '"extra_data": {{"distlab": {{"status": "error", "reason": "run_autograder: %s"}}}}}}\\n' "$1"
    }} > "$results"
}}
trap 'fallback "was stopped by a signal"; exit 143' TERM INT HUP
trap 'fallback "ended before its grading step wrote results (exit code $?)"' EXIT
cd "$autograder/source/distlab" || exit 1
"$autograder/venv/bin/python" -m harness.classgrade.gradescope "$autograder/source/autograder.json"
"""


def _requirements() -> str:
    """distlab's own dependencies as installed here, without any extra's (tests, DeepSpeed, linters)."""
    needed = [r for r in metadata.requires("distlab") or [] if "extra ==" not in r and "extra==" not in r]
    return "".join(f"{r}\n" for r in needed)


def _version(name: str, default: str) -> str:
    """The installed version without its local label (2.14.1+cu130 -> 2.14.1): any index's build of it."""
    try:
        return metadata.version(name).split("+")[0]
    except metadata.PackageNotFoundError:
        return default


def _package_tar() -> bytes:
    """harness/ and labs/ as this installation has them (a checkout's or a wheel's), and what they need."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for package in PACKAGES:
            for path in sorted((REPO / package).rglob("*")):
                name = path.relative_to(REPO).as_posix()
                if path.is_file() and not path.is_symlink() and not SKIPPED.search(name):
                    tar.add(path, arcname=name, recursive=False)
        # No date: the same installation makes the same bundle, byte for byte (an image built from it is cached).
        provenance = {"distlab": _version("distlab", "unknown"), "git_commit": git_commit(REPO)}
        for name, text in (("requirements.txt", _requirements()), ("VERSION.json", json.dumps(provenance) + "\n")):
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return buffer.getvalue()


def needs(profile: profiles.Profile, lab: str, world_sizes: list[int]) -> dict[str, float]:
    """The smallest box one submission's grade works in (CPUs, memory, measured for the largest world
    size's ranks), and the CPUs its speed is judged with: every rank's threads a CPU of their own."""
    ranks = max(world_sizes)
    return {"cpus": MIN_CPUS, "memory_bytes": MEMORY_BASE_BYTES + ranks * MEMORY_PER_RANK_BYTES,
            "speed_cpus": ranks * (profile.threads_per_rank or 1)}


def write(args: argparse.Namespace) -> int:
    out: Path = args.autograder
    if out.exists():
        raise UsageError(f"{out} exists; give a new path for the bundle (nothing is overwritten)")
    find_lab(args.lab)
    rubric_path = args.rubric or rubric.DEFAULT.with_name(f"{args.lab}.toml")
    if not args.rubric and not rubric_path.is_file():
        raise UsageError(f"no rubric ships for lab {args.lab}; give one with --rubric (format: {rubric.DEFAULT})")
    the_rubric = rubric.load(rubric_path, due=NOT_YET_DUE)  # checked here; each submission brings its due date
    profile_name = args.profile or DEFAULT_PROFILE
    profile_file = Path(profile_name) if Path(profile_name).is_file() else None  # a course's own travels along
    try:
        profile = profiles.resolve(str(profile_file or profile_name), fingerprint())
    except profiles.ProfileError as error:
        raise UsageError(str(error)) from None
    rows = [row for row, exp in profile.labs.items() if args.lab in (row, exp.catalog_lab)]
    if not rows:
        raise UsageError(f"profile {profile.name} has no expectations for lab {args.lab}; give a profile that does")
    world_sizes = args.world_sizes or (DEFAULT_WORLD_SIZES if not args.profile else
                                       sorted({ws for row in rows for ws in profile.labs[row].world_sizes}))
    lesson_root = lessons.lesson_root(args.lessons)
    if not lesson_root or lesson_root.startswith("file:"):  # the grader's files: no student on Gradescope opens them
        raise UsageError("feedback on Gradescope links the lessons on the web, and this is no checkout with an "
                         "https origin to link (or --lessons named local files); give --lessons URL (where students "
                         "read labs/, ending in /)")
    index = os.environ.get("TORCH_INDEX_URL", CPU_TORCH_INDEX)
    config = {"lab": args.lab, "profile": "profile.toml" if profile_file else profile_name,
              "world_sizes": world_sizes, "rubric": "rubric.toml", "lessons": lesson_root,
              "max_score": the_rubric.max_score, "needs": needs(profile, args.lab, world_sizes),
              "timeout_s": float(os.environ.get("AUTOGRADER_TIMEOUT_S", GRADESCOPE_TIMEOUT_S))}
    setup = SETUP.format(torch_index=f'--index-url "{index}" ' if index else "",
                         torch=_version("torch", "2.14.1"), torchvision=_version("torchvision", "0.29.1"))
    buffer = io.BytesIO()
    members: dict[str, str | bytes] = {"setup.sh": setup, "run_autograder": RUN.format(max_score=the_rubric.max_score),
               "autograder.json": json.dumps(config, indent=1) + "\n", "rubric.toml": the_rubric.path.read_text(),
               **({"profile.toml": profile_file.read_text()} if profile_file else {}), "distlab.tar": _package_tar()}
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as bundle:
        for name, content in members.items():
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            executable = name in ("setup.sh", "run_autograder")  # as Gradescope runs them
            info.external_attr = (0o755 if executable else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            bundle.writestr(info, content)
    out.write_bytes(buffer.getvalue())
    need = config["needs"]
    print(f"autograder bundle: {out} (setup.sh, run_autograder, autograder.json, rubric.toml, distlab.tar); "
          f"in Gradescope's autograder settings select at least {need['memory_bytes'] / (1 << 30):g} GB of memory "
          f"and {need['cpus']:g} CPU(s), and {need['speed_cpus']:g} CPUs for its speed to be judged", flush=True)
    return 0
