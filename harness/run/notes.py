"""What a run's summary says beside "ok" or "FAILED", so that a person does not read more into it than
it holds: a smoke run too small to learn from, and other processes that slowed the run.

A smoke run (`--smoke` among the lab's arguments, which the harness passed itself) trains 256
images for 2 epochs: its loss may rise and its accuracy stay at chance however right the program is
(labs/TRAINING.md, "Smoke runs"). Its wall time is what the cores gave it: the harness's own cpu
account (accounting.cpu_account) says how many of them other processes kept busy meanwhile.
"""

from __future__ import annotations

from typing import Any

from harness.run.cpu_time import contended
from harness.run.state import RunResult

SMOKE = "--smoke"
CHANCE = 0.1  # the training labs' 10 classes: the accuracy of a model that learned nothing
# Below chance plus this, a run learned nothing to speak of: another CPU's rounding moves a model
# that learned nothing a few hundredths off chance, one that learned goes far past it.
LEARNED_MARGIN = 0.1


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def smoke_note(lab: str, lab_args: list[str], record: dict[str, Any] | None) -> str | None:
    """Why a smoke run's loss and accuracy say nothing of the training, where it learned nothing: the
    figures it reported and where a run that learns on a CPU is given. None for a run that is no smoke
    run, that reports no accuracy (the labs that do not train), or whose accuracy went past chance."""
    if SMOKE not in lab_args:
        return None
    metrics = (record or {}).get("metrics")
    metrics = metrics if isinstance(metrics, dict) else {}
    accuracy = _number(metrics.get("final_accuracy"))
    if accuracy is None or accuracy >= CHANCE + LEARNED_MARGIN:
        return None
    losses = [v for v in metrics.get("train_loss") or [] if _number(v) is not None] \
        if isinstance(metrics.get("train_loss"), list) else []
    loss = f"loss {losses[0]:.3g} to {losses[-1]:.3g}, " if len(losses) > 1 else ""
    return (f"a smoke run is too small to learn from ({loss}accuracy {accuracy:.3g}, chance {CHANCE:g}): it shows "
            "that the ranks train together, not that the model learns. For a run that learns on a CPU in about "
            "a minute, see labs/TRAINING.md (Accuracy on CPU); to repeat the grader's checks, "
            f"distlab grade --program {lab}=yours.py")


def crowded_note(cpu: dict[str, Any] | None) -> str | None:
    """That other processes slowed the run, with the cores they kept busy, where they took enough of
    ours for the run to wait (cpu_time.contended); None where they did not, or nothing was measured."""
    if not isinstance(cpu, dict) or not contended(cpu):
        return None
    others, steal, cores = (_number(cpu.get(key)) for key in ("others_cores", "steal_cores", "cores"))
    of = f"the {cores:g}" if cores else "our"
    taken = [f"other processes kept {others:.2f} of {of} core(s) busy"] if others else []
    if steal and round(steal, 2):  # a few thousandths are the hypervisor's own bookkeeping
        taken.append(f"the hypervisor took {steal:.2f} core(s)")
    queue = _number(cpu.get("run_queue"))
    return (f"{' and '.join(taken) or 'others used our cores'} while it ran"
            + (f" (run queue {queue:.1f})" if queue is not None else "")
            + ": it waited for cores, so its time is longer than on free cores")


def run_notes(lab: str, lab_args: list[str], result: RunResult) -> list[str]:
    """Every note of a run's summary, the one about its time first (it qualifies the time printed)."""
    return [note for note in (crowded_note(result.cpu), smoke_note(lab, lab_args, result.record)) if note]
