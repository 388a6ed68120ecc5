"""Reading result records: the one thing the harness takes from a lab (labs/README.md).

A record that is not valid JSON, or lacks a field of the contract, is refused with a
message that names the field, so the author of a program graded with --program knows
what to add. Nothing is half-read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from labs.common.contract import SCHEMA, SCHEMA_VERSION

STATUSES = ("ok", "failed")

# The contract's fields: dotted path -> accepted types (None allowed where listed).
REQUIRED: dict[str, tuple[type, ...]] = {
    "schema": (str,),
    "schema_version": (int,),
    "lab": (str,),
    "status": (str,),
    "reason": (str, type(None)),
    "metrics": (dict,),
    "checks": (dict,),
    "config": (dict,),
    "provenance": (dict,),
    "provenance.versions": (dict,),
    "provenance.versions.python": (str,),
    "provenance.versions.torch": (str, type(None)),
    "provenance.hardware": (dict,),
    "provenance.hardware.cpu_model": (str,),
    "provenance.hardware.cores": (int,),
    "provenance.hardware.gpus": (dict,),
    "provenance.world_size": (int,),
    "provenance.threads_per_rank": (int, type(None)),
    "provenance.backend": (str,),
    "provenance.launcher": (str,),
    "provenance.git_commit": (str, type(None)),
    "provenance.start": (str,),
    "provenance.end": (str,),
}


class RecordError(ValueError):
    """A record that breaks the contract; the message names the file and the field."""


def _lookup(data: dict[str, Any], dotted: str) -> tuple[bool, Any]:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def validate(data: Any, source: str = "record") -> dict[str, Any]:
    if not isinstance(data, dict):
        raise RecordError(f"{source}: not a JSON object")
    for dotted, types in REQUIRED.items():
        present, value = _lookup(data, dotted)
        if not present:
            raise RecordError(f"{source}: missing field '{dotted}' (see the lab contract in labs/README.md)")
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise RecordError(f"{source}: field '{dotted}' is {type(value).__name__}, expected {names}")
    if data["schema"] != SCHEMA:
        raise RecordError(f"{source}: field 'schema' is {data['schema']!r}, expected {SCHEMA!r}")
    if data["schema_version"] != SCHEMA_VERSION:
        raise RecordError(f"{source}: schema_version {data['schema_version']} is not {SCHEMA_VERSION}; "
                          "rerun the lab with this version of distlab")
    if data["status"] not in STATUSES:
        raise RecordError(f"{source}: field 'status' is {data['status']!r}, expected one of {STATUSES}")
    for name, check in data["checks"].items():
        if not isinstance(check, dict) or not isinstance(check.get("passed"), bool):
            raise RecordError(f"{source}: check '{name}' needs a boolean field 'passed'")
    return data


def load(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise RecordError(f"{path}: no record was written (the lab must write one to --record)") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise RecordError(f"{path}: not valid JSON ({error.msg} at line {error.lineno}); "
                          "the record is corrupt") from None
    return validate(data, str(path))
