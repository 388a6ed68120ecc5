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
- Training epochs: a rank's passes over a data loader during which its optimizer stepped, in
  order; passes without a step (evaluation) are not training. Epoch e is every rank's e-th.
- shards_disjoint: in every training epoch no sample index was fetched twice, by two ranks or by
  one. (DistributedSampler's padding, drop_last=False with a dataset that does not divide by the
  world size, repeats samples and fails this: the labs trim instead.)
- shards_cover: in every training epoch the ranks together fetched at least N - (G - 1) distinct
  indices of the N in the training set, G the global batch (the sum of the ranks' largest batch):
  drop_last can trim fewer than world_size samples in the sampler and fewer than one batch per
  rank in the loader, together at most G - 1. N is train_set_size when the harness knows it, else
  the length of the dataset the loader read (the same on every rank, or the check fails).
- order_changes_per_epoch: no rank fetched the same sequence of samples in two consecutive
  training epochs (a DistributedSampler without set_epoch repeats its permutation). With fewer
  than two training epochs there is nothing to compare: the check is not applicable, which
  counts as passed (`applicable` is False and the detail says so; a grader shows it as n/a).
- The pass records the three checks above rest on are held against the line the observer streamed
  on the rank's stderr when each pass ended (observations.verify_passes): where a record differs (the
  program changed it in its process before exit), or a pass's line never came although the harness
  collected the run's lines, the three are not verified (not applicable, never passed), and a record
  that differs fails the observer check.
- replicas_identical: the model every rank evaluated, saved or reported is one model. Every rank's
  final parameters are bitwise equal, and so are its buffers, unless a rank holding buffers other
  than rank 0's did nothing with them: no evaluation pass (a loader pass without a step) after
  training began, no torch.save. The parameters are equal after every step of a correct run;
  BatchNorm's running statistics are not unless the program makes them so: each rank updates them
  from its own batches (DDP broadcasts rank 0's at the start of each forward, and the forward moves
  them again), so a program that evaluates or saves on every rank without averaging them
  (labs/common/replicas.average_buffers) holds a different model on every rank, and fails. One
  that evaluates and saves on rank 0 alone (the PyTorch DDP tutorial) outputs one model: rank 0's.
  Which parts differ are the check's `causes` ("parameters", "buffers"): a claim is contradicted
  only by the part it is about (CLAIMS). Where the parameters differ, the detail names what the
  observer can tell of why (`parameters_apart_because`): ranks that started from different weights
  (their digests at the first optimizer step), no DistributedDataParallel seen, every step taken
  inside no_sync.
- buffers_identical: every rank's final buffers are bitwise equal. Where they differ and nothing
  depended on them (above), it is a lesson (Check.lesson): the course's BatchNorm lesson, with its
  fix, costing nothing unless a rubric says so (harness/classgrade/rubric.py, lessons_cost). Where
  the parameters differ too, the buffers follow from them: a lesson, and the replicas check fails.
- checkpoint_loads: the last file each rank saved that holds a model state loads into the model
  (harness/observe/accuracy.py loads it, in its own process): the lab's, or the model the program
  trained where that is not the lab's. Not applicable where no rank saved one.
- one_writer_per_checkpoint: no file (the path a torch.save ended up at, following a rename) was
  saved by more than one rank.
- optimizer_steps_equal: every rank took the same number of optimizer steps. Steps taken outside
  any training pass are named: Horovod's broadcast_optimizer_state takes one on a fresh optimizer.
- parameters_trained: on every rank the parameters the optimizers update differ at exit from what
  they were before the first optimizer step (the observer digests them both, the same way): a program
  that steps an optimizer without gradients ends as it began. Not verified (not applicable, never
  passed) where the observer could not take both digests.
