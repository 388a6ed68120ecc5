"""The published JSON Schemas (harness/schemas/, draft 2020-12), and checking data against them.

record.schema.json describes the result record of the lab contract (labs/README.md, section 4),
profile.schema.json a hardware profile or plan (harness/verdict/profiles.py), observations.schema.json
what the observer saw on one rank (harness/observe/observations.py). They are the contract in a
form other tools can read; the harness checks what it reads against them after its own checks,
so the schemas and the code cannot drift apart unnoticed. A mismatch is reported as the field's
dotted path and what the schema wanted, the way harness/run/record.py and harness/verdict/profiles.py name
a field.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"
RECORD_SCHEMA = "record.schema.json"
PROFILE_SCHEMA = "profile.schema.json"
OBSERVATIONS_SCHEMA = "observations.schema.json"
MAX_MESSAGE = 200  # a schema message quotes the value, which may be a whole table


@functools.cache
def validator(name: str) -> Any:
    """The validator of one schema file, the schema itself checked once."""
    from jsonschema import Draft202012Validator  # ~0.1 s to import: only when something is checked

    schema = json.loads((SCHEMA_DIR / name).read_text())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def problem(data: Any, name: str) -> str | None:
    """The most relevant way `data` breaks schema `name`, as "field 'a.b': what was wanted"; None if it fits."""
    from jsonschema.exceptions import relevance

    # The error nearest the top, as jsonschema's best_match ranks them, without its descent into
    # the alternatives of an anyOf: "needs min or max" says more than the first alternative's miss.
    error = max(validator(name).iter_errors(data), key=relevance, default=None)
    if error is None:
        return None
    path = list(error.absolute_path)
    if error.validator == "anyOf" and all(set(alt) == {"required"} for alt in error.validator_value):
        needs = "; ".join(" and ".join(alt["required"]) for alt in error.validator_value)
        return f"field '{_dotted(path)}' needs one of: {needs}"
    if error.validator == "required":
        path.append(next(key for key in error.validator_value if key not in error.instance))
        return f"missing field '{_dotted(path)}'"
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = error.schema.get("properties", {})
        path.append(next(key for key in error.instance if key not in known))
        return f"field '{_dotted(path)}' is not one the schema knows"
    message = error.message if len(error.message) <= MAX_MESSAGE else f"{error.message[:MAX_MESSAGE]}..."
    return f"field '{_dotted(path)}': {message}" if path else message


def _dotted(path: list[Any]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
