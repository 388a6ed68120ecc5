"""Expected results, one TOML file per hardware profile (harness/profiles/*.toml).

A profile says, for each lab and world size, what a correct and healthy run looks like on
that hardware, and where those numbers were measured. It is checked on load: a mistake
names the file, the key and what was expected.

    name, description, provisional, auto_select
    [measured]  where, how, date, repeats, versions        (provenance of the numbers)
    [match]     gpus, gpu_model, min_cores                 (which hosts it fits)
    [labs.NAME] world_sizes, args, world_size_args, backend, launcher, time_budget_s, required_checks,
                accuracy_delta, efficiency_min, throughput_metric, accuracy_metric
    [labs.NAME.metrics.METRIC]  min/max | value+tolerance | expected{ws}+at_least_fraction
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"


class ProfileError(ValueError):
    """An invalid profile: the message names the file, the key and what was expected."""


@dataclass(frozen=True)
class Band:
    metric: str
    min: float | None = None
    max: float | None = None
    value: float | None = None
    tolerance: float | None = None
    expected: dict[int, float] = field(default_factory=dict)  # per world size
    at_least_fraction: float | None = None

    def describe(self, world_size: int) -> str:
        if self.expected:
            if world_size not in self.expected:
                return "n/a"
            return f">= {self.at_least_fraction:g} x {self.expected[world_size]:.4g}"
        if self.value is not None:
            return f"{self.value:.4g} ± {self.tolerance:.4g}"
        low = "-inf" if self.min is None else f"{self.min:.4g}"
        high = "inf" if self.max is None else f"{self.max:.4g}"
        return f"[{low}, {high}]"


@dataclass(frozen=True)
class LabExpectation:
    lab: str
    world_sizes: tuple[int, ...]
    args: tuple[str, ...] = ()
    world_size_args: dict[int, tuple[str, ...]] = field(default_factory=dict)  # added at that world size
    backend: str | None = None
    launcher: str | None = None
    time_budget_s: float = 600.0
    required_checks: tuple[str, ...] = ()
    accuracy_delta: float | None = None
    accuracy_metric: str = "final_accuracy"
    efficiency_min: dict[int, float] = field(default_factory=dict)
    throughput_metric: str = "img_per_sec"
    bands: tuple[Band, ...] = ()

    def args_at(self, world_size: int) -> list[str]:
        return [*self.args, *self.world_size_args.get(world_size, ())]


@dataclass(frozen=True)
class Profile:
    name: str
    path: Path
    description: str
    provisional: bool
    auto_select: bool
    measured: dict[str, Any]
    match: dict[str, Any]
    labs: dict[str, LabExpectation]

    def fits(self, host: dict[str, Any]) -> bool:
        """host: {"gpus": count, "gpu_models": [...], "cores": n} (from distlab doctor's facts)."""
        want = self.match.get("gpus", 0)
        if (want == 0) != (host["gpus"] == 0) or host["gpus"] < want:  # CPU profiles fit CPU hosts only
            return False
        model = self.match.get("gpu_model", "")
        if model and not any(model.lower() in m.lower() for m in host["gpu_models"]):
            return False
        return host["cores"] >= self.match.get("min_cores", 1)


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
        if (low is not None and value < low) or (high is not None and value > high):
            raise self.fail(key, f"a number in [{low}, {high}]", value)
        return float(value)

    def per_world_size(self, key: str, low: float = 0.0, high: float | None = None) -> dict[int, float]:
        table = self.get(key, dict, 'a table of world size = number, like { "2" = 0.8 }', {})
        out = {}
        for size, value in table.items():
            if not str(size).isdigit() or int(size) < 1:
                raise self.fail(f"{key}.{size}", "a world size (a whole number >= 1) as the key")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low or (
                    high is not None and value > high):
                raise self.fail(f"{key}.{size}", f"a number >= {low}" + (f" and <= {high}" if high else ""), value)
            out[int(size)] = float(value)
        return out

    def sub(self, key: str) -> _Reader:
        return _Reader(self.path, self.get(key, dict, "a table"), f"{self.prefix}{key}.")

    def unknown(self, allowed: set[str]) -> None:
        for key in self.table:
            if key not in allowed:
                raise self.fail(key, f"one of {', '.join(sorted(allowed))} (unknown key)")


LAB_KEYS = {"world_sizes", "args", "world_size_args", "backend", "launcher", "time_budget_s", "required_checks",
            "accuracy_delta", "accuracy_metric", "efficiency_min", "throughput_metric", "metrics"}


def _band(reader: _Reader, metric: str) -> Band:
    reader.unknown({"min", "max", "value", "tolerance", "expected", "at_least_fraction"})
    if "expected" in reader.table:
        expected = reader.per_world_size("expected", low=0.0)
        fraction = reader.number("at_least_fraction", low=0.0, high=1.0)
        return Band(metric, expected=expected, at_least_fraction=fraction)
    if "value" in reader.table:
        return Band(metric, value=reader.number("value"), tolerance=reader.number("tolerance", low=0.0))
    if "min" not in reader.table and "max" not in reader.table:
        raise reader.fail("min", "min and/or max, value and tolerance, or expected and at_least_fraction")
    return Band(metric, min=reader.number("min", None), max=reader.number("max", None))


def _lab(reader: _Reader, name: str) -> LabExpectation:
    reader.unknown(LAB_KEYS)
    sizes = reader.get("world_sizes", list, "a list of world sizes like [1, 2, 4]")
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
        raise reader.fail("world_sizes", "a non-empty list of whole numbers >= 1", sizes)
    args = reader.get("args", list, "a list of strings", [])
    if not all(isinstance(a, str) for a in args):
        raise reader.fail("args", "a list of strings", args)
    extra = {}
    for size, more in reader.get("world_size_args", dict, 'a table like { "2" = ["--batch-size", "16"] }',
                                 {}).items():
        if not str(size).isdigit() or not isinstance(more, list) or not all(isinstance(a, str) for a in more):
            raise reader.fail(f"world_size_args.{size}", "a world size as the key and a list of strings")
        extra[int(size)] = tuple(more)
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
    )


