"""The harness's observer and its checks: it must see what torch did on every rank, whatever the program says.

Programs run through the real launchers (torchrun, horovodrun) with the environment the runner
gives them: DISTLAB_OBSERVE_DIR, and harness/on_ranks/observer first on PYTHONPATH. The real ddp lab passes
every check here; so does horovod's (on its record run, in tests/test_training_labs.py). A small DDP
program written from scratch (tests/programs/ddp_program.py) passes every check, and each classic
mistake fails exactly its own, where the grader meets them: tests/test_grade_mutations.py.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_rank_observation

from harness.observe import accuracy, data_parallel, observations
from harness.observe.check import Check
from harness.on_ranks.observer.distlab_observer.fileformat import parse_pass_line

REPO = Path(__file__).resolve().parents[1]
OBSERVER = REPO / "harness" / "on_ranks" / "observer"
BIN = Path(sys.executable).parent
TIMEOUT_S = 300
SMOKE_TRAIN_IMAGES = 256  # labs/common/flags.py's SMOKE profile


def observed_env(observe_dir: Path | None, **extra: str) -> dict[str, str]:
    """The environment the runner gives every rank: the observer first on PYTHONPATH, then the repository."""
    env = {k: v for k, v in os.environ.items() if k != "DISTLAB_OBSERVE_DIR"}
    env.update({"PYTHONPATH": os.pathsep.join([str(OBSERVER), str(REPO)]), "OMP_NUM_THREADS": "1",
                "PYTHONUNBUFFERED": "1", **extra})
    if observe_dir is not None:
        env["DISTLAB_OBSERVE_DIR"] = str(observe_dir)
    return env


def launch(command: list[str], observe_dir: Path | None, **extra: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, env=observed_env(observe_dir, **extra), cwd=REPO, capture_output=True, text=True,
                          timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def torchrun(args: list[str], observe_dir: Path) -> subprocess.CompletedProcess[str]:
    return launch([str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", *args], observe_dir)


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {check.name: check for check in checks}


def failing(checks: list[Check]) -> dict[str, str]:
    return {check.name: check.detail for check in checks if not check.passed}


# ----------------------------------------------------------------------------- the observer stays out of the way


def test_inactive_without_observe_dir_and_lazy_about_torch(tmp_path):
    # A library asking whether torch is installed (find_spec) neither imports it nor disarms the hooks.
    probe = ("import importlib.util, sys; importlib.util.find_spec('torch'); "
             "print('distlab_observer' in sys.modules, 'torch' in sys.modules, "
             "'torch' in getattr(sys.meta_path[0], 'callbacks', {}))")
    off = launch([sys.executable, "-c", probe], None)
    assert off.stdout.split() == ["False", "False", "False"]  # nothing loaded at all
    on = launch([sys.executable, "-c", probe], tmp_path / "observe")
    assert on.stdout.split() == ["True", "False", "True"]  # armed, but torch is not imported for it
    assert not (tmp_path / "observe").exists()  # a process that observed nothing writes nothing


def test_chains_the_sitecustomize_it_shadows(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITECUSTOMIZE_RAN'] = '1'\n")
    probe = "import os, sys; print(os.environ.get('OTHER_SITECUSTOMIZE_RAN'), 'distlab_observer' in sys.modules)"
    for observe_dir in (None, tmp_path / "observe"):
        env_path = os.pathsep.join([str(OBSERVER), str(other), str(REPO)])
        done = launch([sys.executable, "-c", probe], observe_dir, PYTHONPATH=env_path)
        assert done.stdout.split() == ["1", str(observe_dir is not None)]


def test_a_failing_observer_never_changes_the_program(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    script = ("import torch\n"
              "m = torch.nn.Linear(2, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
              "for x in torch.utils.data.DataLoader(torch.ones(8, 2), batch_size=4):\n"
              "    m(x).sum().backward(); o.step()\n"
              "print('trained', o.state_dict()['state'] == {})\n")
    done = launch([sys.executable, "-c", script], blocker / "observe")  # cannot be created: a file is in the way
    assert done.stdout == "trained True\n"
    # On stderr only the observer's line for the one pass (fileformat.PASS_LINE), as it ended.
    assert [parse_pass_line(line) is not None for line in done.stderr.splitlines()] == [True], done.stderr


# A resume cell's stop, where one rank reaches it late: rank 0 sleeps between the backward pass (whose
# all-reduce both ranks finished) and the step at which the observer stops both.
LATE_RANK = """
import os, time, torch, torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
sampler = DistributedSampler(data)
for epoch in range(2):
    sampler.set_epoch(epoch)
    for x, y in DataLoader(data, batch_size=4, sampler=sampler):
        torch.nn.functional.mse_loss(model(x), y).backward()
        if epoch == 1 and dist.get_rank() == 0:
            time.sleep(3)
        optimizer.step()
        optimizer.zero_grad()
