"""How a run ended, accounted for once: the rank logs gathered, the failing rank named, the reason
decided (a full disk first, the launcher's account before the lab's, a backend's collective timeout
read as a hang), the record kept, amended or written by the harness, then epochs.csv and run.json."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

from harness.console import printable
from harness.files import set_aside, write_bytes, write_json
from harness.run import record as records
from harness.run.epochs import write_epochs_csv
from harness.run.errors import HarnessError
from harness.run.hangs import hang_reason
from harness.run.launchers import LAUNCHERS, Failure, signal_name
from harness.run.output import gather_rank_logs, read_end
from harness.run.request import RunRequest
from harness.run.run_dir import OBSERVE_DIR
from harness.run.state import Outcome, PreparedRun, RunResult
from labs.common.contract import Record
from labs.common.host import usable_cores
from labs.common.topology import Topology


def ended_because(request: RunRequest, outcome: Outcome, failure: Failure | None,
                  rank_logs: dict[int, Path]) -> str | None:
    """The launcher's side of why a run ended early: its timeout, a signal that stopped it, or the
    rank that failed (and its last exception); None where it ended well by the launcher's account."""
    if outcome.timed_out:
        # Still running at the limit says nothing of why: a hang, or more work than the limit allows
        # (a --timeout set too short was once reported as a hang). Evidence of a hang (a collective's
        # own timeout, hangs.py) names one; each rank's stack at the limit is in stacks.txt.
        return (f"timed out after {request.timeout_s:g} s, still running: a hang, or more work than the time limit "
                "allows (--timeout); each rank's last lines are in its log")
    if outcome.stopped_by == signal.SIGINT:
        return "interrupted (Ctrl-C)"
    if outcome.stopped_by is not None:
        return f"stopped by {signal_name(outcome.stopped_by)}"
    if failure:
        return f"{failure.describe()} (launcher exit code {outcome.returncode})" + exception_said(request, failure,
                                                                                                 rank_logs)
    return None


def account(run: PreparedRun, outcome: Outcome) -> RunResult:
    """Rank logs, the failing rank, the record (the lab's, amended, or the harness's) and the reason;
    record.json and run.json written once each."""
    request, run_dir, record_path = run.request, run.run_dir, run.record_path
    rank_logs: dict[int, Path] = {}
    try:
        rank_logs = gather_rank_logs(request, run_dir)
    except OSError as error:
        outcome.errors.append(f"rank logs: {error.strerror or error}")
    launcher_output = read_end(run_dir / "launcher.log")
    returncode = outcome.returncode
    failure = None
    if returncode not in (0, None) and not (outcome.timed_out or outcome.stopped_by):
        failure = LAUNCHERS[request.launcher].failure(launcher_output) or Failure(
            0 if request.world_size == 1 else None, returncode, None)

    reason = ended_because(request, outcome, failure, rank_logs)
    lost = [error for error in outcome.errors if "output lost" in error or error.startswith("rank logs")]
    if lost:  # a full disk comes first: what failed after it (a rank writing its record) follows from it
        reason = f"the results folder could not keep the run's output: {lost[0]}" + (f"; {reason}" if reason else "")

    record, record_error = None, None
    try:
        record = records.check_record(records.load(record_path), str(record_path))
    except records.RecordError as error:
        record_error = str(error)
        if os.path.lexists(record_path):  # keep the unreadable file for inspection, never half-read it
            set_aside(record_path)
    rank0_elsewhere = (record is None and not reason and returncode == 0
                       and request.placement.get("nnodes", 1) > 1 and not os.path.lexists(record_path))
    rewrite = False
    if rank0_elsewhere:
        # Rank 0 ran on another node and wrote the record there; this node's part went well.
        record_error = None
    elif record is None:
        record, rewrite = harness_record(request, reason or record_error or "no record"), True
    elif reason and not (record["status"] == "failed" and failure and failure.exit_code in (1, 2)):
        # The launcher's account comes first: when rank 1 dies, rank 0 typically fails too
        # ("connection reset", "Horovod has been shut down"), and that is a consequence.
        # Unless the ranks ended with the contract's own codes (1: a check failed, 2: bad input):
        # then the lab's reason is the cause, and the launcher only reports it.
        record.update(status="failed", reason=reason, lab_status=record["status"], lab_reason=record["reason"])
        rewrite = True
    elif reason:
        reason = f"{record['reason']} ({reason})"

    lab_ok = record is None or record["status"] == "ok"
    status = "ok" if returncode == 0 and lab_ok and not record_error and not lost else "failed"
    final_reason = reason or (record or {}).get("reason") or record_error
    hang = None if outcome.timed_out or status == "ok" else hang_reason(rank_logs, launcher_output)
    if hang:
        final_reason = f"{hang} ({final_reason})"
        if record is not None:
            record["reason"] = final_reason
            rewrite = True
    result = RunResult(run_dir, returncode if returncode is not None else -9, status,
                       None if status == "ok" else printable(str(final_reason)), record, failure, outcome.wall,
                       outcome.timed_out, outcome.stopped_by is not None,
                       hang_suspected=outcome.timed_out or bool(hang),
                       stopped_by=signal_name(outcome.stopped_by) if outcome.stopped_by is not None else None,
                       cpu=cpu_account(request, outcome))
    release_reserve(run)
    if rewrite and record is not None:  # rewrite: a record amended or written by the harness
        write_record(run, outcome, record)
    if record is not None:
        try:
            write_epochs_csv(run.run_dir / "epochs.csv", record)
        except OSError as error:
            outcome.errors.append(f"epochs.csv: {error.strerror or error}")
    write_run_json(run, outcome, result, rank_logs, record_error)
    return result


