"""What the observer costs a training lab: the ddp lab with and without it, interleaved, same machine.

    .nox/env/bin/python tests/programs/observer_overhead.py --repeats 3 -- --smoke --train-size 1024

Each round runs the ddp lab twice through torchrun at world size 2 (1 thread per rank), once
plain and once observed (DISTLAB_OBSERVE_DIR set, harness/on_ranks/observer first on PYTHONPATH), the order
alternating between rounds so drifting load hits both alike. Prints each run's img_per_sec (the
lab's own, training steps only) and the ratio observed/plain of the medians and of the best runs.

Also times the hooks alone, in one process: the cost per DataLoader batch and per optimizer step,
which bounds the overhead better than the noisy end-to-end figure on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

HOOK_COST = """
import time, torch
data = torch.utils.data.TensorDataset(torch.zeros(4096, 1))
model = torch.nn.Linear(1, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
loader = torch.utils.data.DataLoader(data, batch_size=8)
best_fetch = best_step = float("inf")
for _ in range(20):
    started = time.perf_counter()
    for _ in loader:
        pass
    best_fetch = min(best_fetch, (time.perf_counter() - started) / len(loader))
    started = time.perf_counter()
    for _ in range(512):
        optimizer.step()
    best_step = min(best_step, (time.perf_counter() - started) / 512)
print(best_fetch * 1e6, best_step * 1e6)
"""


def lab_run(observed: bool, lab_args: list[str], where: Path) -> float:
    env = {k: v for k, v in os.environ.items() if k != "DISTLAB_OBSERVE_DIR"}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    if observed:
        env.update(DISTLAB_OBSERVE_DIR=str(where / "observe"),
                   PYTHONPATH=f"{REPO / 'harness' / 'on_ranks' / 'observer'}:{REPO}")
    record = where / "record.json"
    subprocess.run([str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", str(REPO / "labs/ddp/train.py"),
                    "--backend", "gloo", "--record", str(record), *lab_args], env=env, cwd=REPO, check=True,
                   capture_output=True, timeout=1800)
    if observed:
        assert (where / "observe" / "rank.1.json").exists(), "the observer did not write"
    return json.loads(record.read_text())["metrics"]["img_per_sec"]


def hook_cost(observed: bool, where: Path) -> tuple[float, float]:
    """Microseconds per DataLoader batch and per optimizer step, in a fresh process."""
    env = {k: v for k, v in os.environ.items() if k != "DISTLAB_OBSERVE_DIR"}
    env.update(OMP_NUM_THREADS="1")
    if observed:
        env.update(DISTLAB_OBSERVE_DIR=str(where / "hooks"), PYTHONPATH=str(REPO / "harness" / "on_ranks" / "observer"))
    out = subprocess.run([sys.executable, "-c", HOOK_COST], env=env, check=True, capture_output=True, text=True)
    fetch, step = map(float, out.stdout.split())
    return fetch, step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("lab_args", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    lab_args = options.lab_args[1:] if options.lab_args[:1] == ["--"] else options.lab_args
    lab_args = lab_args or ["--smoke", "--train-size", "1024"]
    rates: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(options.repeats):
            for observed in ((False, True) if round_ % 2 == 0 else (True, False)):
                where = Path(scratch) / f"{round_}-{observed}"
                where.mkdir()
                started = time.monotonic()
                rates[observed].append(lab_run(observed, lab_args, where))
                print(f"round {round_} {'observed' if observed else 'plain   '}: {rates[observed][-1]:.1f} img/s "
                      f"({time.monotonic() - started:.0f} s)", flush=True)
        # Alternating, best of each kind: other work on the machine can only slow a run down.
        costs = {False: [], True: []}
        for _ in range(5):
            for observed in (False, True):
                costs[observed].append(hook_cost(observed, Path(scratch)))
        plain, seen = ([min(c[i] for c in costs[observed]) for i in range(2)] for observed in (False, True))
    median = statistics.median(rates[True]) / statistics.median(rates[False])
    best = max(rates[True]) / max(rates[False])
    print(f"ddp lab {' '.join(lab_args)}: observed/plain img_per_sec, medians {median:.3f}, best runs {best:.3f}")
    print(f"hooks alone: a DataLoader batch {plain[0]:.1f} -> {seen[0]:.1f} us, an optimizer step "
          f"{plain[1]:.1f} -> {seen[1]:.1f} us")


if __name__ == "__main__":
    main()
