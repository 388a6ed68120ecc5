"""Injected faults: the three classic ways a rank fails, on purpose (labs/README.md, fault tolerance).

--fault KIND:rank=R:step=S, S counting optimizer steps from 1 over all epochs. A fault fires once,
and never in a run torchrun has restarted. The training labs mark each call into this module with
FAULT INJECTION, so it reads apart from the training itself.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import TypeVar

T = TypeVar("T")

FAULT_KINDS = {
    "crash": "rank R exits at once (code 3) after step S",
    "hang": "rank R sleeps forever after step S",
    "skip": "rank R leaves step S's gradient all-reduce out; its peers wait in it",
}


def add_fault_arg(group: argparse._ArgumentGroup) -> None:
    kinds = "; ".join(f"{kind}:rank=R:step=S: {what}" for kind, what in FAULT_KINDS.items())
    group.add_argument("--fault", type=parse_fault, help=f"inject a failure (labs/README.md, fault tolerance): {kinds}")


class Fault(str):
    """A --fault spec: one of FAULT_KINDS, on one rank at one global optimizer step.

    A str, so the record's config shows the spec as given; kind, rank and step are its parsed parts.
    """

    kind: str
    rank: int
    step: int
    fired: bool = False


def parse_fault(spec: str) -> Fault:
    """argparse type for --fault: KIND:rank=R:step=S, KIND one of FAULT_KINDS."""
    fault = Fault(spec)
    fault.kind, *fields = spec.split(":")
    try:
        values = dict(field.split("=", 1) for field in fields)
        fault.rank, fault.step = int(values.pop("rank")), int(values.pop("step"))
    except (ValueError, KeyError):
        values, fault.rank, fault.step = {}, -1, 0
    if fault.kind not in FAULT_KINDS or values or fault.rank < 0 or fault.step < 1:
        raise argparse.ArgumentTypeError(f"{spec!r}: expected KIND:rank=R:step=S with KIND one of "
                                         f"{', '.join(FAULT_KINDS)} (R >= 0, S >= 1: the global optimizer step)")
    return fault


def _fires(fault: Fault | None, kinds: tuple[str, ...], rank: int, step: int) -> bool:
    # An injected fault happens once: a rank restarted by torchrun --max-restarts runs clean.
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        return False
    if fault is None or fault.fired or fault.kind not in kinds or rank != fault.rank or step != fault.step:
        return False
    fault.fired = True
    print(f"fault: {fault.kind} on rank {rank} at step {step}", flush=True)
    return True


def fault_point(fault: Fault | None, rank: int, step: int) -> None:
    """Called after every optimizer step: a crash or hang fault fires when its rank reaches its step."""
    if not _fires(fault, ("crash", "hang"), rank, step):
        return
    if fault.kind == "crash":
        os._exit(3)  # no cleanup, no exception handlers: as abrupt as a killed process
    while True:
        time.sleep(3600)


def skips_collective(fault: Fault | None, rank: int, step: int) -> bool:
    """Called before every optimizer step: whether this rank leaves the step's all-reduce out."""
    return _fires(fault, ("skip",), rank, step)


def skip_all_reduce(fault: Fault | None, rank: int, step: int, micro_batches: Iterable[T],
                    no_sync: Callable[[], AbstractContextManager]) -> Iterable[T]:
    """--fault skip for DDP: the step's micro-batches, all run inside no_sync() when the fault fires.

    DDP all-reduces from backward's hooks; inside no_sync() it does not, so this rank's step keeps
    its local gradients and leaves the all-reduce its peers wait in out, as a bug in a rank's
    control flow would. The context is entered before the first micro-batch and left after the
    last one's backward, when the loop asks for the next: before the optimizer step.
    """
    if not skips_collective(fault, rank, step):
        return micro_batches
    return _inside(no_sync, micro_batches)


def _inside(context: Callable[[], AbstractContextManager], items: Iterable[T]) -> Iterator[T]:
    with context():
        yield from items