# Python's last line of a traceback: the exception's type (dotted or not) and its message.
EXCEPTION_LINE = re.compile(r"([A-Za-z_][\w.]*(?::.*)?)$")
# A traceback's frame: where in which file (torch prefixes each line of a rank's output with "[rank1]:").
FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (.+)$')
RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s?")
SAID_CHARS = 300  # of a rank's last exception, as a run's reason and a class's feedback keep it
# What a program started without a launcher misses: the variables torchrun sets (a torchrun-only program).
LAUNCHER_VARIABLES = re.compile(r"environment variable (RANK|WORLD_SIZE|LOCAL_RANK|MASTER_ADDR|MASTER_PORT) expected|"
                                r"KeyError: '(RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|MASTER_ADDR|MASTER_PORT)'")


class Frame(NamedTuple):
    """A traceback's frame: where in which file the program was (classgrade/outcome names the student's own)."""

    file: str
    line: int
    function: str


@dataclass(frozen=True)
class RankException:
    """A rank's last exception, as the last Python traceback in its log says it."""

    rank: int
    line: str  # the traceback's last line, whole: the exception's type and message, the program's words
    frames: tuple[Frame, ...]  # that traceback's frames, the innermost last

    @property
    def said(self) -> str:
        """The exception line as a reason or a feedback shows it: escape sequences shown, bounded."""
        return printable(self.line)[:SAID_CHARS]


def last_traceback(text: str) -> tuple[str, tuple[Frame, ...]] | None:
    """The last Python traceback in this output: its exception line and its frames."""
    lines = [RANK_PREFIX.sub("", line) for line in text.splitlines()]
    start = max((i for i, line in enumerate(lines) if "Traceback (most recent call last):" in line), default=None)
    if start is None:
        return None
    frames: list[Frame] = []
    for line in lines[start + 1:]:
        if line and not line[0].isspace():
            found = EXCEPTION_LINE.match(line.strip())
            return (found.group(1), tuple(frames)) if found else None
        if frame := FRAME.match(line):
            frames.append(Frame(frame.group(1), int(frame.group(2)), frame.group(3)))
    return None


def rank_logs_in(run_dir: Path) -> dict[int, Path]:
    """The rank.<r>.log files a finished run's folder holds, by rank (as gather_rank_logs wrote them)."""
    return {int(path.name.split(".")[1]): path for path in run_dir.glob("rank.*.log")
            if path.name.split(".")[1].isdigit()}


def failing_rank_exception(rank_logs: dict[int, Path], failing_rank: int | None) -> RankException | None:
    """The one reading of what a crashed run raised: the last exception in the log of the rank the
    launcher saw fail, or where that log shows none (or no rank was named), the lowest other rank's
    that shows one. The reason (exception_said), a class's ending (classgrade/outcome.ending_of) and
    whether the program raised it of its own (grading/samples.raised_by_the_program) all read it here."""
    ranks = ([failing_rank] if failing_rank in rank_logs else []) + sorted(r for r in rank_logs if r != failing_rank)
    for rank in ranks:
        found = last_traceback(read_end(rank_logs[rank]))
        if found:
            return RankException(rank, *found)
    return None


def exception_said(request: RunRequest, failure: Failure, rank_logs: dict[int, Path]) -> str:
    """The failing rank's last exception line (or the first rank's that has one), for the reason; and,
    for a program started by plain python that wanted torchrun's variables, why and what to do."""
    found = failing_rank_exception(rank_logs, failure.rank)
    if found is None:
        return ""
    said = f"; rank {found.rank}'s last exception: {found.said}"
    if request.launcher == "python" and LAUNCHER_VARIABLES.search(found.line):
        said += ("; at world size 1 the program was started with plain python, which sets none of "
                 "torchrun's RANK, LOCAL_RANK, WORLD_SIZE: start it with --launcher torchrun, or let it "
                 "default to rank 0 of 1 where they are unset")
    return said


def write_record(run: PreparedRun, outcome: Outcome, record: dict[str, Any]) -> None:
    """The one place record.json is written by the harness (by rename: whatever the program left there
    is replaced or set aside, never written through)."""
    try:
        write_json(run.record_path, record)
    except OSError as error:
        outcome.errors.append(f"record.json: {error.strerror or error}")


