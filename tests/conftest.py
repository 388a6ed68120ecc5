"""Shared fixtures. Integration tests drive labs exactly as users do: through `distlab run`."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.run.launchers import find_tool
from harness.run.record import validate

DISTLAB = str(Path(sys.executable).parent / "distlab")

# Horovod and MPI come with `make setup`; a host may lack them (the GPU machine has neither), and a
# test that needs one skips, saying so, rather than fail on the missing launcher.
HOROVOD = importlib.util.find_spec("horovod") is not None and find_tool("horovodrun") is not None
MPI = importlib.util.find_spec("mpi4py") is not None and find_tool("mpirun") is not None
needs_horovod = pytest.mark.skipif(not HOROVOD, reason="Horovod is not installed here (`make setup` builds it)")
needs_mpi = pytest.mark.skipif(not MPI, reason="no MPI here (mpirun and mpi4py: `make setup` installs them)")


def needs(launcher: str | None, backend: str | None) -> list[pytest.MarkDecorator]:
    """The skip marks of a run through this launcher on this backend."""
    horovod = backend == "horovod" or launcher == "horovodrun"
    return [*([needs_horovod] if horovod else []), *([needs_mpi] if launcher == "mpirun" or backend == "mpi" else [])]


@dataclass
class LabRun:
    returncode: int
    output: str
    run_dir: Path | None
    record: dict[str, Any] | None
    run: dict[str, Any] | None  # the harness's run.json

    def why(self) -> str:
        """For a failed assertion: the harness's reason, then the end of the output (its start is the
        ranks' warnings, and pytest cuts a long message in the middle)."""
        return f"reason: {(self.run or {}).get('reason')}\n...{self.output[-4000:]}"


CHECKOUT = Path(__file__).resolve().parent.parent


def tracked_files() -> list[str]:
    """What a clone of this worktree would hold: the files git knows, and new ones it does not ignore."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=CHECKOUT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    return [name for name in listed if name and (CHECKOUT / name).is_file()]


def clone_of_checkout(source: Path) -> Path:
    """What a clone of this worktree would hold, copied to `source` (a checkout's build/, .nox/ and
    stray files stay out)."""
    for name in tracked_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(CHECKOUT / name, source / name)
    return source


def build_wheel(source: Path, dist: Path) -> Path:
    """distlab's wheel as `make gpu-wheels` and a release build it, from a clone of this checkout in
    `source` (this environment's setuptools: no download)."""
    clone_of_checkout(source)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                    "--wheel-dir", str(dist), str(source)], check=True, timeout=600)
    (found,) = dist.glob("distlab-*.whl")
    return found


