"""`distlab grade-class SUBMISSIONS --autograder gradescope.zip`: a Gradescope autograder bundle.

Gradescope runs `setup.sh` once when it builds the course's image and `run_autograder` for each
submission, with the student's files in /autograder/submission, and reads
/autograder/results/results.json. The bundle carries this checkout (git archive of HEAD), the
rubric and the profile, so every submission is graded by the same harness as a class grade here:
the student's files become a class of one, graded by `distlab grade-class`, and its
gradescope/<id>/results.json is what Gradescope shows (hidden items stay hidden: each test carries
its visibility). Gradescope's own container isolates one submission from the others; bubblewrap
inside it needs namespaces, which Gradescope's containers may not grant: run_autograder then grades
with --no-sandbox and the results say so.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import zipfile
from pathlib import Path

from harness.catalog import REPO
from harness.classgrade import rubric
from harness.usage import UsageError

SETUP = """#!/usr/bin/env bash
# Gradescope: runs once, as root, when the autograder image is built.
set -euo pipefail
apt-get update
apt-get install -y --no-install-recommends bubblewrap python3 python3-venv python3-dev git make g++ util-linux
mkdir -p /autograder/source/distlab
tar -C /autograder/source/distlab -xf /autograder/source/distlab.tar
cd /autograder/source/distlab
make setup
"""

RUN = """#!/usr/bin/env bash
# Gradescope: runs once per submission; the student's files are in /autograder/submission.
set -uo pipefail
cd /autograder/source/distlab
class=/autograder/class
rm -rf "$class" && mkdir -p "$class/student"
cp -r /autograder/submission/. "$class/student/"
sandbox=()
if ! bwrap --unshare-net --unshare-pid --ro-bind / / true 2>/dev/null; then
  sandbox=(--no-sandbox)  # the container grants no namespaces: Gradescope's container is the isolation
fi
.nox/env/bin/distlab grade-class "$class" --lab {lab} --profile {profile} --rubric /autograder/source/rubric.toml \\
  --results /autograder/work --jobs 1 "${{sandbox[@]}}"
mkdir -p /autograder/results
cp /autograder/work/class/class/gradescope/student/results.json /autograder/results/results.json
"""


def write(args: argparse.Namespace) -> int:
    out: Path = args.autograder
    if out.exists():
        raise UsageError(f"{out} exists; give a new path for the bundle (nothing is overwritten)")
    the_rubric = rubric.load(args.rubric or rubric.DEFAULT.with_name(f"{args.lab}.toml"))
    profile = args.profile or "cpu-grade"
    profile_file = Path(profile) if Path(profile).is_file() else None  # a profile of the course's own travels along
    if profile_file:
        profile = "/autograder/source/profile.toml"
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", "HEAD"], capture_output=True)
    if archive.returncode != 0:
        raise UsageError(f"the bundle carries this checkout, but `git archive` failed in {REPO}: "
                         f"{archive.stderr.decode(errors='replace').strip()[:200]}")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as bundle:
        for name, text in (("setup.sh", SETUP), ("run_autograder", RUN.format(lab=args.lab, profile=profile))):
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o755 << 16  # executable, as Gradescope runs them
            bundle.writestr(info, text)
        bundle.writestr("rubric.toml", the_rubric.path.read_text())
        if profile_file:
            bundle.writestr("profile.toml", profile_file.read_text())
        bundle.writestr("distlab.tar", archive.stdout)
    out.write_bytes(buffer.getvalue())
    print(f"autograder bundle: {out} (setup.sh, run_autograder, rubric.toml, distlab.tar)")
    return 0
