"""Expected results, one TOML file per hardware profile (harness/profiles/*.toml).

A profile says, for each lab and world size, what a correct and healthy run looks like on
that hardware, and where those numbers were measured. It is checked on load: a mistake
names the file, the key and what was expected. Nothing in a profile can stall or crash the
harness, or send a file elsewhere: it is read only if it is a regular UTF-8 file of at most
MAX_PROFILE_BYTES, every number must be finite, world sizes are listed once, the name (used in
report paths) is one plain word, and the lab arguments never set what the harness sets itself.

    name, description, provisional, auto_select, threads_per_rank, speed_budget_s
    [measured]  where, how, date, repeats, versions        (provenance of the numbers)
    [match]     gpus, gpu_model, min_cores                 (which hosts it fits)
    [labs.NAME] world_sizes, args, world_size_args, backend, launcher, time_budget_s, required_checks,
                accuracy_delta, efficiency_min, throughput_metric, accuracy_metric, cell, stop_after_epochs
    [labs.NAME.metrics.METRIC]  min/max | value+tolerance | expected{ws}+at_least_fraction
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from pathlib import Path
from typing import Any

from harness import schema_check
from harness.run.launchers import refused_lab_arg
from harness.schema_check import PROFILE_SCHEMA
from harness.usage import did_you_mean
from harness.verdict.expectations import Band, LabExpectation, Profile
from harness.verdict.references import PROGRAM_RATIO_FLOOR, REFERENCES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PROFILE_DIR = Path(__file__).resolve().parents[1] / "profiles"
MAX_PROFILE_BYTES = 1 << 20
MAX_WORLD_SIZE = 1 << 20
# A profile that states no speed_budget_s: a few more pairs of a smoke-sized cell (one pair of cpu-smoke's
# ddp at world size 2 took about 40 s here, on 2 busy cores).
DEFAULT_SPEED_BUDGET_S = 240.0
PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # a report folder is named after it
WHOLE_NUMBER = re.compile(r"[0-9]{1,7}")


class ProfileError(ValueError):
    """An invalid profile: the message names the file, the key and what was expected."""


class _Reader:
    """Typed access to one TOML table that reports the full key on any mistake."""

    def __init__(self, path: Path, table: dict[str, Any], prefix: str = ""):
        self.path, self.table, self.prefix = path, table, prefix

    def fail(self, key: str, expected: str, got: Any = None) -> ProfileError:
        shown = "" if got is None else f", got {got!r}"
        return ProfileError(f"profile {self.path}: key '{self.prefix}{key}': expected {expected}{shown}")

    def get(self, key: str, kind: type | tuple[type, ...], expected: str, default: Any = ...) -> Any:
        if key not in self.table:
            if default is ...:
                raise self.fail(key, expected + " (missing)")
            return default
        value = self.table[key]
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise self.fail(key, expected, value)
        if not isinstance(value, kind):
            raise self.fail(key, expected, value)
        return value

    def number(self, key: str, default: Any = ..., low: float | None = None, high: float | None = None) -> Any:
        value = self.get(key, (int, float), "a number", default)
        if value is None or value is default:
            return value
        if not _finite(value):
            raise self.fail(key, "a finite number", _shown(value))
        if (low is not None and value < low) or (high is not None and value > high):
            raise self.fail(key, f"a number in [{low}, {high}]", value)
        return float(value)

    def per_world_size(self, key: str, low: float = 0.0, high: float | None = None) -> dict[int, float]:
        table = self.get(key, dict, 'a table of world size = number, like { "2" = 0.8 }', {})
        out = {}
        for size, value in table.items():
            if not _world_size_key(size):
                raise self.fail(f"{key}.{size}", "a world size (a whole number >= 1) as the key")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value) or value < low or (
                    high is not None and value > high):
                raise self.fail(f"{key}.{size}", f"a finite number >= {low}" + (f" and <= {high}" if high else ""),
                                _shown(value))
            out[int(size)] = float(value)
        return out

    def sub(self, key: str) -> _Reader:
        return _Reader(self.path, self.get(key, dict, "a table"), f"{self.prefix}{key}.")

    def unknown(self, allowed: set[str]) -> None:
        for key in self.table:
            if key not in allowed:
                raise self.fail(key, f"one of {', '.join(sorted(allowed))} (unknown key)")


def _finite(value: Any) -> bool:
    """A number a comparison can use: not nan or inf, and an int within float's range."""
    try:
        return math.isfinite(value) and abs(value) <= 1e300
    except OverflowError:
        return False


