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
accuracy, within one test image (verdict/tolerances.accuracy_claim_tolerance). A program whose ranks
hold different models counted each shard with another model: where the ranks' final states differ,
every rank's own model (final_weights.<r>.pt) is evaluated on the test images that rank evaluated
last (its observed evaluation pass), so that a claim can be compared with what it counted
(`own_models`; observe/data_parallel.accuracy_claim).

The same process loads the last checkpoint each rank saved (checkpoint_loads.py).
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
from harness.observe.checkpoint_loads import checkpoints
from harness.observe.observations import read_rank_file
from harness.on_ranks.observer.distlab_observer.fileformat import RANK_FILE, RANK_FILES, WEIGHTS_FILE
from labs.common.host import tightest_memory_limit

# Rank 0's final state as the observer saved it: ResNet-18's is 45 MB; a larger file is not the labs' model.
WEIGHTS_LIMIT = 512 << 20
BACKENDS = ["gloo", "nccl", "mpi", "horovod", "none"]  # any backend the lab ran with: it does not matter here


# The least memory (this process's cgroup limit) beside which the evaluating process is kept between
# requests. It holds torch, the model and the test set (about 450 MB of its own with PyPI's CUDA torch
# wheel), idle beside the next run's launcher and ranks. Measured on one submission's cpu-smoke grade at
# two ranks (docs/grading-class.md, "The smallest box"): 2.5 GB with it kept, no process killed; at 2 GB
# the limit killed a rank; started afresh for each request instead (5-13 s each), 2 GB held.
KEEP_WARM_BYTES = 5 << 29  # 2.5 GiB


def keeps_warm(limit: int | None = None) -> bool:
    """Whether an evaluating process may wait beside the runs: no memory limit, or one of KEEP_WARM_BYTES or more."""
    limit = tightest_memory_limit() if limit is None else limit
    return limit is None or limit >= KEEP_WARM_BYTES


class Evaluator:
    """One evaluation process, started at the first request and kept for the next ones (`warm`), or
    ended after each answer where memory is short (keeps_warm); a new one after a timeout or a crash.
    Close it (or use `with`): no process is left behind."""

    def __init__(self, python: str = sys.executable, timeout_s: float = 300.0, warm: bool | None = None) -> None:
        self.python, self.timeout_s = python, timeout_s
        self.warm = keeps_warm() if warm is None else warm
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

    def measure(self, observe_dir: Path | str, lab_args: list[str], more_dirs: list[Path] | None = None,
                roots: list[Path] | None = None) -> dict[str, Any]:
        """Rank 0's final weights in `observe_dir` evaluated, every rank's own where they differ, and the
        last checkpoints loaded; "error" says why the accuracy was not measured. `more_dirs`: the observe
        folders of the run's other nodes; `roots`: folders besides the run's own whose files may be read
        (a two-host cell's shared folder)."""
        if self.process is None or self.process.poll() is not None:
            self.close()
            self.process = self._start()
        asked: dict[str, Any] = {"observe_dir": str(observe_dir), "lab_args": lab_args}
        if more_dirs or roots:
            asked.update(more_dirs=[str(d) for d in more_dirs or []], roots=[str(r) for r in roots or []])
        request = json.dumps(asked)
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None  # _start: stdin=PIPE, stdout=PIPE
        try:
            stdin.write(request + "\n")
            stdin.flush()
            ready, _, _ = select.select([stdout], [], [], self.timeout_s)
            line = stdout.readline() if ready else None
        except OSError:  # the process is gone: its stderr says why
            line = ""
        if line is None:
            self.close(kill=True)
            return {"accuracy": None, "error": f"evaluation took longer than {self.timeout_s:g} s"}
        try:
            answer = json.loads(line)
        except json.JSONDecodeError:  # no answer: the process ended, and its stderr says why
            return {"accuracy": None, "error": self.close(kill=True)}
        if not self.warm:  # its memory back before the next run starts
            self.close()
        return answer

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


def lab_flags(lab_args: list[str]) -> argparse.Namespace:
    """The lab's own data and model flags, parsed by the shared parser; the lab's other flags are ignored."""
    from labs.common import flags
    from labs.common.contract import add_contract_args

    parser = argparse.ArgumentParser(prog="lab", add_help=False)
    add_contract_args(parser, BACKENDS, default_backend="none")
    flags.add_training_args(parser)
    args, _ = parser.parse_known_args(lab_args)
    flags.resolve_training_args(parser, args)
    return args


def rank_files(observe_dirs: list[Path]) -> dict[int, tuple[Path, dict[str, Any]]]:
    """Every rank's observations in these folders (a node's each), by rank: the folder and the file."""
    found: dict[int, tuple[Path, dict[str, Any]]] = {}
    for directory in observe_dirs:
        for path in sorted(directory.glob(RANK_FILES)):
            with contextlib.suppress(OSError, ValueError):
                data = read_rank_file(path)
                found.setdefault(int(data["rank"]), (directory, data))
    return found


def final_state(directory: Path, observed: dict[str, Any], rank: int) -> tuple[dict[str, Any] | None, str | None]:
    """A rank's final state as the observer saved it, checked against the digest it observed; or why not."""
    import torch

    from harness.on_ranks.observer.distlab_observer.digests import state_digest

    model = observed.get("model") or {}
    name = model.get("weights_file") or (WEIGHTS_FILE if rank == 0 else None)
    if not model.get("state_sha256"):
        return None, f"the observer found no trained model on rank {rank}"
    if not name or "/" in name or name.startswith("."):
        return None, f"rank {rank} left no final weights (an observer before version 2, or a stopped attempt)"
    try:  # what the run left: a regular file of bounded size, never through a link (harness/files.py)
        weights = files.read_regular_file(directory / name, WEIGHTS_LIMIT)
    except FileNotFoundError:
        return None, f"no {name} in {directory}"
    state = torch.load(io.BytesIO(weights), map_location="cpu", weights_only=True)
    if state_digest(state) != model["state_sha256"]:
        return None, f"{name} is not the state the observer saw on rank {rank}"
    return state, None