"""


@pytest.mark.integration
def test_a_stop_keeps_every_ranks_observations_when_one_rank_reaches_it_late(tmp_path):
    """torchrun ends the other ranks as soon as one exits: before the stopped ranks waited for each other,
    rank 1 exited at the stop and rank 0, still before it, was ended with nothing written (CI, issue 49)."""
    program = tmp_path / "late_rank.py"
    program.write_text(LATE_RANK)
    observe = tmp_path / "observe"
    done = subprocess.run([str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", str(program)],
                          env=observed_env(observe, DISTLAB_STOP_AFTER_EPOCHS="1"), cwd=tmp_path,
                          capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    assert done.returncode != 0, done.stderr[-3000:]  # stopped, and torchrun was given no restart
    stopped = {path.name: json.loads(path.read_text())["stopped"] for path in (observe / "stopped").glob("rank.*.json")}
    at_the_stop = {"after_epochs": 1, "steps": 4}  # 32 samples, 2 ranks, batches of 4: 4 steps an epoch
    assert stopped == {"rank.0.json": at_the_stop, "rank.1.json": at_the_stop}, done.stderr[-3000:]


# ------------------------------------------------------------------------------------ the checks on made-up ranks


def test_order_check_not_applicable_with_one_epoch(tmp_path):
    for rank in (0, 1):
        write_rank_observation(tmp_path, rank, optimizer_steps=2, process_groups=[
            {"api": "torch.distributed", "backend": "gloo", "world_size": 2, "rank": rank}],
            loader_passes=[{"loader": 0, "dataset_len": 8, "sampler": "DistributedSampler", "batches": 2,
                            "steps": 2, "batch_sizes": [2], "indices": [rank, rank + 2, rank + 4, rank + 6]}])
    seen = by_name(data_parallel.checks(observations.load(tmp_path), "gloo", 2))
    order = seen["order_changes_per_epoch"]
    assert (order.passed, order.applicable) == (True, False)
    assert order.detail.startswith("not applicable")
    assert seen["shards_disjoint"].passed and seen["shards_cover"].passed and seen["process_group"].passed
    assert not seen["replicas_identical"].passed  # no model observed: nothing vouches for the replicas


def timed_epochs(tmp_path: Path, epochs_per_rank: dict[int, list[dict]]) -> observations.Observations:
    """Observations of ranks whose training passes carry the observer's step timings."""
    for rank, epochs in epochs_per_rank.items():
        passes = [{"loader": 0, "dataset_len": 64, "sampler": "DistributedSampler", "batches": len(e["step_times"]),
                   "steps": len(e["step_times"]), "batch_sizes": [8], "indices": [], **e} for e in epochs]
        write_rank_observation(tmp_path, rank, optimizer_steps=8, loader_passes=passes)
    return observations.load(tmp_path)


