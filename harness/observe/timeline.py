"""Where a run's time went, phase by phase: from the harness's stamps around the launch (RunResult.stamps)
and each rank's timeline (the observer's, fileformat.TIMELINE), all on the host's CLOCK_MONOTONIC.

For the user's information (`distlab grade --timings`), never for a verdict: the stamps are the ranks'
own, and a program could move them; the phases only say where to look. Each phase is the time from the
milestone before it to its own, on the slowest rank (the run goes on only when every rank has reached
a milestone: the rendezvous, its last step); a milestone no rank reached gives its time to the next
phase, so the phases of a run always add up to its time from run_lab's start to its accounts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from harness.observe.observations import Observations
from harness.run.state import RunResult

# Each phase of a run, after the milestone that ends it (a stamp of the harness's, or a rank's timeline's).
RUN_PHASES: tuple[tuple[str, str], ...] = (
    ("prepare", "launched"),  # the harness: run folder, environment, command line, rendezvous store
    ("launcher", "observer_loaded"),  # the launcher's start (torchrun imports torch too), the ranks' interpreters
    ("torch", "torch_imported"),  # a rank's import of torch
    ("imports", "process_group_called"),  # the program's own imports (torchvision, its modules), its setup
    ("rendezvous", "process_group"),  # init_process_group: the ranks meet (the slowest rank's start included)
    ("data", "first_batch"),  # the data set and the model made, the first batch drawn
    ("training", "last_step"),  # first batch to last optimizer step
    ("after_training", "exit"),  # the program's evaluation, its saves, destroy_process_group
    ("exit", "exited"),  # final weights written, interpreters and launcher ended, every process stopped
    ("accounts", "accounted"),  # the harness: rank logs, the record read, run.json
)
PHASES = tuple(phase for phase, _ in RUN_PHASES)
EVALUATE = "evaluate"  # the harness's own, after the run: its observations read, weights evaluated, checks


def slowest_rank(attempt: Observations) -> dict[str, float]:
    """Each milestone as the slowest rank reached it (the latest stamp); absent where no rank stamped it."""
    reached: dict[str, float] = {}
    for rank in attempt.ranks.values():
        for milestone, at in rank.timeline.items():
            if isinstance(at, (int, float)) and not isinstance(at, bool):
                reached[milestone] = max(reached.get(milestone, at), at)
    return reached


def phases_of(stamps: Mapping[str, float], attempts: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Seconds per phase (PHASES) of one launch: `stamps` the harness's (RunResult.stamps), `attempts` each
    attempt's milestones in order (slowest_rank; a run restarted by torchrun has two). A milestone missing,
    or earlier than the one before it (a rank's clock is its own to misreport), passes its time on to the
    next phase; where no rank stamped anything, the launch is the launcher's phase. Empty where the harness
    has no stamps (the run never launched)."""
    if "began" not in stamps or "accounted" not in stamps:
        return {}
    phases = dict.fromkeys(PHASES, 0.0)
    ranks_own = RUN_PHASES[1:-2]  # between the launch and the launcher's end: the ranks' own milestones
    ceiling = stamps.get("exited", stamps["accounted"])  # a rank's stamp past the run's end is no stamp
    steps = [("prepare", stamps.get("launched"))]
    steps += [(phase, attempt[m] if attempt.get(m, ceiling + 1) <= ceiling else None)
              for attempt in attempts for phase, m in ranks_own]
    # A run whose ranks stamped nothing (no observer, or a program without torch): its launcher's whole time.
    steps += [("exit" if any(attempts) else "launcher", stamps.get("exited")), ("accounts", stamps["accounted"])]
    previous = stamps["began"]
    for phase, at in steps:
        if at is None or at < previous:
            continue
        phases[phase] += at - previous
        previous = at
    return phases


def run_phases(result: RunResult, *attempts: Observations) -> dict[str, float]:
    """A launch's phases (phases_of), from its result and the observations of each of its attempts."""
    return phases_of(result.stamps, [slowest_rank(attempt) for attempt in attempts])


def add(into: dict[str, float], more: Mapping[str, float]) -> dict[str, float]:
    """Phases summed key by key (a cell of two launches: the resume cell's uninterrupted run and its restart)."""
    for phase, seconds in more.items():
        into[phase] = into.get(phase, 0.0) + seconds
    return into