def _shown(value: Any) -> Any:
    text = repr(value)
    return value if len(text) <= 40 else f"{text[:24]}...({len(text)} characters)"


def _world_size_key(size: Any) -> bool:
    return isinstance(size, str) and bool(WHOLE_NUMBER.fullmatch(size)) and 1 <= int(size) <= MAX_WORLD_SIZE


LAB_KEYS = {"world_sizes", "args", "world_size_args", "backend", "launcher", "time_budget_s", "required_checks",
            "accuracy_delta", "accuracy_metric", "efficiency_min", "throughput_metric", "metrics", "reference",
            "lab", "single_device", "lesson", "cell", "stop_after_epochs"}
CELLS = ("one-host", "two-hosts", "resume")


def _listed_sizes(table: Any) -> list[Any]:
    """A lab row's world_sizes as written, before the row is read ([] when there is no such list)."""
    sizes = table.get("world_sizes") if isinstance(table, dict) else None
    return sizes if isinstance(sizes, list) else []


def _band(reader: _Reader, metric: str) -> Band:
    reader.unknown({"min", "max", "value", "tolerance", "expected", "at_least_fraction", "at_least_ratio"})
    if "at_least_ratio" in reader.table:
        return Band(metric, at_least_ratio=reader.per_world_size("at_least_ratio", low=0.0, high=10.0))
    if "expected" in reader.table:
        expected = reader.per_world_size("expected", low=0.0)
        fraction = reader.number("at_least_fraction", low=0.0, high=1.0)
        return Band(metric, expected=expected, at_least_fraction=fraction)
    if "value" in reader.table:
        return Band(metric, value=reader.number("value"), tolerance=reader.number("tolerance", low=0.0))
    if "min" not in reader.table and "max" not in reader.table:
        raise reader.fail("min", "min and/or max, value and tolerance, at_least_ratio, or expected and "
                                 "at_least_fraction")
    return Band(metric, min=reader.number("min", None), max=reader.number("max", None))


def _lab_args(reader: _Reader, key: str, args: list[Any]) -> list[str]:
    """Arguments for the lab: strings a command line can carry, none of them the harness's own flags."""
    if not all(isinstance(a, str) for a in args):
        raise reader.fail(key, "a list of strings", _shown(args))
    refused = refused_lab_arg(args)
    if refused and refused[1] is None:
        raise reader.fail(key, "arguments without NUL bytes", refused[0])
    if refused:
        raise reader.fail(key, f"the lab's own arguments; {refused[1]} is set by the harness for every run", refused[0])
    return args


def _lab(reader: _Reader, name: str) -> LabExpectation:
    reader.unknown(LAB_KEYS)
    sizes = reader.get("world_sizes", list, "a list of world sizes like [1, 2, 4]")
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= MAX_WORLD_SIZE for s in sizes):
        raise reader.fail("world_sizes", "a non-empty list of whole numbers >= 1", _shown(sizes))
    repeated = sorted({s for s in sizes if sizes.count(s) > 1})
    if repeated:
        raise reader.fail("world_sizes", f"each world size once (a repeat would run twice); {repeated[0]} is listed "
                          f"{sizes.count(repeated[0])} times", sizes)
    args = _lab_args(reader, "args", reader.get("args", list, "a list of strings", []))
    extra = {}
    for size, more in reader.get("world_size_args", dict, 'a table like { "2" = ["--batch-size", "16"] }',
                                 {}).items():
        if not _world_size_key(size) or not isinstance(more, list):
            raise reader.fail(f"world_size_args.{size}", "a world size as the key and a list of strings")
        extra[int(size)] = tuple(_lab_args(reader, f"world_size_args.{size}", more))
    required = reader.get("required_checks", list, "a list of check names", [])
    bands = tuple(_band(reader.sub("metrics").sub(metric), metric)
                  for metric in reader.get("metrics", dict, "a table of metric bands", {}))
    return LabExpectation(
        lab=name, world_sizes=tuple(sizes), args=tuple(args), world_size_args=extra,
        backend=reader.get("backend", str, "a backend name", None),
        launcher=reader.get("launcher", str, "a launcher name", None),
        time_budget_s=reader.number("time_budget_s", 600.0, low=1.0),
        required_checks=tuple(required),
        accuracy_delta=reader.number("accuracy_delta", None, low=0.0, high=1.0),
        accuracy_metric=reader.get("accuracy_metric", str, "a metric name", "final_accuracy"),
        efficiency_min=reader.per_world_size("efficiency_min", low=0.0, high=1.5),
        throughput_metric=reader.get("throughput_metric", str, "a metric name", "img_per_sec"),
        bands=bands,
        reference=_reference(reader, bands),
        program_lab=reader.get("lab", str, "a lab name (the catalog's) that this row runs", ""),
        single_device=reader.get("single_device", str, "a lab row of this profile graded at world size 1", None),
        lesson=reader.get("lesson", str, "the effect this row shows, in a sentence", ""),
        cell=_cell(reader, sizes),
        stop_after_epochs=int(reader.number("stop_after_epochs", 1, low=1, high=1000)),
    )