def test_the_harness_times_training_after_the_warm_up_and_between_epochs_only(tmp_path):
    # Rank 0: 8 images a step. Epoch 0 starts at t=0, steps end at 1, 2, 3, 5, 7: the warm-up (3 steps)
    # ends at t=3, then 2 steps (16 images) in 4 s. Epoch 1 starts at t=100 (after evaluation): 3 steps
    # in 6 s. 40 images in 10 s. Rank 1 the same, twice as fast: 40 images in 5 s. The run: 4 + 8.
    def rank(scale: float) -> list[dict]:
        return [{"started": 0.0, "step_times": [scale * t for t in (1, 2, 3, 5, 7)],
                 "step_images": [8, 16, 24, 32, 40]},
                {"started": 100.0, "step_times": [100 + scale * t for t in (2, 4, 6)], "step_images": [8, 16, 24]}]

    seen = timed_epochs(tmp_path, {0: rank(1.0), 1: rank(0.5)})
    assert observations.throughput(seen) == pytest.approx(4.0 + 8.0)
    # Without a warm-up: from each epoch's start, 64 images in 7 + 6 s on rank 0, in 3.5 + 3 s on rank 1.
    assert observations.throughput(seen, warmup_steps=0) == pytest.approx(64 / 13 + 64 / 6.5)


def test_without_timed_training_there_is_no_throughput(tmp_path):
    (tmp_path / "short").mkdir()
    short = {"started": 0.0, "step_times": [1.0, 2.0, 3.0], "step_images": [8, 16, 24]}  # all warm-up
    assert observations.throughput(timed_epochs(tmp_path / "short", {0: [short]})) is None
    (tmp_path / "old").mkdir()  # an older observer's file: steps, but no timings
    old = timed_epochs(tmp_path / "old", {0: [{"step_times": [1.0, 2.0, 3.0, 4.0]}]})
    assert observations.throughput(old) is None


def replica_ranks(tmp_path: Path, buffers: dict[int, dict[str, str]], params: dict[int, str] | None = None,
                  evaluating: tuple[int, ...] = ()) -> list[Check]:
    """The checks of ranks whose final models have these buffer digests (name -> digest), each held by
    a BatchNorm, and these parameter digests (default: all equal); the ranks in `evaluating` ran a
    loader pass without a step after their training pass (an evaluation)."""
    for rank, digests in buffers.items():
        model = {"params_sha256": (params or {}).get(rank, "f" * 64),
                 "buffers_sha256": "".join(digests[name] for name in sorted(digests)),
                 "buffers": {name: {"sha256": d, "module": "BatchNorm"} for name, d in digests.items()}}
        passes = [{"loader": 0, "dataset_len": 8, "sampler": "DistributedSampler", "batches": 1, "steps": 1,
                   "batch_sizes": [4], "indices": [0, 1, 2, 3]}]
        if rank in evaluating:
            passes.append({"loader": 1, "dataset_len": 4, "sampler": "SequentialSampler", "batches": 1, "steps": 0,
                           "batch_sizes": [4], "indices": [0, 1, 2, 3]})
        write_rank_observation(tmp_path, rank, optimizer_steps=1, model=model, loader_passes=passes)
    return data_parallel.checks(observations.load(tmp_path), "gloo", len(buffers))


SAME = {"bn.running_mean": "a" * 16, "bn.running_var": "b" * 16, "bn.num_batches_tracked": "c" * 16}
APART = {**SAME, "bn.running_mean": "d" * 16, "bn.running_var": "e" * 16}
RECORD = {"checks": {"params_identical": {"passed": True}, "buffers_identical": {"passed": True}},
          "metrics": {"final_accuracy": 0.875}}


