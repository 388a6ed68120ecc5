"""A resume cell judged: did the restarted run go on where the stopped one stopped?

The cell (harness/grading/cells.py) runs the program uninterrupted, then again with its first
attempt stopped by the observer once `after` training epochs are done (at the first optimizer step
of the next) and restarted by torchrun. Every rank's training epochs of the two attempts, one after
the other, must be the uninterrupted run's: as many, each drawing the same samples in the same
order (the data order, which DistributedSampler's seed and set_epoch decide), with as many steps.
A program that records the epoch it finished rather than the next one resumes at that epoch and
trains it twice; one that loads no checkpoint starts again at epoch 0. Both are named, by the epoch
whose order the restart drew first and by whether the restart read (torch.load, observed) a file
the stopped attempt had saved.
"""

from __future__ import annotations

from pathlib import Path

from harness.observe.check import Check, _join
from harness.observe.observations import LoaderPass, Observations, RankObservation

NAME = "resume_continues"


def not_comparable(why: str) -> Check:
    return Check(NAME, True, f"not applicable: {why}", applicable=False)


def check_resume(uninterrupted: Observations, stopped: Observations, resumed: Observations, after: int) -> Check:
    """The stopped and resumed attempts' training epochs against the uninterrupted run's, rank by rank."""
    ranks = sorted(uninterrupted.ranks)
    if not ranks:
        return not_comparable("the uninterrupted run left no observations")
    missing = [r for r in ranks if r not in stopped.ranks]
    if missing:
        trained = {r: len(o.training_epochs) for r, o in uninterrupted.ranks.items()}
        if all(n <= after for n in trained.values()):
            return not_comparable(f"the program trains {max(trained.values())} epoch(s), so it was never stopped "
                                  f"after {after}")
        return Check(NAME, False, f"rank {_join(missing)} of the stopped attempt left no observations: it was not "
                                  f"stopped after {after} training epoch(s) as asked (the observer's stop), or it "
                                  "exited before it could write them")
    problems, first_steps = [], {}
    for rank in ranks:
        if rank not in resumed.ranks:
            problems.append(f"rank {rank} of the restarted attempt left no observations")
            continue
        whole = [_order(p) for p in uninterrupted.ranks[rank].training_epochs]
        before = [_order(p) for p in stopped.ranks[rank].training_epochs]
        after_restart = [_order(p) for p in resumed.ranks[rank].training_epochs]
        if before != whole[:len(before)]:
            problems.append(f"rank {rank}'s epochs before the stop drew other samples than the uninterrupted run's")
            continue
        if before + after_restart == whole:
            steps = (stopped.ranks[rank].stopped or {}).get("steps", 0) + resumed.ranks[rank].optimizer_steps
            if steps != uninterrupted.ranks[rank].optimizer_steps:
                problems.append(f"rank {rank} took {steps} optimizer steps over the two attempts, the uninterrupted "
                                f"run {uninterrupted.ranks[rank].optimizer_steps}")
            first_steps[rank] = steps
            continue
        if not after_restart:
            problems.append(f"rank {rank} trained no epoch after the restart (the uninterrupted run trained "
                            f"{len(whole) - len(before)} more)")
            continue
        start = next((e for e, order in enumerate(whole) if order == after_restart[0]), None)
        total = len(before) + len(after_restart)
        if start is None:
            problems.append(f"rank {rank}'s first epoch after the restart drew an order the uninterrupted run never "
                            f"drew ({total} epochs in all, {len(whole)} uninterrupted)")
        elif start < len(before):
            again = ", ".join(str(e) for e in range(start, len(before)))
            read = _read_a_save(resumed.ranks[rank], stopped)
            what = (f"it read {read}, saved before the stop, and went on at the epoch that file records: the one it "
                    "had finished, not the next one to run" if read and start == len(before) - 1 else
                    f"it read {read}, saved before the stop, and went on at epoch {start}" if read else
                    "it read no file the stopped attempt had saved: it started again")
            problems.append(f"rank {rank} resumed at epoch {start} after {len(before)} epoch(s) had finished: epoch(s) "
                            f"{again} trained twice, {total} epochs in all where the uninterrupted run trained "
                            f"{len(whole)} ({what})")
        else:
            problems.append(f"rank {rank} resumed at epoch {start} after {len(before)} had finished: epoch(s) "
                            f"{', '.join(str(e) for e in range(len(before), start))} never trained")
    if problems:
        more = len(problems) - 1  # one a rank: a bare "(and 1 more)" after "epoch(s) 1" reads as an epoch
        return Check(NAME, False, problems[0] + (f" (and {more} more rank{'s' if more > 1 else ''})" if more else ""))
    epochs = len(uninterrupted.ranks[ranks[0]].training_epochs)
    return Check(NAME, True, f"every rank resumed at epoch {after}: the {after} epoch(s) before the stop and the "
                             f"{epochs - after} after the restart drew the uninterrupted run's samples in its order, "
                             f"epoch by epoch, and took its {first_steps.get(ranks[0])} optimizer steps")


def _read_a_save(resumed: RankObservation, stopped: Observations) -> str | None:
    """The name of a file the stopped attempt saved that this rank of the restart read, if one."""
    saved = {save["path"] for rank in stopped.ranks.values() for save in rank.saves}
    return next((Path(load["path"]).name for load in resumed.loads if load["path"] in saved), None)


def _order(epoch: LoaderPass) -> tuple[int, ...]:
    return tuple(epoch.indices)
