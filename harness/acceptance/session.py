"""One acceptance past its preflight: its results folder and outbox made, its steps planned, then
each step in order under the deadline, a step that fails recorded and the next one started, the
summary (acceptance.json) and the archive written after every step."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.acceptance import deadline
from harness.acceptance.estimate import estimate
from harness.acceptance.outbox import Outbox
from harness.acceptance.plan import plan_toml, planned_rows
from harness.acceptance.preflight import launcher_env, torchrun_for_rows
from harness.acceptance.steps import OBSERVED_DDP, Step, observed_ddp, one_gpu_steps, steps
from harness.console import console


@dataclass
class Acceptance:
    """An acceptance begun: its profile's name, results folder, clock, the steps' environment, its
    outbox, its steps in order, and its summary (acceptance.json), added to as the steps run."""

    name: str
    folder: Path
    clock: deadline.Clock
    env: dict[str, str]
    outbox: Outbox
    planned: list[Step]
    summary: dict[str, Any]


def begin(name: str, folder: Path, out: Path, clock: deadline.Clock, facts: dict[str, Any],
          horovod: tuple[bool, str], *, gpus: int, cpu_proxy: bool, only: list[str], before: float,
          preflight_s: float) -> Acceptance:
    """The results folder and the outbox made, the steps planned (one GPU: plan.toml written), the
    summary begun. before: the seconds gone before this process (the install); preflight_s: its own."""
    several = gpus > 1 and not cpu_proxy
    folder.mkdir(parents=True)
    env = launcher_env(folder)
    facts["torchrun"], facts["torchrun_is_this_pythons"] = torchrun_for_rows(env)
    out.mkdir(parents=True, exist_ok=True)
    outbox = Outbox(out, folder)
    rows = [] if several else planned_rows(horovod[0], only)
    if several:
        planned = [Step(step_name, argv, 1.0) for step_name, argv in steps(gpus, name, folder)]
    else:
        (folder / "plan.toml").write_text(plan_toml(horovod[0], cpu_proxy, only))
        planned = one_gpu_steps(name, folder, horovod, cpu_proxy, only)
    summary: dict[str, Any] = {
        "plan": "cpu-proxy" if cpu_proxy else f"{gpus} GPU(s)", "profile": name, "deadline_s": clock.deadline_s,
        "started": dt.datetime.now().isoformat(timespec="seconds"), "before_this_process_s": round(before, 1),
        "preflight": facts, "preflight_s": round(preflight_s, 1), "horovod": horovod[1],
        "rows": [row.name for row in rows], "estimate": dict(estimate(rows)) if rows else None, "results": str(folder),
        "steps": []}
    return Acceptance(name, folder, clock, env, outbox, planned, summary)


def run_steps(acceptance: Acceptance) -> bool:
    """Every step in order, each under its share of the deadline, written as it goes; True when
    Ctrl-C stopped one (no step after it starts)."""
    name, folder, clock, planned, summary = (acceptance.name, acceptance.folder, acceptance.clock,
                                             acceptance.planned, acceptance.summary)
    interrupted = False
    with (acceptance.outbox.out / "acceptance.log").open("a") as log:
        for index, step in enumerate(planned):
            record: dict[str, Any] = {"step": step.name, "argv": step.argv, "at_s": round(clock.elapsed(), 1),
                                      "estimate_s": round(step.estimate_s, 1)}
            limit = clock.limit(step, planned[index + 1:])
            profile_arg = step.argv[step.argv.index("--profile") + 1] if step.argv and step.argv[0] == "grade" else ""
            if step.argv is None:
                record.update(status="skipped", note=step.note)
            elif interrupted:
                record.update(status="not started", note="the acceptance was interrupted")
            elif limit < deadline.MIN_STEP_S:
                record.update(status="not started", note=f"{max(0.0, clock.left()):.0f} s left of the deadline")
            elif profile_arg and not Path(profile_arg).is_file():
                record.update(status="not started", note="calibrate wrote no profile (no row passed)")
            elif step.script and not step.script.is_file():
                record.update(status="skipped", note=f"no {step.script} (run from a checkout)")
            elif OBSERVED_DDP in step.argv and not observed_ddp(folder):
                record.update(status="not started", note="no ddp run at world size 1 was observed")
            else:
                console.print(f"== {step.name}" + (f" (at most {limit:.0f} s)" if limit < float("inf") else ""),
                              markup=False)
                if OBSERVED_DDP in step.argv:
                    step.argv = [str(observed_ddp(folder)) if arg == OBSERVED_DDP else arg  # found above
                                 for arg in step.argv]
                    record["argv"] = step.argv
                record.update(deadline.run_step(step, limit, acceptance.env, log, folder))
                interrupted = record.pop("interrupted", False)
            took = f" in {record['seconds']} s" if "seconds" in record else ""
            console.print(f"   {record['status']}{': ' + record['note'] if record.get('note') else ''}{took}",
                          markup=False)
            summary["steps"].append(record)
            acceptance.outbox.collect(name, summary)
    summary["failed"] = [s["step"] for s in summary["steps"] if s["status"] in ("failed", "stopped", "not started")]
    summary["total_s"] = round(clock.elapsed(), 1)
    acceptance.outbox.collect(name, summary)
    return interrupted
