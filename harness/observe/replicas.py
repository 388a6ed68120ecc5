"""The data-parallel checks of the model every rank holds (the rules beside data_parallel.py's):

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
- parameters_trained: on every rank the parameters the optimizers update differ at exit from what
  they were before the first optimizer step (the observer digests them both, the same way): a program
  that steps an optimizer without gradients ends as it began. Not verified (not applicable, never
  passed) where the observer could not take both digests.
- replicas_in_step: at every sampled step (distlab_observer's hooks.SAMPLED_STEPS) that every rank took,
  every rank's parameters had the same digest: a data-parallel run's replicas are equal after every step, not
  only at the end (a program that trains each rank alone and broadcasts rank 0's state after each
  epoch ends with equal replicas). Not verified where no sampled step was digested on every rank.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.observe.check import NOT_VERIFIED, Check, _join
from harness.observe.observations import RankObservation

# Where the course teaches what the replicas check finds (labs/TRAINING.md), and its fix in one line.
BATCHNORM_LESSON = ("the BatchNorm lesson (labs/TRAINING.md, \"One model at the end of training\"): average the "
                    "running statistics over the ranks before evaluating and saving (one all-reduce, then divide "
                    "by the world size), or broadcast rank 0's")


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
