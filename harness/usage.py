"""Bad input: the one error type every command raises for it, and the argument types that check it.

A UsageError is one line naming the fix; the CLI prints it and exits 2 before anything starts.
"""

from __future__ import annotations

import argparse
import difflib
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn


class UsageError(Exception):
    """Bad input: one line naming the fix, exit code 2, nothing started."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """' (did you mean 'ddp'?)' for the choices closest to a misspelt word, '' when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=3)
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line instead of argparse's usage block
        raise UsageError(f"{message} (see `{self.prog} --help`)")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        """argparse's check of a value against its choices, naming the closest choice of a misspelt one."""
        choices = action.choices
        if choices is not None and value not in choices and isinstance(value, str):
            raise argparse.ArgumentError(action, f"invalid choice: {value!r}{did_you_mean(value, map(str, choices))} "
                                                 f"(choose from {', '.join(map(repr, choices))})")
        super()._check_value(action, value)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is less than 1")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is less than 0")
    return value


def positive_float(text: str) -> float:
    """A finite number above 0: `nan` or `inf` as a timeout would switch the watchdog off."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number; give seconds, like 600")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value:g} is not positive")
    return value


def absolute_path(text: str) -> Path:
    """A folder given on the command line, made absolute where it is read: the harness hands it on to
    processes that start elsewhere (the accuracy evaluator runs in the repository), and a path
    relative to where `distlab` was started would name another folder there."""
    return Path(text).absolute()


def world_size_list(text: str) -> list[int]:
    """"1,2,4": increasing, no repeats, each at least 1."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers") from None
    if not sizes:
        raise argparse.ArgumentTypeError("the list of world sizes is empty")
    if any(size < 1 for size in sizes):
        raise argparse.ArgumentTypeError(f"world sizes must be at least 1 (got {text})")
    if sizes != sorted(set(sizes)):
        raise argparse.ArgumentTypeError(f"world sizes must be increasing without repeats, like 1,2,4 (got {text})")
    return sizes


def split_lab_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """Everything after the first `--` belongs to the lab, untouched."""
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1:]
    return argv, []
