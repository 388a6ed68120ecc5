"""The lab contract: argv in, one JSON result record out (see labs/README.md).

A lab is launched with argv only: every lab accepts the flags of add_contract_args. Rank 0 writes
one JSON result record to the path given by --record, whatever happens (lab_run). The harness reads
that record and nothing else of a lab. Who a process is comes from labs/common/topology.py, what a
number depends on from labs/common/provenance.py.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import sys
import tempfile
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labs.common.provenance import provenance
from labs.common.topology import Topology, say

SCHEMA = "distlab-record"
SCHEMA_VERSION = 1


def add_contract_args(parser: argparse.ArgumentParser, backends: list[str], default_backend: str) -> None:
    """The flags every lab accepts, so the harness can drive any lab the same way."""
    group = parser.add_argument_group("lab contract")
    group.add_argument("--backend", choices=backends, default=default_backend, help="communication backend")
    group.add_argument("--record", type=Path, help="rank 0 writes the JSON result record here")
    group.add_argument("--smoke", action="store_true", help="seconds-long run for tests")
    group.add_argument("--seed", type=int, default=0, help="random seed")
    group.add_argument("--timeout", type=float, default=120.0,
                       help="collective timeout in seconds: a hung peer is reported by the backend")


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def write_json_atomic(path: Path, data: Any) -> None:
    """Write to a temporary file in the same folder, then rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=2, sort_keys=False)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@dataclass
class Record:
    """The one machine-readable result of a lab run. Rank 0 writes it."""

    lab: str
    config: dict[str, Any]
    topology: Topology
    backend: str
    status: str = "ok"
    reason: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)
    ranks: list[dict[str, Any]] = field(default_factory=list)
    start: str = field(default_factory=lambda: dt.datetime.now(dt.timezone.utc).isoformat())

    def check(self, name: str, passed: bool, **detail: Any) -> bool:
        """A correctness check; any failed check fails the run."""
        self.checks[name] = {"passed": bool(passed), **detail}
        if not passed and self.status == "ok":
            self.status, self.reason = "failed", f"check {name} failed: {detail}"
        return bool(passed)

    def to_dict(self) -> dict[str, Any]:
        return _jsonable({
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "lab": self.lab,
            "status": self.status,
            "reason": self.reason,
            "metrics": self.metrics,
            "checks": self.checks,
            "config": self.config,
            "ranks": self.ranks,
            "provenance": {**provenance(self.topology, self.backend), "start": self.start,
                           "end": dt.datetime.now(dt.timezone.utc).isoformat(),
                           "argv": sys.argv},
        })


@contextlib.contextmanager
def lab_run(lab: str, args: argparse.Namespace, topology: Topology) -> Iterator[Record]:
    """Run a lab's body; rank 0 writes the record whatever happens, then the exit code says it.

    Exit codes: 0 ok, 1 a correctness check failed, 2 bad input (SystemExit), else the error.
    """
    record = Record(lab=lab, config=vars(args).copy(), topology=topology, backend=args.backend)
    exit_code = 0
    try:
        yield record
    except SystemExit as stop:
        if stop.code not in (0, None):
            record.status, record.reason = "failed", str(stop.code)
            exit_code = stop.code if isinstance(stop.code, int) else 2
            if not isinstance(stop.code, int):
                print(stop.code, file=sys.stderr, flush=True)
    except BaseException as error:  # the record must say why, then the error propagates
        record.status, record.reason = "failed", f"{type(error).__name__}: {error}"
        if topology.is_rank0 and args.record:
            write_json_atomic(args.record, record.to_dict())
        traceback.print_exc()
        raise
    if record.status != "ok" and exit_code == 0:
        exit_code = 1
    if topology.is_rank0 and args.record:
        write_json_atomic(args.record, record.to_dict())
    if exit_code:
        say(topology, f"{lab}: FAILED: {record.reason}")
        sys.exit(exit_code)
