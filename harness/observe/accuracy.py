"""The harness's own measure of a training run's final accuracy, from the weights it observed.

The observer saved rank 0's final model state (final_weights.pt) and its digest (rank.0.json).
This loads that state, checks it is bitwise the observed one, builds the lab's model with the
shared code of labs/common (flags, data, models: never the lab's own file), and evaluates it on the test
set the lab's own flags describe, all of it in one pass and on one process.

    python -m harness.observe.accuracy --observe-dir RUN/observe -- --smoke --seed 0    # the lab's argv

prints one JSON object: accuracy, correct, total, the digests, or error. The grader keeps one
such process for the whole grade (`Evaluator`, `--serve`: one JSON request per line on stdin, one
answer per line): the grading process never loads torch, and the evaluating one loads it once, not
once per run (about 4 s of CPU each on a 2-core machine). It only reads what a run left behind,
between runs, so it cannot disturb one.

Rank 0's weights on the whole test set is the canonical measure. A data-parallel lab reports the
sum of each rank's count on its own shard; once the ranks hold one model (BatchNorm's running
statistics averaged, labs/TRAINING.md "One model at the end of training") that is the same model's
accuracy, within one test image (verdict/tolerances.accuracy_claim_tolerance). A program whose ranks kept their
own statistics counted each shard with another model: harness/observe/observations.py says so instead.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import select
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness import files
from harness.catalog import REPO
from harness.observe.observations import read_rank_file
from harness.on_ranks.observer.distlab_observer.fileformat import RANK_FILE, WEIGHTS_FILE

# Rank 0's final state as the observer saved it: ResNet-18's is 45 MB; a larger file is not the labs' model.
WEIGHTS_LIMIT = 512 << 20
BACKENDS = ["gloo", "nccl", "mpi", "horovod", "none"]  # any backend the lab ran with: it does not matter here


class Evaluator:
    """One evaluation process, started at the first request and kept for the next ones; a new one
    after a timeout or a crash. Close it (or use `with`): no process is left behind."""

    def __init__(self, python: str = sys.executable, timeout_s: float = 300.0) -> None:
        self.python, self.timeout_s = python, timeout_s
        self.process: subprocess.Popen[str] | None = None
        self.stderr: Any = None  # a temporary file: its last line says why a process ended

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self.close(kill=kind is not None)  # stopped (Ctrl-C): its answer is not wanted

    def _start(self) -> subprocess.Popen[str]:
        env = {name: value for name, value in os.environ.items() if name != "DISTLAB_OBSERVE_DIR"}  # not observed
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - open while the process lives
        # A session of its own: Ctrl-C on the terminal is the grade's to handle, and close() ends it.
        return subprocess.Popen([self.python, "-m", "harness.observe.accuracy", "--serve"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=self.stderr, text=True, cwd=REPO, env=env,
                                start_new_session=True)

    def measure(self, observe_dir: Path | str, lab_args: list[str]) -> dict[str, Any]:
        """Rank 0's final weights in `observe_dir` evaluated; "error" says why not."""
        if self.process is None or self.process.poll() is not None:
            self.close()
            self.process = self._start()
        request = json.dumps({"observe_dir": str(observe_dir), "lab_args": lab_args})
        try:
            self.process.stdin.write(request + "\n")  # type: ignore[union-attr]
            self.process.stdin.flush()  # type: ignore[union-attr]
            ready, _, _ = select.select([self.process.stdout], [], [], self.timeout_s)
            line = self.process.stdout.readline() if ready else None  # type: ignore[union-attr]
        except OSError:  # the process is gone: its stderr says why
            line = ""
        if line is None:
            self.close(kill=True)
            return {"accuracy": None, "error": f"evaluation took longer than {self.timeout_s:g} s"}
        try:
            return json.loads(line)
        except json.JSONDecodeError:  # no answer: the process ended, and its stderr says why
            return {"accuracy": None, "error": self.close(kill=True)}

    def close(self, kill: bool = False) -> str:
        """End the process: at the end of its input (it is idle between requests), or, with `kill`,
        killed unless it ends within 2 s. Returns how it ended ("" if none was running)."""
        ended = ""
        if self.process is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()  # type: ignore[union-attr]
            try:
                self.process.wait(timeout=2 if kill else 10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process.stdout.close()  # type: ignore[union-attr]
            self.stderr.seek(0)
            tail = (self.stderr.read().strip().splitlines() or ["no output"])[-1]
            ended = f"evaluation exited with code {self.process.returncode}: {tail}"
            self.stderr.close()
            self.process = self.stderr = None
        return ended


def measure_accuracy(observe_dir: Path, lab_args: list[str]) -> dict[str, Any]:
    """Rank 0's observed final weights, evaluated on the lab's test set."""
    import torch

    from harness.on_ranks.observer.distlab_observer.digests import state_digest
    from labs.common import data, flags, models
    from labs.common.contract import add_contract_args

    rank0 = read_rank_file(observe_dir / RANK_FILE.format(rank=0))
    observed = (rank0.get("model") or {}).get("state_sha256")
    if not observed:
        return {"accuracy": None, "error": "the observer found no trained model on rank 0"}
    try:  # what the run left: a regular file of bounded size, never through a link (harness/files.py)
        weights = files.read_regular_file(observe_dir / WEIGHTS_FILE, WEIGHTS_LIMIT)
    except FileNotFoundError:
        return {"accuracy": None, "error": f"no {WEIGHTS_FILE} in {observe_dir}"}
    state = torch.load(io.BytesIO(weights), map_location="cpu", weights_only=True)
    found = state_digest(state)
    if found != observed:
        return {"accuracy": None, "weights_sha256": found, "observed_sha256": observed,
                "error": f"{WEIGHTS_FILE} is not the state the observer saw on rank 0"}

    # The lab's own data and model flags, parsed by the shared parser; the lab's other flags are ignored.
    parser = argparse.ArgumentParser(prog="lab", add_help=False)
    add_contract_args(parser, BACKENDS, default_backend="none")
    flags.add_training_args(parser)
    args, _ = parser.parse_known_args(lab_args)
    flags.resolve_training_args(parser, args)

    model = models.build_model(args.stem)
    try:
        model.load_state_dict(state)
    except RuntimeError as error:
        return {"accuracy": None, "error": f"the final weights do not fit build_model({args.stem!r}): "
                                           f"{str(error).strip().splitlines()[0]}"}
    device = models.pick_device(args)
    model = model.to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    _, test_set = data.load_datasets(args)
    loader = data.test_loader(test_set, 4 * args.batch_size, args)  # the labs' evaluation batch
    correct, total = models.count_correct(model, loader, models.make_precision(args, device), args,
                                            device).tolist()
    return {"accuracy": correct / total, "correct": int(correct), "total": int(total), "weights_sha256": found,
            "observed_sha256": observed, "device": str(device), "precision": args.precision,
            "train_size": args.train_size, "error": None}  # train_size: for data_parallel.checks(train_set_size=...)


def answer(observe_dir: Path, lab_args: list[str]) -> dict[str, Any]:
    """`measure_accuracy`, with every failure turned into an "error": one JSON answer whatever happens."""
    try:
        return measure_accuracy(observe_dir, lab_args)
    except SystemExit as stop:  # the shared parser refusing the lab's flags
        return {"accuracy": None, "error": f"the lab's arguments do not parse (exit {stop.code})"}
    except Exception as error:  # noqa: BLE001
        return {"accuracy": None, "error": f"{type(error).__name__}: {error}"}


def serve() -> int:
    """Answer one request per line of stdin, until it ends. Only the answers go to stdout: whatever
    else is printed (a library's warning) goes to stderr."""
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    try:
        for line in sys.stdin:
            request = json.loads(line)
            answers.write(json.dumps(answer(Path(request["observe_dir"]), request["lab_args"])) + "\n")
            answers.flush()
    except KeyboardInterrupt:  # the grade was stopped: it closes this process itself
        return 130
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--observe-dir", type=Path, help="the run's observe directory")
    parser.add_argument("--serve", action="store_true",
                        help="answer JSON requests {observe_dir, lab_args}, one per line of stdin")
    parser.add_argument("lab_args", nargs=argparse.REMAINDER, help="-- then the lab's arguments, as launched")
    options = parser.parse_args(argv)
    if options.serve:
        return serve()
    if options.observe_dir is None:
        parser.error("--observe-dir is required (or --serve)")
    lab_args = options.lab_args[1:] if options.lab_args[:1] == ["--"] else options.lab_args
    result = answer(options.observe_dir, lab_args)
    print(json.dumps(result), flush=True)
    return 0 if result.get("error") is None else 1


if __name__ == "__main__":
    sys.exit(main())
