"""The data-parallel checks, computed by the harness from what its observer saw on every rank
(observations.py reads it), and the record's claims that they contradict.

A lab's record says which of its own checks passed; that is the program's word. `checks` judges the
run from the observations alone, and `compare_claims` turns each claim of the record that the
observations contradict into a failed check.

The rules, per check:

- process_group: every rank of the expected world size left observations, initialised a process
  group (torch.distributed, or Horovod's hvd.init) whose backend and world size are the expected
  ones, and reported its own rank. Backend "none" expects one process and no group.
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
- replicas_identical: every rank's final parameters and buffers are bitwise equal: one model. The
  parameters are equal after every step of a correct run; BatchNorm's running statistics are not
  unless the program makes them so: each rank updates them from its own batches (DDP broadcasts
  rank 0's at the start of each forward, and the forward moves them again), so a program that
  evaluates or saves without averaging them (labs/common/replicas.average_buffers) holds a
  different model on every rank. That is the course's BatchNorm lesson, and the detail names it
  with its fix. Which parts differ are the check's `causes` ("parameters", "buffers"): a claim is
  contradicted only by the part it is about (CLAIMS).
- one_writer_per_checkpoint: no file (the path a torch.save ended up at, following a rename) was
  saved by more than one rank.
- optimizer_steps_equal: every rank took the same number of optimizer steps.
- observer: the observer itself ran without an error on every rank and all its files were readable.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

from harness.observe.observations import Observations, RankObservation

# The record's claims (labs/common/replicas.py writes them), the observed check that answers each,
# and the part of it the claim is about: a check failed for another cause does not contradict it
# (equal parameters beside differing BatchNorm statistics: params_identical is true). None: any.
CLAIMS: dict[str, tuple[str, str | None]] = {
    "params_identical": ("replicas_identical", "parameters"),
    "buffers_identical": ("replicas_identical", "buffers"),
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

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "detail": self.detail, "applicable": self.applicable}



def checks(observations: Observations, expected_backend: str, expected_world_size: int,
           train_set_size: int | None = None) -> list[Check]:
    """Every data-parallel check, judged from the observations alone."""
    ranks = [observations.ranks[r] for r in sorted(observations.ranks)]
    return [
        check_process_group(observations, expected_backend, expected_world_size),
        *check_shards(ranks, train_set_size),
        check_order_changes(ranks),
        check_replicas(ranks),
        check_one_writer(ranks),
        check_steps(ranks),
        check_observer(observations),
    ]



def compare_claims(record: dict[str, Any] | None, observed: list[Check], measured_accuracy: float | None = None,
                   accuracy_tolerance: float = 1e-6, measured_img_per_sec: float | None = None) -> list[Check]:
    """A failed check for each claim of the record that the harness observed to be false.

    A claim is a check the record says passed; the observed check it names (CLAIMS) failed, for the
    cause the claim is about. With measured_accuracy (harness/observe/accuracy.py), the record's
    final_accuracy is a claim too, judged like with like: where the ranks' buffers differ (observed),
    each rank evaluated its own model, so the lab's sum over shards and rank 0's model on the whole
    test set are honestly different numbers, and the claim is not applicable (the replicas check
    fails, with the lesson). With measured_img_per_sec (`throughput`), its img_per_sec, beyond
    THROUGHPUT_CLAIM_FACTOR.
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
    if measured_accuracy is not None and isinstance(claimed, (int, float)) \
            and abs(claimed - measured_accuracy) > accuracy_tolerance:
        says = (f"record claims final_accuracy {claimed:.6g}, harness measured {measured_accuracy:.6g} from "
                "rank 0's final weights")
        replicas = by_name.get("replicas_identical")
        if replicas is not None and replicas.causes == ("buffers",):
            contradicted.append(Check("claim:final_accuracy", True, f"{says}: not comparable, the ranks' buffers "
                                      "differ (observed:replicas_identical), so each rank counted its test shard "
                                      "with a model of its own", applicable=False))
        else:
            contradicted.append(Check("claim:final_accuracy", False, says))
    rate = ((record or {}).get("metrics") or {}).get("img_per_sec")
    if measured_img_per_sec and isinstance(rate, (int, float)) \
            and rate > THROUGHPUT_CLAIM_FACTOR * measured_img_per_sec:
        contradicted.append(Check("claim:img_per_sec", False,
                                  f"record claims img_per_sec {rate:.4g}, harness timed {measured_img_per_sec:.4g} "
                                  f"from every rank's optimizer steps"))
    return contradicted


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
    problems = []
    if missing:
        problems.append(f"rank {_join(missing)} left no observations (crashed or killed before exit?)")
    extra = sorted(r for r in seen if r >= world_size)
    if extra:
        problems.append(f"rank {_join(extra)} is outside world size {world_size}")
    for rank, observed in sorted(seen.items()):
        if not observed.process_groups:
            problems.append(f"rank {rank} never initialised a process group")
            continue
        group = observed.process_groups[-1]
        if group["backend"] != backend or group["world_size"] != world_size:
            problems.append(f"rank {rank} initialised backend {group['backend']} at world size {group['world_size']}")
    if problems:
        return Check(name, False, f"expected backend {backend} at world size {world_size}; harness observed: "
                                  + "; ".join(problems))
    return Check(name, True, f"all {world_size} ranks initialised backend {backend} at world size {world_size}")


