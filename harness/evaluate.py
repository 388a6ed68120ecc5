"""The harness's own measure of a training run's final accuracy, from the weights it observed.

The observer saved rank 0's final model state (final_weights.pt) and its digest (rank.0.json).
This loads that state, checks it is bitwise the observed one, builds the lab's model with the
shared code of labs/common/training.py (never the lab's own file), and evaluates it on the test
set the lab's own flags describe, all of it in one pass and on one process.

    python -m harness.evaluate --observe-dir RUN/observe -- --smoke --seed 0    # the lab's argv

prints one JSON object: accuracy, correct, total, the digests, or error. The grader calls
`measure()`, which runs that in a subprocess, so the grading process never loads torch.

Rank 0's weights on the whole test set is the canonical measure. A data-parallel lab reports the
sum of each rank's count on its own shard, each with that rank's own BatchNorm running statistics
(they differ between ranks, see harness/observed.py), so the two can differ, by a few images at
most, even for an honest lab.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WEIGHTS_FILE = "final_weights.pt"
BACKENDS = ["gloo", "nccl", "mpi", "horovod", "none"]  # any backend the lab ran with: it does not matter here


def measure(observe_dir: Path | str, lab_args: list[str], python: str = sys.executable,
            timeout_s: float = 300.0) -> dict[str, Any]:
    """Run the evaluation in a fresh process; returns its JSON (with "error" on any failure)."""
    env = {name: value for name, value in os.environ.items() if name != "DISTLAB_OBSERVE_DIR"}  # not observed
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    command = [python, "-m", "harness.evaluate", "--observe-dir", str(observe_dir), "--", *lab_args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=REPO, env=env,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"accuracy": None, "error": f"evaluation took longer than {timeout_s:g} s"}
    lines = done.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"accuracy": None, "error": f"evaluation exited with code {done.returncode}: {tail}"}


def evaluate(observe_dir: Path, lab_args: list[str]) -> dict[str, Any]:
    """Rank 0's observed final weights, evaluated on the lab's test set."""
    import torch

    from harness.observer.distlab_observer import state_digest
    from labs.common import training
    from labs.common.contract import add_contract_args

    rank0 = json.loads((observe_dir / "rank.0.json").read_text())
    observed = (rank0.get("model") or {}).get("state_sha256")
    if not observed:
        return {"accuracy": None, "error": "the observer found no trained model on rank 0"}
    weights = observe_dir / WEIGHTS_FILE
    if not weights.is_file():
        return {"accuracy": None, "error": f"no {WEIGHTS_FILE} in {observe_dir}"}
    state = torch.load(weights, map_location="cpu", weights_only=True)
    found = state_digest(state)
    if found != observed:
        return {"accuracy": None, "weights_sha256": found, "observed_sha256": observed,
                "error": f"{WEIGHTS_FILE} is not the state the observer saw on rank 0"}

    # The lab's own data and model flags, parsed by the shared parser; the lab's other flags are ignored.
    parser = argparse.ArgumentParser(prog="lab", add_help=False)
    add_contract_args(parser, BACKENDS, default_backend="none")
    training.add_training_args(parser)
    args, _ = parser.parse_known_args(lab_args)
    training.resolve_training_args(parser, args)

    model = training.build_model(args.stem)
    try:
        model.load_state_dict(state)
    except RuntimeError as error:
        return {"accuracy": None, "error": f"the final weights do not fit build_model({args.stem!r}): "
                                           f"{str(error).strip().splitlines()[0]}"}
    device = training.pick_device(args)
    model = model.to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    _, test_set = training.load_datasets(args)
    loader = training.test_loader(test_set, 4 * args.batch_size, args)  # the labs' evaluation batch
    correct, total = training.count_correct(model, loader, training.make_precision(args, device), args,
                                            device).tolist()
    return {"accuracy": correct / total, "correct": int(correct), "total": int(total), "weights_sha256": found,
            "observed_sha256": observed, "device": str(device), "precision": args.precision,
            "train_size": args.train_size, "error": None}  # train_size: for observed.checks(train_set_size=...)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--observe-dir", type=Path, required=True, help="the run's observe directory")
    parser.add_argument("lab_args", nargs=argparse.REMAINDER, help="-- then the lab's arguments, as launched")
    options = parser.parse_args(argv)
    lab_args = options.lab_args[1:] if options.lab_args[:1] == ["--"] else options.lab_args
    try:
        result = evaluate(options.observe_dir, lab_args)
    except SystemExit as stop:  # the shared parser refusing the lab's flags
        result = {"accuracy": None, "error": f"the lab's arguments do not parse (exit {stop.code})"}
    except Exception as error:  # noqa: BLE001 - one JSON line whatever happens
        result = {"accuracy": None, "error": f"{type(error).__name__}: {error}"}
    print(json.dumps(result), flush=True)
    return 0 if result.get("error") is None else 1


if __name__ == "__main__":
    sys.exit(main())
