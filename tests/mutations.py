"""Hand mutations of the grader, each a small change that makes it pass a wrong program, and the score
of the fast tests against them: `nox -s mutations` (or `python tests/mutations.py`).

Each mutation is made in a copy of the repository (the checkout is never touched); the fast tests
then run against the copy, and a mutation is caught when they fail. The goal is every one caught:
a survivor is a check no fast test protects. Issue 44 listed the five that survived the suite's fast
tests; they are the first five here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DP = "harness/observe/data_parallel.py"
SHARDS = "harness/observe/shards.py"
REPLICAS = "harness/observe/replicas.py"
VERDICTS = "harness/verdict/verdicts.py"
EVALUATE = "harness/verdict/evaluate.py"
# The fast tests that guard the checks and verdicts: no launch, seconds each.
FAST_TESTS = ["tests/test_grader_holds.py", "tests/test_grade.py", "tests/test_judged_right.py",
              "tests/test_streamed_passes.py"]

# name -> (file, the text replaced (found exactly once), its replacement)
MUTATIONS: dict[str, tuple[str, str, str]] = {
    "process_group ignores the backend": (
        DP, 'if not _backend_is(group, backend) or group["world_size"] != world_size:',
        'if group["world_size"] != world_size:'),
    "shards_cover accepts half the set": (
        SHARDS, "required = size - (global_batch - 1)", "required = size // 2"),
    "optimizer_steps_equal ignores the counts": (
        DP, "if len(set(steps.values())) > 1:", "if False:"),
    "sample_metric lets the claim stand in": (
        VERDICTS, "return sample.measured[name] if name in sample.measured else metric(sample.record, name)",
        "return sample.measured.get(name) if sample.measured.get(name) is not None else metric(sample.record, name)"),
    "observed_verdicts keeps the last repeat only": (
        EVALUATE, 'found = [check for s in samples for check in s.observed if check["name"] == name]',
        'found = [check for s in samples[-1:] for check in s.observed if check["name"] == name]'),
    "process_group ignores the world size": (
        DP, 'if not _backend_is(group, backend) or group["world_size"] != world_size:',
        'if not _backend_is(group, backend):'),
    "process_group forgets a missing rank": (
        DP, "    if missing:\n        problems.append", "    if False:\n        problems.append"),
    "shards_disjoint forgets a rank's own repeats": (
        SHARDS, "            if repeated:\n", "            if False:\n"),
    "shards_cover ignores indices outside the set": (
        SHARDS, "distinct >= required and not outside", "distinct >= required"),
    "shards_cover judges the first epoch only": (
        SHARDS, "for epoch in range(epochs):\n        passes", "for epoch in range(min(epochs, 1)):\n        passes"),
    "order_changes passes a repeated order": (
        SHARDS, "    if repeats:\n        return Check(name, False", "    if False:\n        return Check(name, False"),
    "replicas_identical ignores the parameters": (
        REPLICAS, "    if len(params) > 1:\n        groups", "    if False:\n        groups"),
    "one_writer allows two writers": (
        DP, "if len(who) > 1}", "if len(who) > 2}"),
    "a lesson in one repeat excuses another's failure": (
        EVALUATE, 'costing = [check for check in failing if not check.get("lesson")]',
        'costing = [check for check in failing[:1] if not check.get("lesson")]'),
    "parameters_trained passes parameters that never changed": (
        REPLICAS, 'unchanged = [rank for rank, t in evidence.items() if t["params_at_start"] == t["params_at_end"]]',
        "unchanged = []"),
    "replicas_in_step compares nothing": (
        REPLICAS, "        if len(set(digests.values())) > 1:\n", "        if False:\n"),
    "clock trusts a slowed clock": (
        "harness/observe/observations.py", "and clock < CLOCK_AGREEMENT * kernel - CLOCK_SLACK_S",
        "and clock < 0"),
    "inputs_from_loader lets most forwards be given more": (
        SHARDS, "if 2 * oversized > forwards:", "if oversized > forwards:"),
    "a pass rewritten after it was streamed is taken": (
        "harness/observe/observations.py", "        elif lines[number] != digest:\n", "        elif False:\n"),
    "a later line replaces the observer's": (
        "harness/run/output.py", "self._digests.setdefault((rank, pid, number), digest)",
        "self._digests[(rank, pid, number)] = digest"),
    "a decoy leaves the shard checks standing": (
        DP, "    if not inputs.passed:  # what the loader drew", "    if False:  # what the loader drew"),
}


def caught(name: str, python: str) -> bool:
    path, old, new = MUTATIONS[name]
    with tempfile.TemporaryDirectory(prefix="distlab-mutant-") as copy:
        shutil.copytree(REPO, copy, dirs_exist_ok=True, symlinks=True,
                        ignore=shutil.ignore_patterns(".git", ".nox", "results", "__pycache__"))
        source = Path(copy, path).read_text()
        if source.count(old) != 1:
            raise SystemExit(f"mutation {name!r}: {path} changed, the text to replace is not found once: {old!r}")
        Path(copy, path).write_text(source.replace(old, new))
        env = {**os.environ, "PYTHONPATH": copy}
        done = subprocess.run([python, "-m", "pytest", "-p", "no:cacheprovider", "-x", "-q", "-n", "0",
                               "-m", "not integration", *FAST_TESTS],
                              cwd=copy, env=env, capture_output=True, text=True, timeout=600)
        return done.returncode != 0


def main() -> int:
    names = sys.argv[1:] or list(MUTATIONS)
    survivors = []
    for name in names:
        killed = caught(name, sys.executable)
        print(f"{'caught  ' if killed else 'SURVIVED'} {name}", flush=True)
        if not killed:
            survivors.append(name)
    print(f"{len(names) - len(survivors)} of {len(names)} mutations caught by the fast tests ({', '.join(FAST_TESTS)})")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
