"""The timings of a grade as a terminal table (`distlab grade --timings`): one row per run, a column per
phase, the totals, then the grade's own steps, its wall time and the share no phase accounts for. The
figures are grading/timings.py's (the JSON summary's "timings"); this module only lays them out."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.markup import escape
from rich.table import Table

# Short headers: a dozen columns on a terminal of 120. Their meaning: observe/timeline.py, RUN_PHASES.
HEADERS = {"prepare": "prep", "launcher": "launch", "torch": "torch", "imports": "imp", "rendezvous": "rdzv",
           "data": "data", "training": "train", "after_training": "after", "exit": "exit", "accounts": "acct",
           "evaluate": "eval"}
STEP_NAMES = {"plan": "planning", "judge": "judging", "write": "writing outputs", "sandbox_setup": "sandbox setup",
              "sandbox_teardown": "sandbox teardown"}


def timings_table(timings: dict[str, Any], title: str) -> Table:
    columns = list(timings["phase_totals"])
    table = Table(title=escape(title), box=box.SIMPLE_HEAD, caption=escape(
        "seconds of CLOCK_MONOTONIC; a run is its cell (lab@world size) and number; per run from run_lab's "
        "start: prep(are) the run, launch(er and the ranks' interpreters), torch import, imp(orts: the "
        "program's own, to init_process_group), rdzv (init_process_group), data (to the first batch), train "
        "(to the last step), after (evaluation, saves), exit, acct (the run's accounts), eval (the harness's: "
        "observations, weights evaluated, checks); unaccounted: between the runs (the evaluator's start and end, "
        f"progress). {timings['sandbox']}"))
    table.add_column("run", no_wrap=True)
    for column in (*columns, "total"):
        table.add_column(HEADERS.get(column, column), justify="right", no_wrap=True)
    for row in timings["runs"]:
        label = f"{row['cell']} run {row['run']}{' (reference)' if row['reference'] else ''}"
        table.add_row(escape(label), *(f"{row['phases'][c]:.1f}" for c in columns), f"{row['seconds']:.1f}")
    table.add_section()
    table.add_row("runs, all", *(f"{timings['phase_totals'][c]:.1f}" for c in columns),
                  f"{timings['runs_seconds']:.1f}", style="bold")
    blank = [""] * len(columns)
    for step, seconds in timings["grade_steps"].items():
        table.add_row(STEP_NAMES.get(step, step), *blank, f"{seconds:.1f}")
    share = timings["unaccounted_share"]
    table.add_row("unaccounted", *blank,
                  f"{timings['unaccounted_seconds']:.1f}" + (f" ({share:.0%})" if share is not None else ""))
    table.add_row("grade wall time", *blank, f"{timings['wall_seconds']:.1f}", style="bold")
    return table