def release_reserve(run: PreparedRun) -> None:
    """Give back the space kept at the start: record.json and run.json fit even on a full disk."""
    with contextlib.suppress(OSError):
        run.reserve.unlink()


def cpu_account(request: RunRequest, outcome: Outcome) -> dict[str, Any]:
    """The CPUs of the run as the harness saw them: its ranks on this machine (None where mpirun or
    horovodrun place them on other hosts), threads per rank, the cores that were ours (usable_cores:
    affinity, cgroup quota, host) and the interference measured meanwhile: the cores other processes kept
    busy, the cores a hypervisor stole, the host's run queue. The verdicts decide from it whether a
    speed can be judged (verdict/speed.py, speed_not_judged)."""
    placement = request.placement
    if placement.get("hosts") or placement.get("hostfile"):
        ranks_here = None
    else:
        ranks_here = request.world_size // max(1, placement.get("nnodes", 1))
    cores = usable_cores()
    return {"ranks_here": ranks_here, "threads_per_rank": request.threads, "cores": cores.count,
            "cores_limited_by": cores.limited_by, "host_cores": cores.host, "cpus": cores.affinity,
            "cgroup_quota": cores.quota,
            "others_cores": None if outcome.others_cores is None else round(outcome.others_cores, 3),
            "steal_cores": None if outcome.steal_cores is None else round(outcome.steal_cores, 3),
            "run_queue": None if outcome.run_queue is None else round(outcome.run_queue, 2)}


def write_run_json(run: PreparedRun, outcome: Outcome, result: RunResult, rank_logs: dict[int, Path],
                    record_error: str | None) -> None:
    request = run.request
    data = {
        "lab": request.lab, "program": str(request.program), "world_size": request.world_size,
        "launcher": request.launcher, "backend": request.backend, "backend_reason": request.backend_reason,
        "threads_per_rank": request.threads,
        "observe_dir": OBSERVE_DIR if request.observe else None,
        "oversubscribed": bool(result.cpu and result.cpu["ranks_here"]
                               and result.cpu["ranks_here"] * request.threads > result.cpu["cores"]),
        "cpu": result.cpu,
        "command": run.command, "returncode": result.returncode, "status": result.status, "reason": result.reason,
        "failure": asdict(result.failure) if result.failure else None, "timed_out": outcome.timed_out,
        "interrupted": result.interrupted, "stopped_by": result.stopped_by,
        "hang_suspected": result.hang_suspected,
        "wall_seconds": outcome.wall, "record_error": record_error, "run_id": run.run_id,
        "launcher_pid": outcome.launcher_pid, "harness_errors": outcome.errors,
        "rank_logs": {rank: str(path.name) for rank, path in rank_logs.items()},
        "placement": {k: str(v) if isinstance(v, Path) else v for k, v in request.placement.items()},
        "max_restarts": request.max_restarts,
        # torchrun keeps one log folder per attempt: attempts after the first are restarts.
        "restarts": max(0, len(list((run.run_dir / "logs").glob("*/attempt_*"))) - 1),
    }
    try:
        write_json(run.run_dir / "run.json", data)
    except OSError as error:
        raise HarnessError(f"run {run.run_dir} ended ({result.reason or result.status}) but run.json could not be "
                           f"written: {error.strerror or error}") from None


def account_harness_error(run: PreparedRun, outcome: Outcome, error: Exception) -> RunResult:
    """The harness failed around the run: every process is already stopped (see launch_and_wait);
    keep the traceback, say so in run.json, and raise one line."""
    details = run.run_dir / "harness-error.txt"
    reason = f"harness error: {type(error).__name__}: {error} (details in {details.name})"
    outcome.errors.append(reason)
    release_reserve(run)
    with contextlib.suppress(OSError):
        write_bytes(details, "".join(traceback.format_exception(error)).encode(errors="replace"))
    result = RunResult(run.run_dir, outcome.returncode if outcome.returncode is not None else -9, "failed",
                       printable(reason), None, None, outcome.wall, outcome.timed_out,
                       outcome.stopped_by is not None,
                       stopped_by=signal_name(outcome.stopped_by) if outcome.stopped_by is not None else None)
    if not os.path.lexists(run.record_path):
        write_record(run, outcome, harness_record(run.request, reason))
    with contextlib.suppress(HarnessError):
        write_run_json(run, outcome, result, {}, None)
    raise HarnessError(f"{printable(str(error))} ({type(error).__name__}); the run is stopped, details in "
                       f"{details}") from error


def harness_record(request: RunRequest, reason: str) -> dict[str, Any]:
    """The record of a run whose lab wrote none (a crash, a kill, a hang)."""
    topology = Topology(world_size=request.world_size, launcher=request.launcher)
    rec = Record(lab=request.lab, config={"lab_args": request.lab_args}, topology=topology,
                 backend=request.backend, status="failed", reason=reason)
    data = rec.to_dict()
    data["provenance"]["threads_per_rank"] = request.threads
    data["provenance"]["written_by"] = "harness"
    return data
