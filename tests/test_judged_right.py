"""The grader judged right on programs nobody here wrote (issue 38), piece by piece, without launches:
checkpoints loaded and their failures named, a resume compared with an uninterrupted run, the steps
Horovod takes outside training named, lessons that cost nothing unless a rubric says so, the rows
that show what the harness measured, and a failed run's reason carrying the rank's last exception.
The programs themselves are graded through the real launchers in tests/test_tutorial_programs.py.
"""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import write_rank_observation

from harness.classgrade import lessons, rubric
from harness.console import printable
from harness.grading.samples import raised_by_the_program
from harness.observe import accuracy, checkpoint_loads, data_parallel, observations, resume
from harness.observe.check import Check
from harness.run.accounting import (
    LAUNCHER_VARIABLES,
    SAID_CHARS,
    Frame,
    failing_rank_exception,
    rank_logs_in,
)
from harness.run.launchers import Failure
from harness.run.state import RunResult
from harness.verdict.evaluate import evaluate_cell, observed_verdicts
from harness.verdict.expectations import LabExpectation
from harness.verdict.verdicts import NOT_RUN, Sample, Verdict, is_lesson


def tiny_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))


def saved(tmp_path: Path, name: str, obj) -> Path:
    path = tmp_path / name
    torch.save(obj, path)
    return path


# ------------------------------------------------------------------------------------------ checkpoints


@pytest.mark.parametrize(("what", "says"), [
    ("model.module", None),  # the model's own keys, inside the tutorial's snapshot
    ("wrapper", "every key prefixed 'module.'; save model.module.state_dict()"),
    ("missing", "1 of the model's keys missing (e.g. 2.weight)"),
    ("shape", "tensor(s) of another shape (e.g. 2.weight: saved [5, 3], the model's [2, 3])"),
])
def test_the_last_checkpoint_must_load_into_the_model_and_what_does_not_is_named(tmp_path, what, says):
    model = tiny_model()
    state = model.state_dict()
    if what == "wrapper":
        state = {f"module.{k}": v for k, v in state.items()}
    elif what == "missing":
        state.pop("2.weight")
    elif what == "shape":
        state["2.weight"] = torch.zeros(5, 3)
    path = saved(tmp_path, "snapshot.pt", {"MODEL_STATE": state, "EPOCHS_RUN": 1})
    entry = checkpoint_loads.load_checkpoint(path, [tmp_path], {}, tiny_model)
    assert entry["path"] == "snapshot.pt" and entry["key"] == "MODEL_STATE"
    if says is None:
        assert entry["loads"] is True, entry
    else:
        assert entry["loads"] is False and says in entry["detail"], entry
    # Without the lab's model (a program's own), it is held against the trained model's keys and shapes.
    against = checkpoint_loads.load_checkpoint(path, [tmp_path], tiny_model().state_dict(), None)
    assert against["loads"] is (says is None) and against["into"] == "the model the program trained"