def _epochs(ranks: list[RankObservation]) -> tuple[int, str]:
    """Training epochs every rank has, and a note when the ranks differ."""
    counts = {r.rank: len(r.training_epochs) for r in ranks}
    if len(set(counts.values())) > 1:
        return min(counts.values()), " (ranks trained for different numbers of epochs: " + ", ".join(
            f"rank {r} {n}" for r, n in counts.items()) + ")"
    return (min(counts.values()) if counts else 0), ""


def check_shards(ranks: list[RankObservation], train_set_size: int | None) -> list[Check]:
    epochs, note = _epochs(ranks)
    if not epochs:
        why = "harness observed no training epoch (no loader pass with an optimizer step) on " + (
            "any rank" if not ranks else "some rank")
        return [Check("shards_disjoint", False, why), Check("shards_cover", False, why)]

    overlaps, covers = [], []
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

    disjoint = (Check("shards_disjoint", False, _first(overlaps) + note) if overlaps else
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
    epochs, note = _epochs(ranks)
    if epochs < 2:
        return Check(name, True, f"not applicable: {epochs} training epoch(s) observed, 2 or more needed to compare",
                     applicable=False)
    repeats = [f"rank {r.rank} trained in the same order in epochs {e - 1} and {e}"
               for r in ranks for e in range(1, epochs)
               if r.training_epochs[e].indices == r.training_epochs[e - 1].indices]
    if repeats:
        return Check(name, False, _first(repeats) + " (a sampler repeats its order when set_epoch is not called)"
                     + note)
    return Check(name, True, f"every rank's order changed between each of its {epochs} training epochs{note}")


def check_replicas(ranks: list[RankObservation]) -> Check:
    name = "replicas_identical"
    without = [r.rank for r in ranks if not r.model]
    if not ranks or without:
        return Check(name, False, f"harness found no trained model on rank {_join(without) or '(none)'} "
                                  "(no optimizer step, or the observer could not find the module)")
    first, others = ranks[0], ranks[1:]
    differing = {r.rank: _buffers_differing(first.model, r.model) for r in others
                 if r.model.get("buffers_sha256") != first.model.get("buffers_sha256")}
    params = {r.model["params_sha256"] for r in ranks}
    if len(params) > 1:
        groups: dict[str, list[int]] = {}
        for r in ranks:
            groups.setdefault(r.model["params_sha256"], []).append(r.rank)
        split = "; ".join(f"rank {_join(rs)}: {digest[:12]}" for digest, rs in groups.items())
        return Check(name, False, f"harness observed {len(params)} distinct digests of the final parameters "
                                  f"over {len(ranks)} ranks ({split})",
                     causes=("parameters", "buffers") if differing else ("parameters",))
    if not differing:
        return Check(name, True, f"final parameters and buffers bitwise equal on all {len(ranks)} ranks "
                                 f"({next(iter(params))[:12]}): one model")
    names = sorted({buffer for buffers in differing.values() for buffer in buffers})
    kinds = (first.model.get("buffers") or {})
    batchnorm = bool(names) and all((kinds.get(buffer) or {}).get("module") == "BatchNorm" for buffer in names)
    what = "BatchNorm running statistics" if batchnorm else "buffers"
    which = f", in {len(names)} buffer(s), e.g. {names[0]}" if names else ""
    who = f"rank{'s' if len(differing) > 1 else ''} {_join(sorted(differing), ' and ')}"
    return Check(name, False, f"parameters identical; {what} differ on {len(differing)} of {len(ranks)} ranks "
                              f"({who} from rank {first.rank}'s{which}): each rank holds "
                              "a different model to evaluate and save"
                              + (f"; {BATCHNORM_LESSON}" if batchnorm else ""), causes=("buffers",))


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
    if len(set(steps.values())) > 1:
        return Check(name, False, "harness observed " + ", ".join(f"rank {r} took {n} steps" for r, n in steps.items()))
    return Check(name, True, f"every rank took {next(iter(steps.values()))} optimizer steps")


def check_observer(observations: Observations) -> Check:
    """The observer's own health: when it failed somewhere, the other checks may lack evidence."""
    problems = observations.problems + [f"rank {r.rank}: {error}" for r in observations.ranks.values()
                                        for error in r.errors]
    if problems:
        return Check("observer", False, _first(problems))
    return Check("observer", True, f"observations complete from {len(observations.ranks)} rank(s)")


def _first(items: list[str]) -> str:
    return items[0] + (f" (and {len(items) - 1} more)" if len(items) > 1 else "")


def _join(numbers: list[int], last: str = ", ") -> str:
    words = [str(n) for n in numbers]
    return last.join(words) if len(words) <= 2 else ", ".join(words[:-1]) + last + words[-1]

