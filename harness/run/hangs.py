"""A failed run's hang, as the backends' own timeouts reported it in the ranks' logs."""

from __future__ import annotations

import re
from pathlib import Path

from harness.run.output import read_end

# A rank stuck outside the collectives (a hang, a skipped all-reduce) leaves its peers waiting in
# one; each backend's own timeout then ends them with one of these, naming no culprit.
BACKEND_TIMEOUT_LINE = re.compile("|".join([
    r"Timed out waiting \d+ms for \w+ operation",  # Gloo, waiting for one send or recv
    r"Application timeout caused pair closure",  # Gloo, the same timeout seen by a connection
    r"Watchdog caught collective operation timeout",  # NCCL
    r"wait timeout after \d+ms",  # TCPStore, waiting for a peer at a barrier
]))


# Horovod's stall inspector instead reports on rank 0, naming the missing ranks. It runs under the
# MPI controller (mpirun); Horovod 0.28.1's Gloo controller (horovodrun --gloo) never fires it, as
# measured here, so there only the watchdog ends a hang.
HOROVOD_STALL = re.compile(r"stalled for longer than \d+ seconds\. Will shutdown")


def hang_reason(rank_logs: dict[int, Path], launcher_output: str) -> str | None:
    """A failed run's hang, as the backends' own timeouts reported it; None if none did."""
    waited = [rank for rank, log in sorted(rank_logs.items()) if BACKEND_TIMEOUT_LINE.search(read_end(log))]
    if waited:
        # The ranks that timed out were waiting for the others. Those that did not were stuck
        # elsewhere: a person should look at them first. When all timed out, each was waiting
        # in a different collective (a rank skipped one). Only this node's ranks are judged.
        stuck = [rank for rank in sorted(rank_logs) if rank not in waited]
        if stuck:
            return (f"hang suspected: a collective timed out on rank {_ranks(waited)}; rank {_ranks(stuck)} never "
                    f"reported it, look there first")
        return "hang suspected: a collective timed out on every rank, each waiting in a different one"
    if HOROVOD_STALL.search(launcher_output):
        return "hang suspected: Horovod's stall inspector shut the job down; rank 0's log names the missing ranks"
    return None


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))
