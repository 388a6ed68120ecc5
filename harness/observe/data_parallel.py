"""The data-parallel checks, computed by the harness from what its observer saw on every rank
(observations.py reads it), and the record's claims that they contradict.

A lab's record says which of its own checks passed; that is the program's word. `checks` judges the
run from the observations alone, and `compare_claims` turns each claim of the record that the
observations contradict into a failed check.

The rules, per check:

- process_group: every rank of the expected world size left observations, initialised a process
  group (torch.distributed, or Horovod's hvd.init) whose backend and world size are the expected
  ones, and reported its own rank. Backend "none" expects one process and no group. The backend is
  the one torch uses: a group made without naming one (init_process_group(), as Accelerate does) is
  "undefined" to get_backend() and the expected one where its backend config (get_backend_config(),
  "cpu:gloo") names it. At world size 1 a group is optional (labs/README.md, section 2): one process
  that made none passes. A launched rank that spawned processes itself (mp.spawn under torchrun)
  fails it, named as the cause of what follows from it (ports taken, ranks missing).
- The checks of what the loaders drew (training epochs, shards_disjoint, shards_cover,
  order_changes_per_epoch, inputs_from_loader): shards.py has their rules.
- The checks of the model every rank holds (replicas_identical, buffers_identical, parameters_trained,
  replicas_in_step): replicas.py has their rules.
- checkpoint_loads: the last file each rank saved that holds a model state loads into the model
  (harness/observe/checkpoint_loads.py loads it, in the evaluating process): the lab's, or the model the program
  trained where that is not the lab's. Not applicable where no rank saved one.
- one_writer_per_checkpoint: no file (the path a torch.save ended up at, following a rename) was
  saved by more than one rank.
- optimizer_steps_equal: every rank took the same number of optimizer steps. Steps taken outside
  any training pass are named: Horovod's broadcast_optimizer_state takes one on a fresh optimizer.
- clock: every rank's age by the observer's clock agrees with the kernel's account of it
  (observations.clock_disagreement): the harness's timings are the time's. Not verified where
  /proc did not say.
- observer: the observer itself ran without an error on every rank, all its files were readable, and
  every pass record matched the line streamed when the pass ended.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.observe.check import NOT_VERIFIED, Check, _first, _join
from harness.observe.observations import Observations, RankObservation, clock_disagreement
from harness.observe.replicas import check_replicas, check_replicas_in_step, check_trained
from harness.observe.shards import check_inputs_from_loader, check_order_changes, check_shards

# The record's claims (labs/common/replicas.py writes them), the observed check that answers each,
# and the part of it the claim is about: a check failed for another cause does not contradict it
# (equal parameters beside differing BatchNorm statistics: params_identical is true). None: any.
CLAIMS: dict[str, tuple[str, str | None]] = {
    "params_identical": ("replicas_identical", "parameters"),
    "buffers_identical": ("buffers_identical", None),
    "replicas_identical": ("replicas_identical", None),
    "shards_disjoint": ("shards_disjoint", None),
    "shards_cover": ("shards_cover", None),
    "order_changes_per_epoch": ("order_changes_per_epoch", None),
    "set_epoch": ("order_changes_per_epoch", None),
    "one_writer_per_checkpoint": ("one_writer_per_checkpoint", None),
    "optimizer_steps_equal": ("optimizer_steps_equal", None),
    "process_group": ("process_group", None),
}
# Where a rank's optimizer steps outside its training passes come from, when the launcher's library says so.
HOROVOD_INIT_STEP = ("Horovod's broadcast_optimizer_state steps a fresh optimizer once with zero gradients to "
                     "create its state: with weight decay that step shrinks every weight; call it only when "
                     "resuming (the course lab does)")
# A program times its own steps its own way (with or without loading the next batch, say): its
# img_per_sec is a claim to contradict only when it exceeds the harness's by more than this factor.
THROUGHPUT_CLAIM_FACTOR = 1.5


def checks(observations: Observations, expected_backend: str, expected_world_size: int,
           train_set_size: int | None = None, checkpoints: list[dict[str, Any]] | None = None) -> list[Check]:
    """Every data-parallel check, judged from the observations (and `checkpoints`: the evaluator's
    loading of the saved files, accuracy.py; None where it was not asked, no such check)."""
    ranks = [observations.ranks[r] for r in sorted(observations.ranks)]
    inputs = check_inputs_from_loader(ranks)
    drawn = [*check_shards(ranks, train_set_size), check_order_changes(ranks)]
    if not inputs.passed:  # what the loader drew says nothing of what the model trained on
        drawn = [Check(check.name, True, f"{NOT_VERIFIED}: the model trained on samples its DataLoader did not "
                                         "hand out (inputs_from_loader), so the indices drawn prove nothing",
                       applicable=False) for check in drawn]
    return [
        check_process_group(observations, expected_backend, expected_world_size),
        inputs,
        *drawn,
        *check_replicas(ranks),
        *([] if checkpoints is None else [check_checkpoints(checkpoints)]),
        check_one_writer(ranks),
        check_steps(ranks),
        check_trained(ranks),
        check_replicas_in_step(ranks),
        check_clock(observations),
        check_observer(observations),
    ]


def compare_claims(record: dict[str, Any] | None, observed: list[Check], measured_accuracy: float | None = None,
                   accuracy_tolerance: float = 1e-6, measured_img_per_sec: float | None = None,
                   own_models: list[tuple[str, float, float]] | str | None = None) -> list[Check]:
    """A failed check for each claim of the record that the harness observed to be false.

    A claim is a check the record says passed; the observed check it names (CLAIMS) failed, for the
    cause the claim is about. With measured_accuracy (harness/observe/accuracy.py), the record's
    final_accuracy is a claim too, judged like with like (`accuracy_claim`). With
    measured_img_per_sec (`throughput`), its img_per_sec, beyond THROUGHPUT_CLAIM_FACTOR.
    """
    by_name = {check.name: check for check in observed}
    contradicted = []
    for claim, info in sorted(((record or {}).get("checks") or {}).items()):
        name, about = CLAIMS.get(claim, ("", None))
        check = by_name.get(name)
        if isinstance(info, dict) and info.get("passed") is True and check is not None and not check.passed \
                and (about is None or not check.causes or about in check.causes):
            contradicted.append(Check(f"claim:{claim}", False, f"record claims {claim}, {check.detail}"))
    claimed = ((record or {}).get("metrics") or {}).get("final_accuracy")
    if isinstance(claimed, (int, float)) and not isinstance(claimed, bool):
        found = accuracy_claim(float(claimed), by_name.get("replicas_identical"), measured_accuracy,
                               accuracy_tolerance, own_models)
        if found is not None:
            contradicted.append(found)
    rate = ((record or {}).get("metrics") or {}).get("img_per_sec")
    if measured_img_per_sec and isinstance(rate, (int, float)) \
            and rate > THROUGHPUT_CLAIM_FACTOR * measured_img_per_sec:
        contradicted.append(Check("claim:img_per_sec", False,
                                  f"record claims img_per_sec {rate:.4g}, harness timed {measured_img_per_sec:.4g} "
                                  f"from every rank's optimizer steps"))
    return contradicted


def accuracy_claim(claimed: float, replicas: Check | None, measured: float | None, tolerance: float,
                   own_models: list[tuple[str, float, float]] | str | None) -> Check | None:
    """The record's final_accuracy against what it was about (None: nothing to say).

    One model on every rank (the replicas check found nothing apart): rank 0's weights on the whole
    test set, within `tolerance`. Where the ranks hold different models, each counted what it
    evaluated with its own: the claim is compared with the aggregates of every rank's own model on
    the test images that rank evaluated (`own_models`: (what, accuracy, tolerance) each, from
    harness/observe/accuracy.py's measures by verdict/tolerances.own_model_claims: the images
    pooled, or each rank's accuracy averaged; or why they could not be measured) and with rank 0's
    model on the whole set, and holds if it matches one. Where the ranks' own models could not be
    measured it is not comparable, and says why: never called a lie for being a different, honest
    number.
    """
    name = "claim:final_accuracy"
    apart = replicas is not None and bool(replicas.causes)
    if not apart:
        if measured is None or abs(claimed - measured) <= tolerance:
            return None
        return Check(name, False, f"record claims final_accuracy {claimed:.6g}, harness measured {measured:.6g} from "
                                  "rank 0's final weights")
    own = own_models if isinstance(own_models, list) else []
    candidates = own + ([] if measured is None else [("rank 0's model on the whole test set", measured, tolerance)])
    says = f"record claims final_accuracy {claimed:.6g}"
    matched = next(((what, value) for what, value, allowed in candidates if abs(claimed - value) <= allowed), None)
    if matched:
        return Check(name, True, f"{says}: {matched[0]} measured {matched[1]:.6g} (the ranks' final states differ, "
                                 "observed:replicas_identical: the claim is held against what was counted)")
    shown = "; ".join(f"{what} {value:.6g}" for what, value, _ in candidates)
    if not own:
        why = own_models if isinstance(own_models, str) else "no rank's own model was evaluated on what it evaluated"
        return Check(name, True, f"{says}: not comparable, the ranks' final states differ "
                                 f"(observed:replicas_identical) and {why}" + (f" (harness measured {shown})"
                                                                               if shown else ""), applicable=False)
    return Check(name, False, f"{says}, harness measured {shown}: none of them, each rank's own model held "
                              "against what it evaluated (the ranks' final states differ, observed:replicas_identical)")

# -------------------------------------------------------------------------------------------- checks


def check_process_group(observations: Observations, backend: str, world_size: int) -> Check:
    name = "process_group"
    seen = observations.ranks
    missing = [r for r in range(world_size) if r not in seen]
    if backend == "none":
        groups = [g for rank in seen.values() for g in rank.process_groups]
        if groups or missing or len(seen) != 1:
            return Check(name, False, f"expected one process and no process group; harness observed {len(seen)} "
                                      f"process(es) and {len(groups)} group(s)")
        return Check(name, True, "one process, no process group, as expected")
    problems = [_spawned(note) for note in observations.spawned]
    if missing:
        problems.append(f"rank {_join(missing)} left no observations (crashed or killed before exit?)")
    extra = sorted(r for r in seen if r >= world_size)
    if extra:
        problems.append(f"rank {_join(extra)} is outside world size {world_size}")
    if world_size == 1 and not problems and list(seen) == [0] and not seen[0].process_groups:
        return Check(name, True, "one process and no process group: optional at world size 1 (labs/README.md, "
                                 "section 2)")
    for rank, observed in sorted(seen.items()):
        if not observed.process_groups:
            problems.append(f"rank {rank} never initialised a process group")
            continue
        group = observed.process_groups[-1]
        if not _backend_is(group, backend) or group["world_size"] != world_size:
            config = f" (backend config {group['backend_config']})" if group.get("backend_config") else ""
            problems.append(f"rank {rank} initialised backend {group['backend']}{config} at world size "
                            f"{group['world_size']}")
    if problems:
        return Check(name, False, f"expected backend {backend} at world size {world_size}; harness observed: "
                                  + "; ".join(problems))
    return Check(name, True, f"all {world_size} ranks initialised backend {backend} at world size {world_size}")


def _backend_is(group: dict[str, Any], backend: str) -> bool:
    """The group uses `backend`: as get_backend() said, or per device type in its backend config."""
    if group["backend"] == backend:
        return True
    config = group.get("backend_config")
    return isinstance(config, str) and backend in {part.rpartition(":")[2] for part in config.split(",")}


def _spawned(note: dict[str, Any]) -> str:
    """A launched rank that spawned processes itself, and the fix (the note is the program's side: read with care)."""
    launcher = str(note.get("launcher", "its launcher"))[:40]
    rank = note.get("rank")
    nprocs = note.get("nprocs")
    who = f"rank {rank}" if isinstance(rank, int) else "a rank"
    how = f"(nprocs={nprocs})" if isinstance(nprocs, int) else ""
    return (f"{who}, started by {launcher}, spawned processes itself (mp.spawn{how}): every launched rank starts a "
            f"whole world of its own, on the same port and the same ranks (address in use, ranks missing, shards "
            f"short follow from it); read RANK, WORLD_SIZE and LOCAL_RANK from the environment {launcher} set and "
            f"do not spawn (labs/README.md, section 2: a lab never spawns its own ranks)")


def check_one_writer(ranks: list[RankObservation]) -> Check:
    name = "one_writer_per_checkpoint"
    writers: dict[str, set[int]] = {}
    for r in ranks:
        for save in r.saves:
            writers.setdefault(save["path"], set()).add(r.rank)
    shared = {path: sorted(who) for path, who in writers.items() if len(who) > 1}
    if shared:
        path, who = next(iter(sorted(shared.items())))
        more = f" (and {len(shared) - 1} more file(s))" if len(shared) > 1 else ""
        return Check(name, False, f"ranks {_join(who, ' and ')} {'both' if len(who) == 2 else 'all'} saved "
                                  f"{path}{more}")
    if not writers:
        return Check(name, True, "no rank saved anything with torch.save")
    return Check(name, True, f"{len(writers)} file(s) saved, each by one rank ("
                 + ", ".join(f"rank {next(iter(who))}: {Path(path).name}" for path, who in sorted(writers.items()))
                 + ")")


def check_steps(ranks: list[RankObservation]) -> Check:
    name = "optimizer_steps_equal"
    steps = {r.rank: r.optimizer_steps for r in ranks}
    if not steps:
        return Check(name, False, "harness observed no rank")
    outside = _steps_outside(ranks)
    if len(set(steps.values())) > 1:
        return Check(name, False, "harness observed " + ", ".join(f"rank {r} took {n} steps" for r, n in steps.items())
                     + outside)
    return Check(name, True, f"every rank took {next(iter(steps.values()))} optimizer steps{outside}")


def check_clock(observations: Observations) -> Check:
    ages = [(r.training or {}).get("kernel_age_s") for r in observations.ranks.values()]
    if not ages or any(not isinstance(age, (int, float)) for age in ages):
        return Check("clock", True, f"{NOT_VERIFIED}: the kernel's account of a rank's age was not read",
                     applicable=False)
    slowed = clock_disagreement(observations)
    if slowed:
        return Check("clock", False, slowed)
    return Check("clock", True, f"every rank's clock agreed with the kernel's account of its age ({len(ages)} rank(s))")


def _steps_outside(ranks: list[RankObservation]) -> str:
    """The steps every rank took outside its training passes, and where they come from if known."""
    outside = {r.rank: r.optimizer_steps - sum(p.steps for p in r.passes) for r in ranks}
    if not any(outside.values()):
        return ""
    counts = set(outside.values())
    inside = {r.rank: r.optimizer_steps - outside[r.rank] for r in ranks}
    what = (f"{next(iter(inside.values()))} in its training passes and {next(iter(counts))} outside any"
            if len(counts) == 1 and len(set(inside.values())) == 1 else
            ", ".join(f"rank {r}: {n} outside its training passes" for r, n in outside.items()))
    before = all(r.training_epochs and r.training_epochs[0].steps_before == outside[r.rank] for r in ranks)
    horovod = all(r.process_groups and r.process_groups[-1]["api"] == "horovod" for r in ranks)
    if before and horovod and counts == {1}:
        return f" ({what}, before the first: {HOROVOD_INIT_STEP})"
    return f" ({what}{', before the first' if before else ''})"


def check_checkpoints(found: list[dict[str, Any]]) -> Check:
    """The evaluator's loading of each rank's last saved model state (harness/observe/checkpoint_loads.py)."""
    name = "checkpoint_loads"
    checked = [entry for entry in found if entry.get("loads") is not None]
    if not checked:
        skipped = "; ".join(entry["detail"] for entry in found)
        return Check(name, True, "not applicable: no file a rank saved holds a model state"
                     + (f" ({skipped})" if skipped else ""), applicable=False)
    failing = [entry for entry in checked if not entry["loads"]]
    if failing:
        entry = failing[0]
        return Check(name, False, f"{entry['path']} (rank {entry['rank']}'s last checkpoint) does not load into "
                                  f"{entry.get('into', 'the model')}: {entry['detail']}"
                     + (f" (and the last checkpoint of {len(failing) - 1} more rank(s))" if len(failing) > 1 else ""))
    return Check(name, True, "; ".join(f"{entry['path']} (rank {entry['rank']}'s last checkpoint) loads into "
                                       f"{entry.get('into', 'the model')}: {entry['detail']}" for entry in checked))


def check_observer(observations: Observations) -> Check:
    """The observer's own health: when it failed somewhere, the other checks may lack evidence."""
    problems = observations.problems + [f"rank {r.rank}: {error}" for r in observations.ranks.values()
                                        for error in r.errors]
    if problems:
        return Check("observer", False, _first(problems, "problem"))
    return Check("observer", True, f"observations complete from {len(observations.ranks)} rank(s)")