def measure_accuracy(observe_dir: Path, lab_args: list[str], more_dirs: list[Path] | None = None,
                     roots: list[Path] | None = None) -> dict[str, Any]:
    """Rank 0's observed final weights, evaluated on the lab's test set; every rank's own model on what
    it evaluated where the ranks' states differ; each rank's last checkpoint loaded."""
    import torch

    from harness.on_ranks.observer.distlab_observer.digests import state_digest
    from labs.common import data, models

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

    args = lab_flags(lab_args)
    ranks = rank_files([observe_dir, *(more_dirs or [])])
    run_roots = [observe_dir.parent, *(roots or [])]  # the run's folder: observe/ is in it

    model = models.build_model(args.stem)
    try:
        model.load_state_dict(state)
    except RuntimeError as error:  # a model of the program's own: its checkpoints are held against its state
        return {"accuracy": None, "error": f"the final weights do not fit build_model({args.stem!r}): "
                                           f"{str(error).strip().splitlines()[0]}",
                "checkpoints": checkpoints(ranks, run_roots, state, None)}
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
            "train_size": args.train_size, "error": None,  # train_size: for data_parallel.checks(train_set_size=...)
            "checkpoints": checkpoints(ranks, run_roots, state, lambda: models.build_model(args.stem)),
            "own_models": own_models(ranks, observed, test_set, args, device)}


def own_models(ranks: dict[int, tuple[Path, dict[str, Any]]], rank0_digest: str, test_set: Any,
               args: argparse.Namespace, device: Any) -> dict[str, Any] | None:
    """Where the ranks' final states differ: each rank's own model on the test images of its last
    evaluation pass after training ({"ranks": {r: {"correct", "total"}}}, ranks that evaluated
    nothing of the test set left out), or "error" saying why it could not be measured. None where
    every rank holds rank 0's state: rank 0's measure is every rank's."""
    import torch

    from labs.common import data, models

    digests = {rank: (observed.get("model") or {}).get("state_sha256") for rank, (_, observed) in ranks.items()}
    if all(digest == rank0_digest for digest in digests.values()):
        return None
    evaluated: dict[int, list[int]] = {}
    for rank, (_, observed) in sorted(ranks.items()):
        indices = last_evaluation(observed, len(test_set))
        if indices is not None:
            evaluated[rank] = indices
    if not evaluated:
        return {"ranks": {}, "error": f"no rank evaluated a set of the test set's length ({len(test_set)}) after "
                                      "its last training pass"}
    precision = models.make_precision(args, device)
    correct_by_digest: dict[str | None, torch.Tensor] = {}  # None: a rank's model without a digest
    counted = {}
    for rank, indices in evaluated.items():
        digest = digests[rank]
        if digest not in correct_by_digest:
            directory, observed = ranks[rank]
            state, problem = final_state(directory, observed, rank)
            if state is None:
                return {"ranks": {}, "error": problem}
            model = models.build_model(args.stem)
            model.load_state_dict(state)
            model = model.to(device)
            if args.channels_last:
                model = model.to(memory_format=torch.channels_last)
            correct_by_digest[digest] = correct_per_image(model, data.test_loader(test_set, 4 * args.batch_size, args),
                                                          precision, args, device)
        right = correct_by_digest[digest]
        counted[str(rank)] = {"correct": int(right[torch.as_tensor(indices, dtype=torch.long)].sum()),
                              "total": len(indices)}
    return {"ranks": counted, "error": None}


def last_evaluation(observed: dict[str, Any], test_size: int) -> list[int] | None:
    """The sample indices of a rank's last pass without an optimizer step after its last training pass,
    over a dataset of the test set's length: what it last evaluated (None: nothing such)."""
    passes = observed.get("loader_passes") or []
    last_training = max((i for i, p in enumerate(passes) if p.get("steps")), default=None)
    if last_training is None:
        return None
    for p in reversed(passes[last_training + 1:]):
        if not p.get("steps") and p.get("dataset_len") == test_size and not p.get("non_integer") and p.get("indices"):
            indices = p["indices"]
            return indices if all(0 <= i < test_size for i in indices) else None
    return None


def correct_per_image(model: Any, loader: Any, precision: Any, args: argparse.Namespace, device: Any) -> Any:
    """Whether the model's answer is right, for each test image in order (models.count_correct's loop)."""
    import torch

    from labs.common import models

    model.eval()
    right = []
    with torch.no_grad():
        for images, labels, _ in loader:
            images, labels = models.to_device(images, labels, device, args.channels_last)
            with precision.autocast():
                right.append((model(images).argmax(dim=1) == labels).cpu())
    return torch.cat(right)


def answer(observe_dir: Path, lab_args: list[str], more_dirs: list[Path] | None = None,
           roots: list[Path] | None = None) -> dict[str, Any]:
    """`measure_accuracy`, with every failure turned into an "error": one JSON answer whatever happens."""
    try:
        return measure_accuracy(observe_dir, lab_args, more_dirs, roots)
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
            answers.write(json.dumps(answer(Path(request["observe_dir"]), request["lab_args"],
                                            [Path(d) for d in request.get("more_dirs", [])],
                                            [Path(r) for r in request.get("roots", [])])) + "\n")
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
