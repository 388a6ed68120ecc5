"""`distlab completion SHELL`: a completion script of every command, lab name and option (shtab)."""

from __future__ import annotations

import argparse
import sys

EXAMPLES = "examples:\n  distlab completion bash > /etc/bash_completion.d/distlab"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shell", choices=["bash", "zsh", "tcsh"])


def run(args: argparse.Namespace, lab_args: list[str]) -> int:
    import shtab

    from harness.commands.cli import build_parser  # every command's arguments: the whole parser

    sys.stdout.write(shtab.complete(build_parser(), shell=args.shell))
    return 0