- replicas_in_step: at every sampled step (distlab_observer's hooks.SAMPLED_STEPS) that every rank took, every rank's
  parameters had the same digest: a data-parallel run's replicas are equal after every step, not
  only at the end (a program that trains each rank alone and broadcasts rank 0's state after each
  epoch ends with equal replicas). Not verified where no sampled step was digested on every rank.
- inputs_from_loader: on every rank, most forwards of the trained model with gradients on (training,
  not evaluation) were given at most the samples of the batch the loop had just received from its
  DataLoader: the size along the batch's leading sizes where the input's first or second dimension is
  one (micro-batches, a sequence-first model), else its first dimension, against the batch's inputs
  together (two views of an image concatenated are one batch). A program that trains on data of its
  own beside a decoy loader (every rank on the whole set, the sharded loader iterated only to show)
  gives its model more samples than the loader handed out. Where it fails, the checks that rest on the
  indices the loaders drew (shards_disjoint, shards_cover, order_changes_per_epoch) are not verified:
  those indices say nothing of what the model trained on. Not verified where the observer counted no
  such forward (a compiled or scripted model, a forward given keyword arguments only). What it cannot
  see: a decoy that hands out batches as large as the ones the model is given.
- clock: every rank's age by the observer's clock agrees with the kernel's account of it
  (observations.clock_disagreement): the harness's timings are the time's. Not verified where
  /proc did not say.
- observer: the observer itself ran without an error on every rank, all its files were readable, and
  every pass record matched the line streamed when the pass ended.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

from harness.observe.observations import Observations, RankObservation, clock_disagreement

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
# Where the course teaches what the replicas check finds (labs/TRAINING.md), and its fix in one line.
BATCHNORM_LESSON = ("the BatchNorm lesson (labs/TRAINING.md, \"One model at the end of training\"): average the "
                    "running statistics over the ranks before evaluating and saving (one all-reduce, then divide "
                    "by the world size), or broadcast rank 0's")
# Where a rank's optimizer steps outside its training passes come from, when the launcher's library says so.
HOROVOD_INIT_STEP = ("Horovod's broadcast_optimizer_state steps a fresh optimizer once with zero gradients to "
                     "create its state: with weight decay that step shrinks every weight; call it only when "
                     "resuming (the course lab does)")
# A program times its own steps its own way (with or without loading the next batch, say): its
# img_per_sec is a claim to contradict only when it exceeds the harness's by more than this factor.
THROUGHPUT_CLAIM_FACTOR = 1.5


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str  # one line: what the harness saw
    applicable: bool = True  # False: nothing to judge (passed is then True, the detail says why)
    causes: tuple[str, ...] = ()  # what failed, where a check can fail for more than one thing (CLAIMS)
    # A failed check that costs nothing here (nothing the program evaluated, saved or reported depended
    # on it): the grader shows it as a lesson, with the fix (verdicts.observed_verdicts).
    lesson: bool = False

    def to_dict(self) -> dict[str, Any]:
        found = {"name": self.name, "passed": self.passed, "detail": self.detail, "applicable": self.applicable}
        return {**found, "lesson": True} if self.lesson else found



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


def _epochs(ranks: list[RankObservation]) -> tuple[int, str]:
    """Training epochs every rank has, and a note when the ranks differ."""
    counts = {r.rank: len(r.training_epochs) for r in ranks}
    if len(set(counts.values())) > 1:
        return min(counts.values()), " (ranks trained for different numbers of epochs: " + ", ".join(
            f"rank {r} {n}" for r, n in counts.items()) + ")"
    return (min(counts.values()) if counts else 0), ""


def _passes_unverified(ranks: list[RankObservation]) -> str | None:
    """Why the pass records these checks rest on cannot be taken (observations.verify_passes), or None."""
    return next((r.passes_unverified for r in ranks if r.passes_unverified), None)


def check_shards(ranks: list[RankObservation], train_set_size: int | None) -> list[Check]:
    unverified = _passes_unverified(ranks)
    if unverified:
        return [Check(name, True, f"{NOT_VERIFIED}: {unverified}", applicable=False)
                for name in ("shards_disjoint", "shards_cover")]
    epochs, note = _epochs(ranks)
    if not epochs:
        why = "harness observed no training epoch (no loader pass with an optimizer step) on " + (
            "any rank" if not ranks else "some rank")
        return [Check("shards_disjoint", False, why), Check("shards_cover", False, why)]

    overlaps: list[str] = []
    covers: list[tuple[int, bool | None, str]] = []
    for epoch in range(epochs):
        passes = [(r.rank, r.training_epochs[epoch]) for r in ranks]
        # Disjoint: every pair of ranks, and each rank with itself (a sample fetched twice).
        for (a, pa), (b, pb) in combinations(passes, 2):
            shared = len(set(pa.indices) & set(pb.indices))
            if shared:
                overlaps.append(f"ranks {a} and {b} both fetched {shared} of the same samples in epoch {epoch}")
        for rank, p in passes:
            repeated = len(p.indices) - len(set(p.indices))
            if repeated:
                overlaps.append(f"rank {rank} fetched {repeated} samples twice in epoch {epoch}")
        # Cover.
        sizes = {p.dataset_len for _, p in passes}
        size = train_set_size if train_set_size is not None else (sizes.pop() if len(sizes) == 1 else None)
        if size is None:
            covers.append((epoch, None, f"the ranks read training sets of different lengths {sorted(sizes, key=str)}"))
            continue
        global_batch = sum(max(p.batch_sizes, default=0) for _, p in passes)
        fetched = set().union(*(p.indices for _, p in passes))
        outside = sum(1 for i in fetched if not 0 <= i < size)
        distinct = len(fetched) - outside
        required = size - (global_batch - 1)
        covers.append((epoch, distinct >= required and not outside,
                       f"{distinct} of {size} samples" + (f" and {outside} indices outside it" if outside else "")
                       + f" (at least {required} required: {size} minus global batch {global_batch} less one)"))

    disjoint = (Check("shards_disjoint", False, _first(overlaps, "overlap") + note) if overlaps else
                Check("shards_disjoint", True, f"no sample fetched twice in any of {epochs} training epoch(s) "
                                               f"over {len(ranks)} rank(s){note}"))
    failing = [(e, what) for e, ok, what in covers if not ok]
    if failing:
        epoch, what = failing[0]
        more = f" (and {len(failing) - 1} more epoch(s))" if len(failing) > 1 else ""
        cover = Check("shards_cover", False, f"harness observed epoch {epoch} covering {what}{more}{note}")
    else:
        cover = Check("shards_cover", True, f"every training epoch covered {covers[-1][2]}{note}")
    return [disjoint, cover]


def check_order_changes(ranks: list[RankObservation]) -> Check:
    name = "order_changes_per_epoch"
    unverified = _passes_unverified(ranks)
    if unverified:
        return Check(name, True, f"{NOT_VERIFIED}: {unverified}", applicable=False)
    epochs, note = _epochs(ranks)
    if epochs < 2:
        return Check(name, True, f"not applicable: {epochs} training epoch(s) observed, 2 or more needed to compare",
                     applicable=False)
    same = {r.rank: [f"{e - 1} and {e}" for e in range(1, epochs)
                     if r.training_epochs[e].indices == r.training_epochs[e - 1].indices] for r in ranks}
    repeats = [f"rank {rank} trained in the same order in epochs {', '.join(pairs)}"
               for rank, pairs in same.items() if pairs]  # one a rank: what "(and 1 more rank)" counts
    if repeats:
        return Check(name, False, _first(repeats, "rank") + " (a sampler repeats its order when set_epoch is not "
                     "called)" + note)
    return Check(name, True, f"every rank's order changed between each of its {epochs} training epochs{note}")


def check_replicas(ranks: list[RankObservation]) -> list[Check]:
    """replicas_identical and buffers_identical (the module's docstring has the rules)."""
    name = "replicas_identical"
    without = [r.rank for r in ranks if not r.model]
    if not ranks or without:
        why = (f"harness found no trained model on rank {_join(without) or '(none)'} (no optimizer step, or the "
               "observer could not find the module)")
        return [Check(name, False, why), Check("buffers_identical", False, why)]
    model = {r.rank: r.model for r in ranks if r.model}  # every rank's: the ones without returned above
    first, others = ranks[0], ranks[1:]
    differing = {r.rank: _buffers_differing(model[first.rank], model[r.rank]) for r in others
                 if model[r.rank].get("buffers_sha256") != model[first.rank].get("buffers_sha256")}
    params = {model[r.rank]["params_sha256"] for r in ranks}
    if len(params) > 1:
        groups: dict[str, list[int]] = {}
        for r in ranks:
            groups.setdefault(model[r.rank]["params_sha256"], []).append(r.rank)
        split = "; ".join(f"rank {_join(rs)}: {digest[:12]}" for digest, rs in groups.items())
        because = parameters_apart_because(ranks)
        return [Check(name, False, f"harness observed {len(params)} distinct digests of the final parameters "
                                   f"over {len(ranks)} ranks ({split})" + (f": {because}" if because else ""),
                      causes=("parameters", "buffers") if differing else ("parameters",)),
                Check("buffers_identical", False, "the buffers differ too, as the models do: they follow from the "
                                                  "parameters (observed:replicas_identical), no lesson of their own",
                      causes=("buffers",), lesson=True) if differing else
                Check("buffers_identical", True, f"the buffers are equal on all {len(ranks)} ranks; the parameters are "
                                                 "not (observed:replicas_identical)")]
    if not differing:
        same = f"final parameters and buffers bitwise equal on all {len(ranks)} ranks ({next(iter(params))[:12]})"
        return [Check(name, True, f"{same}: one model"), Check("buffers_identical", True, same)]
    names = sorted({buffer for buffers in differing.values() for buffer in buffers})
    kinds = (model[first.rank].get("buffers") or {})
    batchnorm = bool(names) and all((kinds.get(buffer) or {}).get("module") == "BatchNorm" for buffer in names)
    what = "BatchNorm running statistics" if batchnorm else "buffers"
    which = f", in {len(names)} buffer(s), e.g. {names[0]}" if names else ""
    who = f"rank{'s' if len(differing) > 1 else ''} {_join(sorted(differing), ' and ')}"
    apart = f"{what} differ on {len(differing)} of {len(ranks)} ranks ({who} from rank {first.rank}'s{which})"
    lesson = f"; {BATCHNORM_LESSON}" if batchnorm else ""
    used = [f"rank {r.rank} {' and '.join(uses)}" for r in others if r.rank in differing
            for uses in [_uses(r)] if uses]
    if used:
        return [Check(name, False, f"parameters identical; {apart}, and {'; '.join(used)}: each rank "
                                   f"holds a different model to evaluate and save{lesson}", causes=("buffers",)),
                Check("buffers_identical", False, f"{apart}: what the program evaluated or saved on "
                                                  f"{'those ranks' if len(used) > 1 else 'that rank'} depends on "
                                                  f"them{lesson}", causes=("buffers",))]
    unused = (f"no rank holding other {what} than rank {first.rank}'s evaluated or saved after training began, so "
              f"the model the program evaluated and saved is rank {first.rank}'s")
    return [Check(name, True, f"final parameters bitwise equal on all {len(ranks)} ranks ({next(iter(params))[:12]}); "
                              f"{apart}, but {unused} (observed:buffers_identical)", causes=("buffers",)),
            Check("buffers_identical", False, f"{apart}; {unused}{lesson}", causes=("buffers",), lesson=True)]


def parameters_apart_because(ranks: list[RankObservation]) -> str:
    """What the observer can tell of why the ranks' parameters ended apart, with the fix ("" where
    it can tell nothing: an older observation, or none of these)."""
    first = {r.rank: r.libraries.get("first_step_params_sha256") for r in ranks}
    if all(first.values()) and len(set(first.values())) > 1:
        return ("the ranks started from different weights (their parameters differed at the first optimizer step): "
                "build the model from the same seed on every rank, or broadcast rank 0's before training (DDP does "
                "when it wraps the model)")
    torch_ranks = [r for r in ranks if r.libraries and r.process_groups
                   and r.process_groups[-1].get("api") == "torch.distributed"]
    unwrapped = [r.rank for r in torch_ranks if not r.libraries.get("ddp_wraps")]
    if unwrapped:
        return (f"no DistributedDataParallel wrap was seen on rank {_join(unwrapped, ' and ')}: nothing averaged the "
                "gradients; wrap the model in DDP before training (or all-reduce the gradients before each step)")
    no_sync = [r.rank for r in torch_ranks
               if r.optimizer_steps and r.libraries.get("steps_in_no_sync") == r.optimizer_steps]
    if no_sync:
        return (f"every optimizer step on rank {_join(no_sync, ' and ')} was taken inside DDP's no_sync(): DDP never "
                "all-reduced a gradient; under no_sync only accumulate, and run the last micro-batch's backward and "
                "the step outside it")
    return ""


def _uses(rank: RankObservation) -> list[str]:
    """What a rank did with its model after training began: evaluated (a pass without a step), saved."""
    uses = []
    evaluated = rank.evaluations_after_training
    if evaluated:
        uses.append(f"evaluated with them ({len(evaluated)} loader pass(es) without an optimizer step, "
                    f"{sum(len(p.indices) for p in evaluated)} samples)")
    saved = rank.saves_after_training
    if saved:
        uses.append(f"saved them ({Path(saved[-1]['path']).name})")
    return uses


def _buffers_differing(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The buffers whose digests differ between two ranks' final models ([] where the observer did
    not digest each buffer: an older observation)."""
    mine, theirs = a.get("buffers") or {}, b.get("buffers") or {}
    return sorted(name for name in mine.keys() | theirs.keys()
                  if (mine.get(name) or {}).get("sha256") != (theirs.get(name) or {}).get("sha256"))


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


NOT_VERIFIED = "not verified"


def check_trained(ranks: list[RankObservation]) -> Check:
    name = "parameters_trained"
    evidence = {r.rank: (r.training or {}) for r in ranks}
    unknown = [rank for rank, t in evidence.items() if not (t.get("params_at_start") and t.get("params_at_end"))]
    if not ranks or unknown:
        return Check(name, True, f"{NOT_VERIFIED}: the observer took no digest of the parameters before the first "
                                 f"step and at exit on rank {_join(unknown) or '(none)'}", applicable=False)
    unchanged = [rank for rank, t in evidence.items() if t["params_at_start"] == t["params_at_end"]]
    if unchanged:
        return Check(name, False, f"harness observed rank {_join(unchanged)}'s parameters at exit bitwise equal to "
                                  "what they were before the first optimizer step: the optimizer stepped, nothing "
                                  "was trained (no gradients reached it?)")
    return Check(name, True, f"every rank's parameters at exit differ from what they were before the first step "
                             f"({len(ranks)} rank(s))")


def check_inputs_from_loader(ranks: list[RankObservation]) -> Check:
    name = "inputs_from_loader"
    counted = {r.rank: [p.samples for p in r.training_epochs if "trained_forwards" in p.samples] for r in ranks}
    unknown = [rank for rank, passes in counted.items() if not sum(s["trained_forwards"] for s in passes)]
    if not ranks or unknown:
        return Check(name, True, f"{NOT_VERIFIED}: the observer counted no forward with gradients in a training "
                                 f"epoch on rank {_join(unknown) or '(none)'} (an observer older than this count, a "
                                 "compiled or scripted model, a model given keyword arguments only)", applicable=False)
    for rank, passes in counted.items():
        forwards = sum(s["trained_forwards"] for s in passes)
        oversized = sum(s.get("oversized", 0) for s in passes)
        if 2 * oversized > forwards:  # most forwards: a last batch fetched ahead of its step is one
            largest = max(passes, key=lambda s: s.get("largest", 0))
            return Check(name, False, f"harness observed {oversized} of rank {rank}'s {forwards} forwards with "
                                      f"gradients in its training epochs given more samples than the batch its "
                                      f"DataLoader had just handed out ({largest.get('largest')} against "
                                      f"{largest.get('batch_most')}): the model trained on data the loader did not "
                                      "hand out (a decoy loader beside the real data?)")
    return Check(name, True, f"every forward with gradients was given at most the samples of the batch its "
                             f"DataLoader had just handed out ({len(ranks)} rank(s))")


def check_replicas_in_step(ranks: list[RankObservation]) -> Check:
    name = "replicas_in_step"
    sampled = [(r.training or {}).get("params_at_steps") or {} for r in ranks]
    common = sorted(set.intersection(*(set(s) for s in sampled)), key=int) if sampled else []
    if len(ranks) < 2 or not common:
        why = "one rank, nothing to compare" if len(ranks) == 1 else \
            "no sampled step's parameters were digested on every rank"
        return Check(name, True, f"{NOT_VERIFIED}: {why}", applicable=False)
    for step in common:
        digests = {r.rank: s[step] for r, s in zip(ranks, sampled, strict=True)}
        if len(set(digests.values())) > 1:
            apart = [rank for rank, d in digests.items() if d != digests[ranks[0].rank]]
            return Check(name, False, f"harness observed the parameters after optimizer step {step} differ between "
                                      f"rank {ranks[0].rank} and rank {_join(apart)}: the replicas trained apart "
                                      "(no gradient all-reduce?), whatever they ended as", causes=("parameters",))
    return Check(name, True, f"parameters bitwise equal on all {len(ranks)} ranks after optimizer step(s) "
                             f"{', '.join(common)}")


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
    """The evaluator's loading of each rank's last saved model state (harness/observe/accuracy.py)."""
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


def _first(items: list[str], each: str) -> str:
    """The first of several findings, and how many more of what (`each`: "rank", "overlap"): a bare
    "(and 1 more)" after "in epochs 0 and 1" reads as one more epoch."""
    more = len(items) - 1
    return items[0] + (f" (and {more} more {each}{'s' if more > 1 else ''})" if more else "")


def _join(numbers: list[int], last: str = ", ") -> str:
    words = [str(n) for n in numbers]
    return last.join(words) if len(words) <= 2 else ", ".join(words[:-1]) + last + words[-1]