def _cell(reader: _Reader, sizes: list[int]) -> str:
    cell = reader.get("cell", str, f"one of {', '.join(CELLS)}", "one-host")
    if cell not in CELLS:
        raise reader.fail("cell", f"one of {', '.join(CELLS)}", cell)
    if cell != "one-host" and sizes != [2]:
        raise reader.fail("world_sizes", f"[2] for a {cell} cell (one rank per host, or two ranks to stop and "
                                         "restart)", sizes)
    return cell


def _reference(reader: _Reader, bands: tuple[Band, ...]) -> str | None:
    reference = reader.get("reference", str, f"a reference loop ({', '.join(REFERENCES)})", None)
    if reference is not None and reference not in REFERENCES:
        raise reader.fail("reference", f"one of {', '.join(REFERENCES)}", reference)
    if reference is None and any(band.at_least_ratio for band in bands):
        raise reader.fail("reference", f"a reference loop ({', '.join(REFERENCES)}) for the at_least_ratio band")
    return reference


def _read(path: Path) -> dict[str, Any]:
    """The TOML of a profile file, read safely: a FIFO, a directory, a huge or non-UTF-8 file is refused."""
    from harness.files import NotARegularFile, read_regular_file

    try:
        raw = read_regular_file(path, MAX_PROFILE_BYTES, follow=True)
    except FileNotFoundError:
        raise ProfileError(f"profile {path} does not exist") from None
    except NotARegularFile as error:
        raise ProfileError(f"profile {error}; give a .toml file") from None
    except OSError as error:
        raise ProfileError(f"profile {path}: {error.strerror or error}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ProfileError(f"profile {path}: not UTF-8 text (byte {error.start}); save it as UTF-8") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ProfileError(f"profile {path}: not valid TOML ({error})") from None
    except RecursionError:
        raise ProfileError(f"profile {path}: nested too deeply to be a profile") from None
    except ValueError as error:  # an integer with thousands of digits
        raise ProfileError(f"profile {path}: not a usable TOML file ({str(error)[:80]})") from None


def load_profile(path: Path) -> Profile:
    data = _read(path)
    top = _Reader(path, data)
    top.unknown({"name", "description", "provisional", "auto_select", "threads_per_rank", "speed_budget_s",
                 "measured", "match", "labs"})
    name = top.get("name", str, "the profile's name")
    if not PROFILE_NAME.fullmatch(name):
        raise top.fail("name", "one plain name of letters, digits, '.', '_' and '-' (it names report folders)",
                       _shown(name))
    measured = top.sub("measured")
    for key in ("where", "how", "date"):
        measured.get(key, str, "a string saying where/how/when the numbers were measured")
    match = top.sub("match")
    match.unknown({"gpus", "gpu_model", "min_cores"})
    match.get("gpus", int, "a GPU count")
    labs = top.get("labs", dict, "a table of labs")
    from harness.catalog import LABS

    for lab, table in labs.items():
        runs = table.get("lab", lab) if isinstance(table, dict) else lab
        if runs not in LABS:
            raise top.fail(f"labs.{lab}", f"a lab name ({', '.join(LABS)}), or a row with lab = one of them")
        other = table.get("single_device") if isinstance(table, dict) else None
        if other is not None and 1 not in _listed_sizes(labs.get(other) if isinstance(other, str) else None):
            raise top.fail(f"labs.{lab}.single_device", "a lab row of this profile graded at world size 1", other)
        if other is not None and 1 in _listed_sizes(table):
            raise top.fail(f"labs.{lab}.world_sizes", f"no world size 1 (row {other}'s stands for it: single_device)",
                           table["world_sizes"])
    profile = Profile(
        name=name, path=path, description=top.get("description", str, "a description", ""),
        provisional=top.get("provisional", bool, "true or false", False),
        auto_select=top.get("auto_select", bool, "true or false", True),
        threads_per_rank=_threads(top),
        speed_budget_s=top.number("speed_budget_s", DEFAULT_SPEED_BUDGET_S, low=0.0),
        measured=dict(measured.table), match=dict(match.table),
        labs={lab: _lab(top.sub("labs").sub(lab), lab) for lab in labs},
    )
    check_profile(data, path)  # after the checks above: theirs are the more precise messages
    return profile


def _threads(top: _Reader) -> int | None:
    threads = top.get("threads_per_rank", int, "a whole number of threads, at least 1", None)
    if threads is not None and not 1 <= threads <= 1024:
        raise top.fail("threads_per_rank", "a whole number of threads from 1 to 1024", threads)
    return threads


def available(profile_dir: Path = PROFILE_DIR) -> list[Path]:
    return sorted(profile_dir.glob("*.toml"))


def is_profile_path(name_or_path: str) -> bool:
    """A --profile value that names a file (a folder in it, or .toml at its end), not a shipped profile."""
    return "/" in name_or_path or name_or_path.endswith(".toml")


def resolve(name_or_path: str | None, host: dict[str, Any], profile_dir: Path = PROFILE_DIR) -> Profile:
    """An explicit name or path, else the one auto-selectable profile that fits this host."""
    names = ", ".join(p.stem for p in available(profile_dir)) or "none"
    if name_or_path and is_profile_path(name_or_path):
        if not Path(name_or_path).exists():
            raise ProfileError(f"no profile file {name_or_path} (it does not exist); give the path of a .toml "
                               f"file, or a profile name: {names}")
        return load_profile(Path(name_or_path))
    if name_or_path:
        path = profile_dir / f"{name_or_path}.toml"
        if not path.exists():
            close = did_you_mean(name_or_path, [p.stem for p in available(profile_dir)])
            raise ProfileError(f"no profile {name_or_path!r}{close}; profiles: {names}; "
                               f"make one with `distlab calibrate --profile NAME`")
        return load_profile(path)
    fitting = [p for p in map(load_profile, available(profile_dir)) if p.auto_select and p.fits(host)]
    if not fitting:
        raise ProfileError(f"no profile fits this host ({host['gpus']} GPUs, {host['cores']} cores); profiles: "
                           f"{names}; pass --profile NAME, or measure this host with "
                           "`distlab calibrate --profile NAME`")
    # The most specific fit wins: a GPU model named beats a bare GPU count.
    return sorted(fitting, key=lambda p: (bool(p.match.get("gpu_model")), p.match.get("gpus", 0)))[-1]


def check_profile(data: dict[str, Any], path: Path) -> None:
    """ProfileError naming the key if the profile's TOML does not fit profile.schema.json."""
    found = schema_check.problem(data, PROFILE_SCHEMA)
    if found:
        raise ProfileError(f"profile {path}: {found.replace('field', 'key', 1)} "
                           f"(see harness/schemas/{PROFILE_SCHEMA})")


def against_course_lab(exp: LabExpectation) -> LabExpectation:
    """A row graded with a student's program: each throughput ratio band asks PROGRAM_RATIO_FLOOR of
    the course lab's rate, at the world sizes the profile grades. (Its efficiency is then taken over
    the course lab's own, so the profile's floor for it, set for the lab over the plain loop, is lax:
    the ratio at each world size is what bites.)"""
    bands = tuple(dataclasses.replace(band, at_least_ratio={ws: PROGRAM_RATIO_FLOOR for ws in band.at_least_ratio})
                  if band.at_least_ratio else band for band in exp.bands)
    return dataclasses.replace(exp, bands=bands, reference_alike=True)
