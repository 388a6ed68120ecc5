"""Reading result records: the one thing the harness takes from a lab (labs/README.md).

A record that is not valid JSON, or lacks a field of the contract, is refused with a
message that names the field, so the author of a program graded with --program knows
what to add. Nothing is half-read, and nothing in a record can stall or crash the harness:
it is read only if it is a regular file (not a FIFO, a device, a directory or a link) of at
most MAX_RECORD_BYTES, parsed with its nesting bounded, and every number in it must be
finite and within MAX_NUMBER.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from harness import schema_check
from harness.files import JSON_NUMBER, UntrustedJSON, parse_json, read_regular_file
from harness.schema_check import RECORD_SCHEMA
from labs.common.contract import SCHEMA, SCHEMA_VERSION

MAX_RECORD_BYTES = 8 << 20  # the largest record a lab writes is a few hundred KiB
MAX_DEPTH = 64  # nesting of objects and arrays; the contract's deepest is 4
MAX_NUMBER = JSON_NUMBER  # any metric beyond a 64-bit integer's range is a mistake, not a measurement

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
    _check_values(data, source)
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
    """The record at `path`, validated; RecordError names the file and what is wrong."""
    try:
        raw = read_regular_file(path, MAX_RECORD_BYTES)
    except FileNotFoundError:
        raise RecordError(f"{path}: no record was written (the lab must write one to --record)") from None
    except (OSError, ValueError) as error:
        raise RecordError(f"{path}: {getattr(error, 'strerror', None) or error}; the record is refused") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RecordError(f"{path}: not UTF-8 text (byte {error.start}); the record is corrupt") from None
    return validate(parse(text, str(path)), str(path))


def parse(text: str, source: str = "record") -> Any:
    """JSON with limits (files.parse_json, the one parser of what a program wrote): nesting at most
    MAX_DEPTH, no NaN or Infinity, numbers within MAX_NUMBER, no key twice."""
    try:
        return parse_json(text, MAX_DEPTH)
    except UntrustedJSON as error:
        how = "is corrupt" if str(error).startswith("not valid JSON") else "is refused"
        raise RecordError(f"{source}: {error}; the record {how}") from None


def _check_values(node: Any, source: str, where: str = "", depth: int = 0) -> None:
    """Numbers finite and in range, strings real Unicode, nesting bounded: also for records
    validated straight from Python objects."""
    if depth > MAX_DEPTH:
        raise RecordError(f"{source}: nested more than {MAX_DEPTH} levels deep at '{where}'")
    if isinstance(node, bool) or node is None:
        return
    if isinstance(node, (int, float)):
        if not math.isfinite(node) or abs(node) > MAX_NUMBER:
            shown = f"{node:.3g}" if isinstance(node, float) else f"{str(node)[:24]}..."
            raise RecordError(f"{source}: field '{where}' is {shown}, not a finite number within {MAX_NUMBER:.3g}")
    elif isinstance(node, str):
        try:
            node.encode("utf-8")
        except UnicodeEncodeError:
            raise RecordError(f"{source}: field '{where}' holds text that is not valid Unicode") from None
    elif isinstance(node, dict):
        for key, value in node.items():
            _check_values(key, source, where, depth + 1)
            _check_values(value, source, f"{where}.{key}" if where else str(key), depth + 1)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            _check_values(value, source, f"{where}[{index}]", depth + 1)


def check_record(data: dict[str, Any], source: str) -> dict[str, Any]:
    """`data` if it fits record.schema.json, else RecordError naming the field."""
    found = schema_check.problem(data, RECORD_SCHEMA)
    if found:
        raise RecordError(f"{source}: {found} (see harness/schemas/{RECORD_SCHEMA} and the lab contract "
                          "in labs/README.md)")
    return data