def test_divergent_batchnorm_statistics_that_ranks_evaluate_with_fail_with_the_lesson_not_as_a_lie(tmp_path):
    checks = replica_ranks(tmp_path, {0: SAME, 1: SAME, 2: APART, 3: APART}, evaluating=(0, 1, 2, 3))
    replicas, buffers = by_name(checks)["replicas_identical"], by_name(checks)["buffers_identical"]
    assert not replicas.passed and replicas.causes == ("buffers",)
    assert replicas.detail.startswith("parameters identical; BatchNorm running statistics differ on 2 of 4 ranks "
                                      "(ranks 2 and 3 from rank 0's, in 2 buffer(s), e.g. bn.running_mean), and "
                                      "rank 2 evaluated with them (1 loader pass(es) without an optimizer step")
    assert "BatchNorm lesson" in replicas.detail and "all-reduce" in replicas.detail  # the fix, in one line
    assert not buffers.passed and not buffers.lesson  # what it evaluated depends on them: it costs
    claims = by_name(data_parallel.compare_claims(RECORD, checks, measured_accuracy=0.8516, accuracy_tolerance=0.004))
    # Its parameters are identical: that claim stands. Its buffers are not: that one is contradicted.
    assert set(claims) == {"claim:buffers_identical", "claim:final_accuracy"}
    claim = claims["claim:final_accuracy"]
    assert (claim.passed, claim.applicable) == (True, False) and "not comparable" in claim.detail
    # Parameters apart too: the parameters' claim is contradicted; the accuracy, with no rank's own model
    # measured, is not comparable: never a lie for being another, honest number.
    (tmp_path / "params").mkdir()
    checks = replica_ranks(tmp_path / "params", {0: SAME, 1: APART}, params={1: "e" * 64})
    assert by_name(checks)["replicas_identical"].causes == ("parameters", "buffers")
    assert by_name(checks)["buffers_identical"].lesson  # they follow from the parameters: no lesson of their own
    claims = by_name(data_parallel.compare_claims(RECORD, checks, measured_accuracy=0.8516, accuracy_tolerance=0.004))
    assert set(claims) == {"claim:params_identical", "claim:buffers_identical", "claim:final_accuracy"}
    assert claims["claim:final_accuracy"].applicable is False
    # With every rank's own model measured on what it evaluated, the claim holds where it matches an
    # aggregate of them, and is contradicted where it matches none.
    from harness.verdict.tolerances import own_model_claims

    own = own_model_claims({"ranks": {"0": {"correct": 56, "total": 64}, "1": {"correct": 56, "total": 64}},
                            "error": None})
    held = by_name(data_parallel.compare_claims(RECORD, checks, measured_accuracy=0.8516, accuracy_tolerance=0.004,
                                                own_models=own))["claim:final_accuracy"]
    assert held.passed and held.applicable and "pooled (112/128)" in held.detail
    lying = {**RECORD, "metrics": {"final_accuracy": 0.99}}
    caught = by_name(data_parallel.compare_claims(lying, checks, measured_accuracy=0.8516, accuracy_tolerance=0.004,
                                                  own_models=own))["claim:final_accuracy"]
    assert not caught.passed and caught.detail.startswith("record claims final_accuracy 0.99, harness measured")


def test_divergent_batchnorm_statistics_nothing_depends_on_are_a_lesson_not_a_failure(tmp_path):
    # Rank 0 alone evaluates (the DDP tutorial's way): rank 1's statistics are its own, and unused.
    checks = replica_ranks(tmp_path, {0: SAME, 1: APART}, evaluating=(0,))
    replicas, buffers = by_name(checks)["replicas_identical"], by_name(checks)["buffers_identical"]
    assert replicas.passed and "no rank holding other BatchNorm running statistics than rank 0's" in replicas.detail
    assert not buffers.passed and buffers.lesson and "BatchNorm lesson" in buffers.detail
    assert buffers.to_dict()["lesson"] is True
    # A rank that saved with them makes them matter.
    (tmp_path / "saved").mkdir()
    replica_ranks(tmp_path / "saved", {0: SAME, 1: APART}, evaluating=(0,))
    path = tmp_path / "saved" / "rank.1.json"
    observed = json.loads(path.read_text())
    observed["saves"] = [{"path": "/run/checkpoint.pt", "written_as": "/run/checkpoint.pt", "rank": 1, "steps": 1}]
    path.write_text(json.dumps(observed))
    saved = by_name(data_parallel.checks(observations.load(tmp_path / "saved"), "gloo", 2))
    assert not saved["replicas_identical"].passed and "rank 1 saved them (checkpoint.pt)" in \
        saved["replicas_identical"].detail
    assert not saved["buffers_identical"].lesson


