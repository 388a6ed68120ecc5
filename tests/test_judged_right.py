"""The grader judged right on programs nobody here wrote (issue 38), piece by piece, without launches:
checkpoints loaded and their failures named, a resume compared with an uninterrupted run, the steps
Horovod takes outside training named, lessons that cost nothing unless a rubric says so, the rows
that show what the harness measured, and a failed run's reason carrying the rank's last exception.
The programs themselves are graded through the real launchers in tests/test_tutorial_programs.py.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest
import torch
from conftest import write_rank_observation

from harness.classgrade import lessons, rubric
from harness.observe import accuracy, checkpoint_loads, data_parallel, observations, resume
from harness.observe.check import Check
from harness.run.accounting import LAUNCHER_VARIABLES, last_exception
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


def test_a_failed_run_s_reason_names_the_rank_s_last_exception():
    log = ("epoch 0\nTraceback (most recent call last):\n  File \"train.py\", line 40, in <module>\n"
           "    main()\nKeyError: 'LOCAL_RANK'\n")
    assert last_exception(log) == "KeyError: 'LOCAL_RANK'"
    assert LAUNCHER_VARIABLES.search(last_exception(log))
    chained = log + "\nDuring handling of the above exception, another exception occurred:\n\n" \
                    "Traceback (most recent call last):\n  File \"x\", line 1\nRuntimeError: boom\n"
    assert last_exception(chained) == "RuntimeError: boom"
    assert last_exception("no traceback here\n") is None


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
