"""A finished run as the grader judges it (a Sample): the harness's account, the record (the
program's claims), and what the harness observed and measured of the run itself.

Everything in a run's folder was written where the program runs. Right after the run, before any
of it is read, the folder is inspected (`inspect_run_dir`): an entry that is not a regular file or
a folder (a link, a FIFO, a device) is noted on the sample by name and never followed; where one
stands among what the grader reads (the record, the observer's files), the observations are not
evaluated at all. The readers themselves take regular files of bounded size only (harness/files.py).
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

from harness import files
from harness.catalog import LABS
from harness.console import printable
from harness.observe import accuracy, data_parallel, observations, timeline
from harness.on_ranks.observer.distlab_observer.fileformat import RANK_WEIGHTS_FILE
from harness.run.accounting import failing_rank_exception, rank_logs_in
from harness.run.request import RunRequest
from harness.run.run_dir import OBSERVE_DIR, RUN_DIR_PLACEHOLDER
from harness.run.state import RunResult
from harness.verdict.expectations import LabExpectation
from harness.verdict.tolerances import accuracy_claim_tolerance, own_model_claims
from harness.verdict.verdicts import Sample

# Of a run's folder, what the grader reads past its own files: the record and the observer's folder.
READ_BY_THE_GRADER = ("record.json", f"{OBSERVE_DIR}/")
INSPECT_ENTRIES = 100_000  # the sandbox stops a program at far fewer (classgrade/sandbox/limits.Limits.files)


def inspect_run_dir(run_dir: Path) -> list[str]:
    """Every entry of the run's folder that is not a regular file or a folder, as "PATH is KIND", and
    why the folder could not be inspected whole, if it could not."""
    usage = files.tree_usage(run_dir, max_entries=INSPECT_ENTRIES)
    found = [f"{printable(name)} is {kind}" for name, kind in sorted(usage.special)]
    if usage.error:
        found.append(f"the run folder could not be inspected whole: {printable(usage.error)}")
    return found


def tampers_with_the_grader(untrusted: list[str]) -> list[str]:
    """The entries of `inspect_run_dir` that stand where the grader reads (or its walk's error)."""
    def read_by_the_grader(entry: str) -> bool:
        name = entry.rsplit(" is ", 1)[0]  # "PATH is KIND"; a link in place of observe/ itself counts too
        return name.startswith(READ_BY_THE_GRADER) or name == OBSERVE_DIR

    return [entry for entry in untrusted if read_by_the_grader(entry) or entry.startswith("the run folder")]


# Exceptions the machine can raise in a correct program: a peer or port (Gloo's "Connection closed by peer"
# when another rank died), a timeout, memory, a full disk. A run they end may go well the next time.
MACHINE_MADE = re.compile(r"OSError|Connection\w*Error|BrokenPipeError|TimeoutError|MemoryError|OutOfMemoryError|"
                          r"DistNetworkError|DistStoreError|DistBackendError|connection (closed|reset|refused)|"
                          r"timed? ?out|address already in use|out of memory|no space left", re.IGNORECASE)


def raised_by_the_program(result: RunResult) -> str | None:
    """The exception that ended a failed run, where the program raised it of its own: the rank the
    launcher saw fail exited with a code (no signal, no timeout, no hang, no stop) after a Python
    traceback, and the exception is none the machine makes (MACHINE_MADE). Run again, the program
    ends the same way; None where the failure could be the machine's."""
    if result.ok:
        return None
    failure = result.failure
    if (failure is None or failure.signal or not failure.exit_code or result.timed_out
            or result.hang_suspected or result.interrupted or result.stopped_by):
        return None
    found = failing_rank_exception(rank_logs_in(result.run_dir), failure.rank)
    # Only the failing rank's own: another rank's exception (the failing one printed none) says
    # nothing certain of why this one exited, and then the run is tried again.
    if found is None or (failure.rank is not None and found.rank != failure.rank):
        return None
    return None if MACHINE_MADE.search(found.line) else found.said


def sample_of(result: RunResult) -> Sample:
    sample = Sample(str(result.run_dir), result.status, result.reason, result.wall_seconds, result.record,
                    cpu=result.cpu)
    sample.untrusted = inspect_run_dir(result.run_dir) if result.run_dir.is_dir() else []
    sample.phases = timeline.run_phases(result)  # the harness's stamps only, until observations are read
    return sample


def timed(result: RunResult, metric_name: str, more_dirs: list[Path] | None = None) -> Sample:
    """A run with its training throughput timed by the harness, where its observer saw training
    (img_per_sec of a data-parallel training lab, or of the course lab timing a student's program).
    `more_dirs`: the observe folders of the run's other nodes, whose ranks train in the same run: the
    run's rate is every rank's (timed from node 0's alone, a correct run on two hosts was "claims
    img_per_sec 298, harness timed 157")."""
    sample = sample_of(result)
    observe_dir = result.run_dir / OBSERVE_DIR
    if not observe_dir.is_dir():
        return sample
    for other in more_dirs or []:  # another node's folder was written where the program runs too
        sample.untrusted += inspect_run_dir(other.parent)
    if metric_name == "img_per_sec" and not tampers_with_the_grader(sample.untrusted):
        seen = observations.merge([observe_dir, *more_dirs]) if more_dirs else observations.load(observe_dir)
        sample.phases = timeline.run_phases(result, seen)
        slowed = observations.clock_disagreement(seen)
        sample.measured[metric_name] = rate = None if slowed else observations.throughput(seen)
        sample.start_up = observations.start_up(seen, sample.wall_seconds)
        if slowed:
            sample.measure_errors[metric_name] = f"not timed: {slowed}"
        elif rate is None:
            sample.measure_errors[metric_name] = (
                f"no rank was seen training past its first {observations.WARMUP_STEPS} optimizer steps (the warm-up, "
                "left out)")
    return sample


def observed_sample(result: RunResult, exp: LabExpectation, request: RunRequest,
                    evaluator: accuracy.Evaluator, more_dirs: list[Path] | None = None,
                    roots: list[Path] | None = None) -> Sample:
    """A run as the grader judges it. For a data-parallel training lab, what the harness saw itself:
    the checks computed from every rank's observations, its training throughput, the accuracy of
    rank 0's final weights measured on the test set (and every rank's own where they differ), its
    checkpoints loaded, and every claim of the record that these contradict. `more_dirs`: the observe
    folders of the run's other nodes (a two-host cell, grading/cells.py), judged with its own as one
    run's; `roots`: folders besides the run's own whose saved files may be read (their shared folder)."""
    trains_data_parallel = LABS[exp.catalog_lab].data_parallel
    sample = timed(result, exp.throughput_metric, more_dirs) if trains_data_parallel else sample_of(result)
    observe_dir = result.run_dir / OBSERVE_DIR
    # A run that failed is observed too: its own failed check is a claim, what the harness saw the fact.
    if not trains_data_parallel or not observe_dir.is_dir():
        return sample
    planted = tampers_with_the_grader(sample.untrusted)
    if planted:  # never handed to the evaluator (torch.load) or read as the observer's
        sample.measured[exp.accuracy_metric] = None
        sample.measure_errors[exp.accuracy_metric] = f"not measured: {planted[0]} (never followed)"
        sample.observed = [data_parallel.Check("observer", False, f"the observer's folder was tampered with: "
                                               f"{'; '.join(planted)}").to_dict()]
        return sample
    lab_args = [arg.replace(RUN_DIR_PLACEHOLDER, str(result.run_dir)) for arg in request.lab_args]
    # Measured always, graded where the profile has an accuracy band: a claim is compared either way.
    measurement = evaluator.measure(observe_dir, lab_args, more_dirs, roots) if more_dirs or roots else \
        evaluator.measure(observe_dir, lab_args)
    sample.measured[exp.accuracy_metric] = measurement.get("accuracy")
    if measurement.get("error"):
        sample.measure_errors[exp.accuracy_metric] = measurement["error"]
    seen = observations.merge([observe_dir, *more_dirs]) if more_dirs else observations.load(observe_dir)
    sample.phases = timeline.run_phases(result, seen)
    if measurement.get("error") is None and measurement.get("own_models") is None:
        drop_copies_of_rank0(seen)
    checks = data_parallel.checks(seen, request.backend, request.world_size,
                                  train_set_size=measurement.get("train_size"),
                                  checkpoints=measurement.get("checkpoints"))
    # In the precision the program evaluated in, as observed: its own bf16 autocast too, whatever the flag.
    tolerance = accuracy_claim_tolerance(measurement.get("total"),
                                         observations.evaluated_precision(seen, measurement.get("precision")))
    checks += data_parallel.compare_claims(result.record, checks, measurement.get("accuracy"), tolerance,
                                           measured_img_per_sec=sample.measured.get("img_per_sec"),
                                           own_models=own_model_claims(measurement.get("own_models")))
    sample.observed = [check.to_dict() for check in checks]
    return sample


def reference_sample(result: RunResult, metric_name: str) -> Sample:
    """A reference run (the plain loop, or the course's lab timed beside a program): timed, never
    evaluated, so the final weights its observer left are removed at once. Some 45 MB a rank of
    ResNet-18 each, the course lab's references alone filled a class job's 2 GiB folder (the default
    profile at world size 4, with the speed rule's extra pairs), and the program was blamed for it."""
    sample = timed(result, metric_name)
    observe_dir = result.run_dir / OBSERVE_DIR
    if observe_dir.is_dir() and not observe_dir.is_symlink():  # a link in its place: never followed
        for path in observe_dir.glob("final_weights*.pt"):
            with contextlib.suppress(OSError):
                path.unlink()  # never followed: unlink removes a link, not its target
    return sample


def drop_copies_of_rank0(seen: observations.Observations) -> None:
    """The other ranks' final weights, once measured to be rank 0's own state (the evaluator asked for
    none of them: every rank held rank 0's digest), are removed: a copy of final_weights.pt per rank
    is some 45 MB a rank of ResNet-18, and their digests stay in each rank.<r>.json."""
    for rank, observed in seen.ranks.items():
        name = (observed.model or {}).get("weights_file")
        if rank and name and name == RANK_WEIGHTS_FILE.format(rank=rank):
            with contextlib.suppress(OSError):
                (seen.directory / name).unlink()  # never followed: unlink removes a link, not its target