def test_one_model_on_every_rank_passes_and_buffers_not_held_by_batchnorm_are_named_as_buffers(tmp_path):
    same = {"bn.running_mean": "a" * 16}
    assert by_name(replica_ranks(tmp_path, {0: same, 1: same}))["replicas_identical"].passed
    (tmp_path / "other").mkdir()
    replica_ranks(tmp_path / "other", {0: same, 1: {"bn.running_mean": "b" * 16}}, evaluating=(1,))
    (tmp_path / "other" / "rank.0.json").write_text((tmp_path / "other" / "rank.0.json").read_text()
                                                    .replace('"BatchNorm"', '"Embedding"'))
    checks = data_parallel.checks(observations.load(tmp_path / "other"), "gloo", 2)
    detail = by_name(checks)["replicas_identical"].detail
    assert detail.startswith("parameters identical; buffers differ on 1 of 2 ranks") and "lesson" not in detail


def test_the_accuracy_claim_tolerance_is_one_test_image():
    from harness.verdict.tolerances import accuracy_claim_tolerance

    assert accuracy_claim_tolerance(256) == pytest.approx(1 / 256)
    record, tolerance = {"metrics": {"final_accuracy": 219 / 256}}, accuracy_claim_tolerance(256)
    assert data_parallel.compare_claims(record, [], measured_accuracy=218 / 256, accuracy_tolerance=tolerance) == []
    assert data_parallel.compare_claims(record, [], measured_accuracy=217 / 256, accuracy_tolerance=tolerance)  # two


def test_a_claimed_throughput_far_above_the_harness_timing_is_contradicted():
    record = {"metrics": {"img_per_sec": 100.0}}
    assert data_parallel.compare_claims(record, [], measured_img_per_sec=80.0) == []  # its own clock, a little apart
    claims = data_parallel.compare_claims(record, [], measured_img_per_sec=50.0)
    assert [c.name for c in claims] == ["claim:img_per_sec"] and not claims[0].passed
    assert "record claims img_per_sec 100, harness timed 50" in claims[0].detail


# ------------------------------------------------------------------------------------------------- the real labs


@pytest.fixture(scope="module")
def ddp_lab(tmp_path_factory):
    where = tmp_path_factory.mktemp("ddp-lab")
    lab_args = ["--backend", "gloo", "--record", str(where / "record.json"), "--smoke"]
    torchrun([str(REPO / "labs" / "ddp" / "train.py"), *lab_args], where / "observe")
    return where / "observe", lab_args, json.loads((where / "record.json").read_text())


@pytest.mark.xdist_group("ddp_lab")
@pytest.mark.integration
def test_ddp_lab_passes_every_observed_check(ddp_lab):
    observe_dir, _, record = ddp_lab
    checks = data_parallel.checks(observations.load(observe_dir), "gloo", 2, train_set_size=SMOKE_TRAIN_IMAGES)
    assert failing(checks) == {}
    # Trained on what its loader handed out, in step at every sampled step, on a clock the kernel agrees
    # with: verified, not n/a.
    assert all(by_name(checks)[name].applicable
               for name in ("parameters_trained", "replicas_in_step", "clock", "inputs_from_loader"))
    assert data_parallel.compare_claims(record, checks) == []
    # Parameters and BatchNorm statistics alike: the lab averages the statistics before it evaluates.
    assert "parameters and buffers bitwise equal on all 2 ranks" in by_name(checks)["replicas_identical"].detail
    rank0 = observations.load(observe_dir).ranks[0].model["buffers"]
    assert rank0["bn1.running_mean"]["module"] == "BatchNorm" and len(rank0) == 3 * 20  # resnet18: 20 BatchNorms


@pytest.mark.xdist_group("ddp_lab")
@pytest.mark.integration
def test_the_harness_times_the_lab_as_its_own_clock_does(ddp_lab):
    """The observer's timing brackets the same steps as the lab's TrainClock (from step 3 on, training
    only): the two agree closely, though the program's clock is never what the grade reads."""
    observe_dir, _, record = ddp_lab
    timed = observations.throughput(observations.load(observe_dir))
    assert timed is not None and timed / record["metrics"]["img_per_sec"] == pytest.approx(1.0, abs=0.2)


