"""The plain loops a lab's throughput is measured against, in the same grade run on the same machine.

Absolute img/s or GB/s never carry from one CPU to the next (machines of one kind differ up to 8x),
but a ratio measured side by side does: the lab against the tightest loop of the same work, at the
same threads. One row per reference; `distlab grade` runs a reference just before the first cell
that needs it (runner.run_lab, like any lab) and compares each run of the cell with it.

A student's own program (`distlab grade --program`) is timed against the course's lab instead, in
the same cell, launched alike and timed by the same observer (`course_lab`): only the program
differs, so the profile's calibrated ratio (lab to plain loop) gives way to PROGRAM_RATIO_FLOOR of
the lab's rate. A plain loop's ratio moves with the machine's load (cpu-grade's ddp at world size 2
measured 0.41 idle, 0.66 beside two busy processes), which a program half as fast could hide in; the
lab's ratio to itself does not.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from harness.catalog import Lab
from harness.on_ranks import PLAIN_ALLREDUCE, TRAIN_LOOP
from harness.run.request import RunRequest
from harness.run.run_dir import RUN_DIR_PLACEHOLDER

# Of the course lab's rate, for a student's program: halfway, geometrically, between as fast as the
# lab (1) and half as fast (0.5), which must fail. Another way of loading or timing costs a correct
# program a little, and the paired runs' noise under load was within 15% here.
PROGRAM_RATIO_FLOOR = 0.7
# A student's program is judged on paired runs: course lab, program, course lab, program, ... course
# lab, each run over the mean of the lab's runs just before and after it, and the verdict on the
# median of those ratios. A load that changes steadily slows a run and its neighbours alike; one
# that comes and goes (another program's burst) can tip one pair, not the median of three. So at
# least this many runs of a timed program, whatever --repeats says (more repeats: more pairs).
PROGRAM_PAIRS = 3


@dataclass(frozen=True)
class Reference:
    name: str
    program: Path
    metric: str  # read from the reference's record, compared with the lab's throughput metric
    # True: launched exactly like the lab (launcher, backend). False: as many ranks as the lab at
    # its threads per rank, side by side under torchrun, meeting over gloo only outside the timed
    # work (at world size 1, one plain process): the machine shared as the lab's ranks share it.
    like_lab: bool
    summary: str
    observed: bool = False  # timed by the harness's observer (a course training lab), not read from its record

    def request(self, lab_request: RunRequest) -> RunRequest:
        """The reference run for one cell of a lab: the lab's own arguments and threads."""
        # The lab's own paths in its run directory (a checkpoint) mean nothing to the reference; left
        # out, cells that differ only in them share one reference measurement. Observed only when
        # it is timed like the program it stands beside (`observed`).
        args = _without_run_paths(lab_request.lab_args)
        several = lab_request.world_size > 1
        launcher = lab_request.launcher if self.like_lab else "torchrun" if several else "python"
        backend = lab_request.backend if self.like_lab else "gloo" if several else "none"
        return dataclasses.replace(lab_request, lab=self.name, program=self.program, max_restarts=0,
                                   lab_args=args, observe=self.observed, launcher=launcher, backend=backend)


def course_lab(lab: Lab, metric: str) -> Reference:
    """The reference of a student's program: the course's own lab, run like the program and, where the
    harness times the program's training itself (a data-parallel training lab), timed alike."""
    return Reference(f"course-{lab.name}", lab.path, metric, like_lab=True, observed=lab.data_parallel,
                     summary=f"the course's {lab.program} in the same cell, timed by the same observer")


def _without_run_paths(args: list[str]) -> list[str]:
    """The arguments less every `--flag VALUE` (or `--flag=VALUE`) whose value names the run directory."""
    kept: list[str] = []
    for arg in args:
        if RUN_DIR_PLACEHOLDER in arg:
            if kept and kept[-1].startswith("-") and "=" not in kept[-1]:
                kept.pop()  # its flag
            continue
        kept.append(arg)
    return kept


REFERENCES = {reference.name: reference for reference in [
    Reference("train_loop", TRAIN_LOOP, "img_per_sec", like_lab=False,
              summary="forward, backward and step on one resident batch: the lab's model, batch, threads and ranks"),
    Reference("plain_allreduce", PLAIN_ALLREDUCE, "avg_busbw_gbps", like_lab=True,
              summary="the bare library all-reduce in a timed loop, same sizes, ranks and backend"),
]}

