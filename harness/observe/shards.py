"""The data-parallel checks of what each rank's data loaders drew (the rules beside data_parallel.py's):

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
"""

from __future__ import annotations

from itertools import combinations

from harness.observe.check import NOT_VERIFIED, Check, _first, _join
from harness.observe.observations import RankObservation


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