@pytest.mark.xdist_group("ddp_lab")
@pytest.mark.integration
def test_harness_measures_the_accuracy_itself(ddp_lab, tmp_path):
    observe_dir, lab_args, record = ddp_lab
    with accuracy.Evaluator(timeout_s=TIMEOUT_S) as evaluator:
        measured = evaluator.measure(observe_dir, lab_args)
        assert measured["error"] is None, measured
        # A grade keeps one evaluating process for all its runs: the same answer, from the same process.
        first = evaluator.process.pid
        assert evaluator.measure(observe_dir, lab_args) == measured
        assert evaluator.measure(observe_dir, [*lab_args, "--test-size", "64"])["total"] == 64
        assert evaluator.process.pid == first
        # A run without weights is an answer too; the process serves on.
        write_rank_observation(tmp_path, 0)  # a rank that trained no model
        assert "no trained model" in evaluator.measure(tmp_path, lab_args)["error"]
        (tmp_path / "rank.0.json").write_text(json.dumps({"model": None}))  # not the observer's format
        assert "not the observer's format" in evaluator.measure(tmp_path, lab_args)["error"]
        assert evaluator.process.pid == first
        os.kill(first, signal.SIGKILL)  # a process that dies is named, and the next request gets a new one
        assert evaluator.measure(observe_dir, lab_args)["error"].startswith("evaluation exited with code -9")
        assert evaluator.measure(observe_dir, lab_args) == measured
        assert evaluator.process.pid != first
        last = evaluator.process
    assert last.returncode == 0 and evaluator.process is None  # closed: it ended at the end of its input
    # Where memory is short (accuracy.keeps_warm), one process per answer: the same answer, none left waiting.
    with accuracy.Evaluator(timeout_s=TIMEOUT_S, warm=False) as cold:
        assert cold.measure(observe_dir, lab_args) == measured and cold.process is None
    assert measured["weights_sha256"] == measured["observed_sha256"]
    assert measured["total"] == 128
    claimed = record["metrics"]["final_accuracy"]
    assert measured["accuracy"] == pytest.approx(claimed, abs=1e-6)
    checks = data_parallel.checks(observations.load(observe_dir), "gloo", 2)
    assert data_parallel.compare_claims(record, checks, measured_accuracy=measured["accuracy"]) == []

    lying = copy.deepcopy(record)
    lying["metrics"]["final_accuracy"] = 0.99
    claims = data_parallel.compare_claims(lying, checks, measured_accuracy=measured["accuracy"])
    assert [c.name for c in claims] == ["claim:final_accuracy"]
    assert f"harness measured {measured['accuracy']:.6g}" in claims[0].detail


@pytest.mark.xdist_group("ddp_lab")
@pytest.mark.integration
def test_tampered_weights_are_refused(ddp_lab, tmp_path):
    observe_dir, lab_args, _ = ddp_lab
    copied = tmp_path / "observe"
    shutil.copytree(observe_dir, copied)
    import torch  # the test may; the grader never does

    state = torch.load(copied / accuracy.WEIGHTS_FILE, weights_only=True)
    state["fc.bias"] += 1.0
    torch.save(state, copied / accuracy.WEIGHTS_FILE)
    result = accuracy.measure_accuracy(copied, lab_args)  # in this process: torch is loaded already
    assert result["accuracy"] is None
    assert "not the state the observer saw on rank 0" in result["error"]


@pytest.mark.xdist_group("ddp_lab")
@pytest.mark.integration
def test_every_rank_stamps_its_timeline_in_order_on_the_hosts_clock(ddp_lab):
    """Where a run's time goes (`distlab grade --timings`): each rank stamps every milestone, in the order
    they happen, on CLOCK_MONOTONIC (this process's time.monotonic() is the same clock, and later)."""
    import time

    from harness.on_ranks.observer.distlab_observer.fileformat import TIMELINE

    observe_dir, _, _ = ddp_lab
    ranks = observations.load(observe_dir).ranks
    assert sorted(ranks) == [0, 1]
    for rank in ranks.values():
        assert list(rank.timeline) == list(TIMELINE)
        stamps = [rank.timeline[milestone] for milestone in TIMELINE]
        assert stamps == sorted(stamps) and stamps[-1] <= time.monotonic()