def load_profile(path: Path) -> Profile:
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ProfileError(f"profile {path} does not exist") from None
    except tomllib.TOMLDecodeError as error:
        raise ProfileError(f"profile {path}: not valid TOML ({error})") from None
    top = _Reader(path, data)
    top.unknown({"name", "description", "provisional", "auto_select", "measured", "match", "labs"})
    name = top.get("name", str, "the profile's name")
    measured = top.sub("measured")
    for key in ("where", "how", "date"):
        measured.get(key, str, "a string saying where/how/when the numbers were measured")
    match = top.sub("match")
    match.unknown({"gpus", "gpu_model", "min_cores"})
    match.get("gpus", int, "a GPU count")
    labs = top.get("labs", dict, "a table of labs")
    from harness.labs import LABS

    for lab in labs:
        if lab not in LABS:
            raise top.fail(f"labs.{lab}", f"a lab name ({', '.join(LABS)})")
    return Profile(
        name=name, path=path, description=top.get("description", str, "a description", ""),
        provisional=top.get("provisional", bool, "true or false", False),
        auto_select=top.get("auto_select", bool, "true or false", True),
        measured=dict(measured.table), match=dict(match.table),
        labs={lab: _lab(top.sub("labs").sub(lab), lab) for lab in labs},
    )


def available(profile_dir: Path = PROFILE_DIR) -> list[Path]:
    return sorted(profile_dir.glob("*.toml"))


def resolve(name_or_path: str | None, host: dict[str, Any], profile_dir: Path = PROFILE_DIR) -> Profile:
    """An explicit name or path, else the one auto-selectable profile that fits this host."""
    names = ", ".join(p.stem for p in available(profile_dir)) or "none"
    if name_or_path:
        path = Path(name_or_path)
        if not path.suffix:
            path = profile_dir / f"{name_or_path}.toml"
        if not path.exists():
            raise ProfileError(f"no profile {name_or_path!r}; profiles: {names}; "
                               f"make one with `distlab calibrate --profile NAME`")
        return load_profile(path)
    fitting = [p for p in map(load_profile, available(profile_dir)) if p.auto_select and p.fits(host)]
    if not fitting:
        raise ProfileError(f"no profile fits this host ({host['gpus']} GPUs, {host['cores']} cores); profiles: "
                           f"{names}; pass --profile NAME, or measure this host with "
                           "`distlab calibrate --profile NAME`")
    # The most specific fit wins: a GPU model named beats a bare GPU count.
    return sorted(fitting, key=lambda p: (bool(p.match.get("gpu_model")), p.match.get("gpus", 0)))[-1]