def test_a_checkpoint_is_read_only_inside_the_run_as_tensors(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    outside = saved(tmp_path, "elsewhere.pt", tiny_model().state_dict())
    assert "outside the run's folder" in checkpoint_loads.load_checkpoint(outside, [run], {}, tiny_model)["detail"]
    (run / "linked").symlink_to(tmp_path)
    linked = checkpoint_loads.load_checkpoint(run / "linked" / "elsewhere.pt", [run], {}, tiny_model)
    assert "is a link" in linked["detail"]
    pickled = saved(run, "model.pt", tiny_model())  # torch.save(model): the class pickled, not the weights
    entry = checkpoint_loads.load_checkpoint(pickled, [run], {}, tiny_model)
    assert entry["loads"] is False and "save model.state_dict()" in entry["detail"]
    history = saved(run, "history.pt", {"loss": [1.0, 0.5]})  # not a checkpoint: nothing to load
    assert checkpoint_loads.load_checkpoint(history, [run], {}, tiny_model)["loads"] is None


def test_each_rank_s_last_checkpoint_is_the_one_checked(tmp_path):
    run = tmp_path / "run"
    (run / "observe").mkdir(parents=True)
    good = saved(run, "ck.pt", {"model": tiny_model().state_dict()})
    saved(run, "log.pt", {"loss": torch.zeros(2)})
    saves = [{"path": str(good), "written_as": str(good), "rank": 0, "steps": 4},
             {"path": str(run / "log.pt"), "written_as": str(run / "log.pt"), "rank": 0, "steps": 8}]
    write_rank_observation(run / "observe", 0, saves=saves)
    write_rank_observation(run / "observe", 1)
    entries = checkpoint_loads.checkpoints(accuracy.rank_files([run / "observe"]), [run], {}, tiny_model)
    # The newest save holds no model state; the one before it is rank 0's last checkpoint.
    assert [(e["path"], e["loads"]) for e in entries] == [("log.pt", None), ("ck.pt", True)]
    check = data_parallel.check_checkpoints(entries)
    assert check.passed and check.detail.startswith("ck.pt (rank 0's last checkpoint) loads into the lab's model")
    none = data_parallel.check_checkpoints([entries[0]])
    assert none.passed and not none.applicable


# ---------------------------------------------------------------------------------------------- resume


def epochs(*orders: list[int]) -> list[dict]:
    return [{"loader": 0, "dataset_len": 8, "sampler": "DistributedSampler", "batches": 2, "steps": 2,
             "batch_sizes": [2], "indices": order} for order in orders]


ORDERS = [[0, 3, 5, 6], [1, 2, 4, 7], [6, 5, 3, 0]]  # one rank's three epochs, each its own order


def resume_case(tmp_path: Path, resumed_orders: list[list[int]], read: bool = True) -> Check:
    checkpoint = str(tmp_path / "ck.pt")
    stopped = {"stopped": {"after_epochs": 1, "steps": 2},
               "saves": [{"path": checkpoint, "written_as": checkpoint, "rank": 0, "steps": 2}]}
    resumed = {"loads": [{"path": checkpoint, "steps": 0}]} if read else {}
    for folder, orders, extra in (("whole", ORDERS, {}), ("stopped", ORDERS[:1], stopped),
                                  ("resumed", resumed_orders, resumed)):
        write_rank_observation(tmp_path / folder, 0, optimizer_steps=2 * len(orders) if folder != "stopped" else 2,
                               loader_passes=epochs(*orders), **extra)
    return resume.check_resume(*(observations.load(tmp_path / f) for f in ("whole", "stopped", "resumed")), 1)


def test_a_resume_goes_on_where_it_stopped(tmp_path):
    check = resume_case(tmp_path, ORDERS[1:])
    assert check.passed, check.detail
    assert check.detail.startswith("every rank resumed at epoch 1") and "took its 6 optimizer steps" in check.detail


def test_an_off_by_one_resume_retrains_the_epoch_it_had_finished(tmp_path):
    check = resume_case(tmp_path, ORDERS)  # the restart read the checkpoint, and drew epoch 0's order again
    assert not check.passed
    assert "resumed at epoch 0 after 1 epoch(s) had finished: epoch(s) 0 trained twice, 4 epochs in all where the " \
           "uninterrupted run trained 3 (it read ck.pt, saved before the stop, and went on at the epoch that file " \
           "records: the one it had finished, not the next one to run)" in check.detail
    (tmp_path / "again").mkdir()
    fresh = resume_case(tmp_path / "again", ORDERS, read=False)  # it never read the checkpoint
    assert not fresh.passed and "it read no file the stopped attempt had saved: it started again" in fresh.detail


def test_a_program_never_stopped_is_not_comparable(tmp_path):
    write_rank_observation(tmp_path / "whole", 0, optimizer_steps=2, loader_passes=epochs(ORDERS[0]))
    check = resume.check_resume(observations.load(tmp_path / "whole"), observations.load(tmp_path / "none"),
                                observations.load(tmp_path / "whole"), 1)
    assert check.passed and not check.applicable and "never stopped" in check.detail


# ------------------------------------------------------------------------------------------------ steps


def test_horovods_step_before_training_is_named(tmp_path):
    for rank in (0, 1):
        passes = [{**epochs([rank])[0], "steps_before": 1}]
        write_rank_observation(tmp_path, rank, optimizer_steps=3, loader_passes=passes, process_groups=[
            {"api": "horovod", "backend": "horovod", "world_size": 2, "rank": rank}])
    check = data_parallel.check_steps([observations.load(tmp_path).ranks[r] for r in (0, 1)])
    assert check.passed
    assert check.detail.startswith("every rank took 3 optimizer steps (2 in its training passes and 1 outside any, "
                                   "before the first: Horovod's broadcast_optimizer_state")


# --------------------------------------------------------------------------------------- lessons, rubric


def test_a_lesson_costs_nothing_is_shown_with_its_fix_and_a_course_can_make_it_cost(tmp_path):
    observed = [{"name": "buffers_identical", "passed": False, "detail": "BatchNorm running statistics differ",
                 "applicable": True, "lesson": True}]
    [verdict] = observed_verdicts("ddp", 2, [Sample("r", "ok", None, 1.0, {}, observed=observed)])
    assert is_lesson(verdict) and verdict.detail.startswith("lesson: BatchNorm")
    run = Verdict("ddp", 2, "run", "1/1 ok", "all ok", True)
    shipped = rubric.load()
    [item] = [i for i in shipped.items if i.checks == ("observed:buffers_identical",)]
    score = next(s for s in shipped.score([run, verdict]) if s.item == item)
    assert score.passed and score.failed == [verdict]  # in the feedback, with its lesson; no point lost
    assert lessons.lesson_for(verdict.check).fix.startswith("Average them over the ranks")
    costly = tmp_path / "week4.toml"
    costly.write_text('[[items]]\nname = "BatchNorm statistics averaged"\nchecks = ["observed:buffers_identical"]\n'
                      'points = 1\nlessons_cost = true\n')
    [charged] = rubric.load(costly).score([run, verdict])
    assert charged.score == 0 and not charged.passed
    free = tmp_path / "free.toml"
    free.write_text('[[items]]\nname = "statistics"\nchecks = ["observed:buffers_identical"]\npoints = 1\n')
    assert rubric.load(free).score([run, verdict])[0].score == 1  # judged, at no cost


# ------------------------------------------------------------------------------------------------- rows


def test_the_measured_accuracy_is_shown_without_a_band_and_a_failed_cell_says_what_failed():
    exp = LabExpectation("ddp", (2,), time_budget_s=100)
    ok = Sample("r", "ok", None, 10.0, {"metrics": {"final_accuracy": 0.5}}, measured={"final_accuracy": 0.25})
    shown = {v.check: v for v in evaluate_cell(exp, 2, [ok])}["final_accuracy"]
    assert shown.passed is None and shown.measured == "0.25" and "the program reported 0.5" in shown.detail
    from harness.verdict.expectations import Band

    timed = LabExpectation("ddp", (2,), time_budget_s=100, bands=(Band("img_per_sec", at_least_ratio={2: 0.7}),))
    crashed = Sample("r", "failed", "rank 1 exited with code 1", 3.0, None)
    rows = {v.check: v for v in evaluate_cell(timed, 2, [crashed] * 3)}
    assert "img_per_sec" not in rows and rows["img_per_sec_ratio"].passed is False
    assert rows["img_per_sec_ratio"].measured == "not measured"
    assert "3 run(s) failed; the first: rank 1 exited with code 1" in rows["img_per_sec_ratio"].detail
    assert rows["time"].passed is None  # a 3 s crash passes no time budget
    not_run = evaluate_cell(exp, 2, [Sample("", NOT_RUN, "needs root", 0.0, None)])
    assert [(v.check, v.passed, v.detail) for v in not_run] == [("run", None, "needs root")]


# ------------------------------------------------------------------------------------------- the reason


# What each rank of a crashed run ran: its log is what Python itself printed as the program ended.
RANK_PROGRAMS = {
    # The program's own exception, raised while handling another: two tracebacks, the last one counts.
    # Its message carries an escape sequence and is longer than a reason keeps.
    1: "import os\n"
       "def local_rank():\n"
       "    return os.environ['LOCAL_RANK']\n"
       "def main():\n"
       "    try:\n"
       "        local_rank()\n"
       "    except KeyError:\n"
       "        raise RuntimeError('rank 1 gives up \\x1b[2J' + '!' * 400)\n"
       "main()\n",
    0: "raise ConnectionResetError('Connection reset by peer')\n",  # what a peer's end does to a correct rank
    2: "import os\nos.environ['LOCAL_RANK']\n",  # a torchrun-only program started by plain python
    3: "import sys\nprint('no traceback: an exit code only')\nsys.exit(3)\n",
}
CRASH_FIXTURE = Path(__file__).resolve().parent / "fixtures/classgrade/crash-rank1/run"  # a real torchrun's logs


def crashed_ranks(run_dir: Path) -> Path:
    """A run folder with each rank's log as the rank's real Python process left it (stdout and stderr)."""
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE")}
    for rank, source in RANK_PROGRAMS.items():
        program = run_dir / f"rank{rank}.py"
        program.write_text(source)
        with (run_dir / f"rank.{rank}.log").open("wb") as log:
            ended = subprocess.run([sys.executable, str(program)], stdout=log, stderr=subprocess.STDOUT, env=env,
                                   cwd=run_dir, timeout=60, check=False)
        assert ended.returncode != 0, rank
    return run_dir


def test_a_crashed_run_s_failing_rank_and_its_last_exception_are_read_in_one_place(tmp_path):
    """The reason (accounting.exception_said), a class's ending (outcome.ending_of) and whether the program
    raised it of its own (samples.raised_by_the_program) read the failing rank's exception from one helper."""
    run_dir = crashed_ranks(tmp_path)
    logs = rank_logs_in(run_dir)
    assert sorted(logs) == [0, 1, 2, 3]

    found = failing_rank_exception(logs, 1)
    assert found is not None and found.rank == 1
    assert found.line.startswith("RuntimeError: rank 1 gives up \x1b[2J!!!"), found.line  # the whole line
    # As a reason shows it: the escape sequence shown, not obeyed, and bounded.
    assert found.said == printable(found.line)[:SAID_CHARS] and "\x1b" not in found.said
    assert len(found.said) == SAID_CHARS
    # The frames of the last traceback only: the KeyError's, handled, are not where the program failed.
    program = str(run_dir / "rank1.py")
    assert found.frames == (Frame(program, 9, "<module>"), Frame(program, 8, "main")), found.frames

    # No rank named, or the named rank printed no traceback: the lowest rank's that has one.
    assert failing_rank_exception(logs, None).rank == 0
    fallback = failing_rank_exception(logs, 3)
    assert (fallback.rank, fallback.line) == (0, "ConnectionResetError: Connection reset by peer")
    assert failing_rank_exception({3: logs[3]}, 3) is None

    plain_python = failing_rank_exception(logs, 2)
    assert plain_python.line == "KeyError: 'LOCAL_RANK'" and LAUNCHER_VARIABLES.search(plain_python.line)

    # torchrun prefixes each line of a rank's output with "[rank1]:" (a real grade's logs).
    torchrun = failing_rank_exception(rank_logs_in(CRASH_FIXTURE), 1)
    assert torchrun.line == "RuntimeError: rank 1 gives up" and torchrun.frames[-1].function == "main"
    assert torchrun.frames[-1].file.endswith("carol.py")

    def raised(failure: Failure) -> str | None:
        return raised_by_the_program(RunResult(run_dir, 1, "failed", failure.describe(), None, failure, 1.0))

    assert raised(Failure(1, 1, None)) == found.said  # the program's own: not run again
    assert raised(Failure(0, 1, None)) is None  # what the machine can cause: run again
    assert raised(Failure(3, 3, None)) is None  # rank 3's exit is not explained by rank 0's exception
    assert raised(Failure(1, None, "SIGKILL")) is None


def test_the_shipped_rubric_has_the_new_items():
    names = {item.name: item for item in rubric.load().items}
    assert names["BatchNorm statistics averaged"].points == 0
    assert names["a checkpoint that loads"].absent_passes and names["resumes where it stopped"].absent_passes

    # Every check an item names is one the grader makes: a misspelt name would match no verdict, and
    # the item would pay nothing (or, with absent_passes, everything) whatever the program did.
    made = {f"observed:{check.name}" for check in data_parallel.checks(
        observations.Observations(Path("observe")), "gloo", 2, checkpoints=[])} | {f"observed:{resume.NAME}"}
    made |= {"run", "time", "img_per_sec_ratio", "claim:final_accuracy"}
    for item in names.values():
        for pattern in item.checks:
            assert any(fnmatch.fnmatchcase(check, pattern) for check in made), (item.name, pattern)


def test_other_ranks_copies_of_rank0s_weights_are_dropped_once_measured(tmp_path):
    from harness.grading.samples import drop_copies_of_rank0

    for rank, name in ((0, "final_weights.pt"), (1, "final_weights.1.pt"), (2, "../escape.pt")):
        (tmp_path / "observe").mkdir(exist_ok=True)
        write_rank_observation(tmp_path / "observe", rank, model={"weights_file": name})
        if "/" not in name:
            (tmp_path / "observe" / name).write_bytes(b"weights")
    (tmp_path / "escape.pt").write_bytes(b"not the observer's")
    drop_copies_of_rank0(observations.load(tmp_path / "observe"))
    assert sorted(p.name for p in (tmp_path / "observe").glob("*.pt")) == ["final_weights.pt"]
    assert (tmp_path / "escape.pt").exists()  # only the observer's own names are ever removed


def test_a_judged_grade_keeps_no_weights_and_names_each_by_its_digest(tmp_path):
    """grading/disk.py, what a graded submission keeps: every weights file of its runs removed and named
    in weights.json by size and sha256; logs and observations stay; a link is neither followed nor
    removed in its target's place, a FIFO never opened, a deeper folder than it walks said, not raised."""
    import hashlib
    import json
    import os

    from harness.grading import disk

    run = tmp_path / "runs" / "ddp" / "ws2"
    (run / "observe").mkdir(parents=True)
    (run / "observe" / "final_weights.pt").write_bytes(b"rank 0's state")
    (run / "nested" / "ckpt").mkdir(parents=True)
    (run / "nested" / "ckpt" / "epoch1.safetensors").write_bytes(b"a checkpoint")
    (run / "rank.0.log").write_text("trained\n")
    (run / "observe" / "rank.0.json").write_text("{}")
    (tmp_path / "elsewhere.pt").write_bytes(b"not the run's")
    (run / "linked.pt").symlink_to(tmp_path / "elsewhere.pt")
    os.mkfifo(run / "fifo.ckpt")
    deep = tmp_path / "runs" / "deep"
    (deep / ("d/" * (disk.MAX_DEPTH + 2))).mkdir(parents=True)
    manifest = disk.release_weights([run, run, deep, tmp_path / "gone"], tmp_path)
    assert manifest == json.loads((tmp_path / disk.MANIFEST).read_text())
    assert {e["path"]: (e["bytes"], e["sha256"]) for e in manifest["removed"]} == {
        f"runs/ddp/ws2/{name}": (len(data), hashlib.sha256(data).hexdigest()) for name, data in
        (("observe/final_weights.pt", b"rank 0's state"), ("nested/ckpt/epoch1.safetensors", b"a checkpoint"))}
    assert manifest["bytes"] == len(b"rank 0's state") + len(b"a checkpoint")
    assert sorted(p.name for p in run.rglob("*") if p.is_file() and not p.is_symlink()) == ["rank.0.json", "rank.0.log"]
    assert (run / "linked.pt").is_symlink() and (tmp_path / "elsewhere.pt").read_bytes() == b"not the run's"
    assert (run / "fifo.ckpt").exists() and len(manifest["problems"]) == 1 and "runs/deep" in manifest["problems"][0]


def test_a_reference_run_keeps_no_final_weights_and_follows_no_link(tmp_path):
    """A reference is timed, never evaluated: its observer's weights (45 MB a rank) are removed at once,
    so the course lab's references cannot fill a class job's folder; a link is removed, not followed."""
    from harness.grading.samples import reference_sample
    from harness.run.state import RunResult

    observe = tmp_path / "run" / "observe"
    observe.mkdir(parents=True)
    for name in ("final_weights.pt", "final_weights.1.pt"):
        (observe / name).write_bytes(b"weights")
    (tmp_path / "elsewhere.pt").write_bytes(b"not the observer's")
    (observe / "final_weights.2.pt").symlink_to(tmp_path / "elsewhere.pt")
    write_rank_observation(observe, 0)
    result = RunResult(tmp_path / "run", 0, "ok", None, {"metrics": {}}, None, 1.0, False, False, False, None)
    sample = reference_sample(result, "img_per_sec")
    assert sample.status == "ok" and not list(observe.glob("final_weights*"))
    assert (tmp_path / "elsewhere.pt").read_bytes() == b"not the observer's"
    assert (observe / "rank.0.json").exists()  # what was observed stays: only the weights go


def test_a_two_host_cell_in_the_class_sandbox_is_not_run_and_says_why(tmp_path):
    import dataclasses

    from harness.grading.cells import SANDBOXED, run_cell
    from harness.run.request import build_request

    exp = LabExpectation("ddp-two-hosts", (2,), cell="two-hosts", program_lab="ddp")
    request = dataclasses.replace(build_request("ddp", 2, ["--smoke"], results_root=tmp_path, gpus=0),
                                  sandbox=["sandbox.py", "{run_dir}", "--"])
    sample = run_cell(exp, request, evaluator=None)
    assert (sample.status, sample.reason) == (NOT_RUN, SANDBOXED)
    assert (Path(sample.run_dir) / "not-run.txt").read_text().strip() == SANDBOXED  # a folder of its own
    assert "--unshare-net" in SANDBOXED and "GLOO_SOCKET_IFNAME=lo" in SANDBOXED


def test_a_run_on_two_hosts_is_timed_over_every_node_s_ranks(tmp_path):
    """A two-host cell keeps one observe folder per node. Its rate was timed from node 0's ranks alone,
    half the run's, so the course lab on two hosts failed its own claim ("claims img_per_sec 298,
    harness timed 157"). A real two-rank run of the course lab (the replay fixture), its ranks split
    as two hosts leave them, is timed as the one run it is, and its claim stands."""
    import shutil

    from harness.grading.samples import observed_sample
    from harness.run.request import build_request

    run = Path(__file__).resolve().parent / "fixtures" / "replay" / "ddp" / "20261205-121927-ws2-torchrun"
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    shutil.copytree(run, node0)
    (node1 / "observe").mkdir(parents=True)
    (node0 / "observe" / "rank.1.json").rename(node1 / "observe" / "rank.1.json")
    record = json.loads((node0 / "record.json").read_text())
    whole = observations.throughput(observations.load(run / "observe"))
    alone = observations.throughput(observations.load(node0 / "observe"))
    claimed = record["metrics"]["img_per_sec"]
    assert whole and alone and claimed > data_parallel.THROUGHPUT_CLAIM_FACTOR * alone  # the mistake would show
    result = RunResult(node0, 0, "ok", None, record, None, 30.0, False, False, False, None)
    exp = LabExpectation("ddp-two-hosts", (2,), cell="two-hosts", program_lab="ddp")
    request = build_request("ddp", 2, ["--smoke"], results_root=tmp_path, gpus=0)
    with accuracy.Evaluator() as evaluator:  # no final weights in the fixture: it says so, in seconds
        sample = observed_sample(result, exp, request, evaluator, more_dirs=[node1 / "observe"])
    assert sample.measured["img_per_sec"] == pytest.approx(whole)
    assert not [c for c in sample.observed if c["name"] == "claim:img_per_sec"], sample.observed