def python_without_distlab(venv: Path) -> Path:
    """A Python as a host without distlab has one: a venv borrowing this environment's third-party
    packages (torch, numpy, pip, ...) by a .pth line. Site-packages added that way is a plain path,
    whose own .pth files (the editable install's finder for the checkout's harness/ and labs/) are
    never run: `import harness` fails there, as on the GPU machine."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # This environment's site-packages, and those another .pth line added (nox -s gpu-proxy-tests: the GPU host's).
    borrowed = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                       *(p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir())})
    (site / "zz_borrowed_packages.pth").write_text("".join(f"{path}\n" for path in borrowed))
    # torch's own launcher, as pip installing torch puts it beside the interpreter (the harness looks
    # there first): a venv that borrows torch by a path line gets no scripts, and PATH may have none.
    torchrun = venv / "bin" / "torchrun"
    torchrun.write_text(f"#!{python}\nimport sys\nfrom torch.distributed.run import main\nsys.exit(main())\n")
    torchrun.chmod(0o755)
    return python


@pytest.fixture
def python_others_may_run():
    """uid mode runs the job's program with this Python as another user: where it lies below a folder
    closed to others (pyenv's under /root here), that folder is opened for passing through (o+x, never
    listing) for the test, and closed again after."""
    opened = []
    for folder in Path(os.path.realpath(sys.executable)).parents:
        mode = os.stat(folder).st_mode
        if not mode & 0o001:
            os.chmod(folder, mode | 0o001)
            opened.append((folder, mode))
    yield
    for folder, mode in opened:
        os.chmod(folder, mode)


def run_distlab(args: list[str], timeout: float = 600, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DISTLAB, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          stdin=subprocess.DEVNULL)


def rank_observation(rank: int, **fields: Any) -> dict[str, Any]:
    """A rank's observations in the observer's format (harness/schemas/observations.schema.json), made
    up for a test: the fields given, the rest as a rank that observed nothing would have them. Each
    loader pass given is completed the same way."""
    passes = [{"loader": 0, "dataset": 0, "dataset_len": None, "sampler": "SequentialSampler", "batches": 0,
               "steps": 0, "batch_sizes": [], "non_integer": False, "indices": [], "started": 0.0,
               "step_times": [], "step_images": [], **p} for p in fields.pop("loader_passes", [])]
    groups = [{"api": "torch.distributed", "seen_at": "init_process_group", **g}
              for g in fields.pop("process_groups", [])]
    model = fields.pop("model", None)
    if model is not None:
        model = {"class": "Net", "tensors": 0, "state_sha256": "0" * 64, "params_sha256": "0" * 64,
                 "buffers_sha256": "0" * 64, "buffers": {}, "weights_file": None, **model}
    return {"schema": "distlab-observations", "schema_version": 1, "rank": rank, "rank_source": "env RANK",
            "pid": 1000 + rank, "argv": ["train.py"], "process_groups": groups, "optimizer_steps": 0,
            "loader_passes": passes, "saves": [], "model": model, "errors": [], **fields}


def write_rank_observation(folder: Path, rank: int, **fields: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"rank.{rank}.json"
    path.write_text(json.dumps(rank_observation(rank, **fields)))
    return path


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def pytest_collection_modifyitems(config, items):
    """Tests marked `alone` first, then those marked `long`, the order otherwise kept. At the start,
    the other workers are in their first tests, of seconds, so the wait for the machine is short.
    Handed out later, one waited for whatever long test another worker had just begun (48 s, for the
    smoke grade, in one run here), with the third worker held at the gate all that time. The long
    ones next, longest work first: handed out last, one grade of the tutorial's two cells ran by
    itself for the suite's last 445 s while two workers had nothing left. pytest-xdist hands tests
    out in this order with --no-loadscope-reorder (noxfile.py); a group goes where its first test is."""
    items.sort(key=lambda item: (item.get_closest_marker("alone") is None, item.get_closest_marker("long") is None))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Tests marked `alone` get the machine to themselves; every other test shares it.

    The suite runs three workers on two cores, and what one worker runs slows another by anything
    from nothing to 3x (a 4-rank run beside a 2-rank one). No ratio floor survives that, so a test
    that asserts a speed verdict waits for the other workers' tests to end and keeps them waiting
    until it is done: a readers-writer lock on two files, shared by the workers of one session.
    Held around the whole item, so the module fixtures it sets up or tears down run inside it too.
    Whoever waits for the machine holds the gate, so a test marked `alone` is not starved by the
    shared ones."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:  # one process: nothing runs beside the test
        yield
        return
    folder = Path(item.config.option.basetemp).parent  # xdist puts each worker's basetemp in the session's
    alone = item.get_closest_marker("alone") is not None
    with open(folder / "gate.lock", "a") as gate, open(folder / "machine.lock", "a") as machine:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(machine, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield  # closing the files releases what is still held


@pytest.fixture
def results(tmp_path: Path) -> Path:
    return tmp_path / "results"


def run_lab(results: Path, lab: str, world_size: int, lab_args: list[str] | tuple[str, ...] = (),
            launcher: str | None = None, backend: str | None = None, threads: int | None = 1, timeout: float = 300,
            extra: list[str] | tuple[str, ...] = ()) -> LabRun:
    """`distlab run LAB` into `results`, as a user runs it; what it printed and left behind."""
    args = ["run", lab, "--world-size", str(world_size), "--results", str(results), "--timeout", str(timeout)]
    if launcher:
        args += ["--launcher", launcher]
    if backend:
        args += ["--backend", backend]
    if threads:
        args += ["--threads", str(threads)]
    args += [*extra, "--", *lab_args]
    done = run_distlab(args, timeout=timeout + 120)
    output = done.stdout + done.stderr
    run_dir = None
    for line in output.splitlines():
        if line.startswith("run directory: "):
            run_dir = Path(line.split(": ", 1)[1].strip())
    return LabRun(done.returncode, output, run_dir,
                  _load(run_dir / "record.json") if run_dir else None,
                  _load(run_dir / "run.json") if run_dir else None)


@pytest.fixture
def distlab_run(results: Path):
    """result = distlab_run("ddp", world_size=2, lab_args=["--smoke"], launcher=None, backend=None)"""

    def run(lab: str, world_size: int, lab_args: list[str] | tuple[str, ...] = (), **options: Any) -> LabRun:
        return run_lab(results, lab, world_size, lab_args, **options)

    return run


@pytest.fixture
def run_main(monkeypatch, capsys):
    """Call a lab's main() in this process with argv; return its exit code and stderr.

    For bad-input tests: the lab must stop with SystemExit before starting anything.
    """

    def call(main, program: str, *argv: str) -> tuple[int, str]:
        monkeypatch.setattr(sys, "argv", [program, *argv])
        with pytest.raises(SystemExit) as stop:
            main()
        return stop.value.code, capsys.readouterr().err

    return call


# ------------------------------------------------------------------------ the training labs' records

SMOKE_TRAIN_IMAGES, SMOKE_BATCH, SMOKE_LR = 256, 32, 0.025  # the smoke profile (labs/common/flags.py SMOKE)
DISTRIBUTED_CHECKS = {"params_identical", "buffers_identical", "shards_disjoint", "shards_cover",
                      "order_changes_per_epoch"}


def assert_valid_record(record: dict, lab: str, world_size: int, train_images: int) -> None:
    """A smoke run's record, valid and consistent; for a distributed lab, with every rank's report."""
    record = validate(record)
    assert (record["lab"], record["status"], record["provenance"]["world_size"]) == (lab, "ok", world_size)
    metrics, epochs = record["metrics"], record["config"]["epochs"]
    assert len(metrics["train_loss"]) == len(metrics["test_accuracy"]) == len(metrics["epoch_seconds"]) == epochs
    assert metrics["img_per_sec"] > 0 and metrics["final_accuracy"] == metrics["test_accuracy"][-1]
    assert metrics["global_batch"] == SMOKE_BATCH * world_size
    assert metrics["peak_lr"] == pytest.approx(SMOKE_LR * world_size)  # the linear scaling rule
    if lab == "baseline":
        return
    # The run's rate is the sum of what each rank timed, not rank 0's alone.
    assert metrics["img_per_sec"] == pytest.approx(sum(r["img_per_sec"] for r in record["ranks"]))
    assert len({r["params_sha256"] for r in record["ranks"]}) == 1
    assert {name: check["passed"] for name, check in record["checks"].items()} == dict.fromkeys(DISTRIBUTED_CHECKS,
                                                                                                 True)
    assert [r["rank"] for r in record["ranks"]] == list(range(world_size))
    # The fingerprints alone let a grader see the shards and the reshuffle.
    trained = train_images // metrics["global_batch"] * metrics["global_batch"]
    orders = metrics["sample_order"]
    assert [epoch["epoch"] for epoch in orders] == list(range(epochs))
    for epoch in orders:
        assert sum(rank["count"] for rank in epoch["ranks"]) == trained
    for rank in range(world_size):
        assert orders[0]["ranks"][rank]["sha256"] != orders[1]["ranks"][rank]["sha256"]
