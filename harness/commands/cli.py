"""distlab: run the labs through the real launchers, check the host, grade the results.

This module is the command line's table of contents: every command is a module of this folder with
the same shape (`add_arguments(parser)`, `run(args, lab_args)`, and its DESCRIPTION and EXAMPLES),
and the parser is built from the table below. Only the command being run is imported: `distlab run`
loads no grading or reporting. docs/architecture.md draws the whole path.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from importlib import metadata
from types import ModuleType

from harness.console import console
from harness.run.errors import HarnessError, RunStopped
from harness.usage import Parser, UsageError, split_lab_args

COMMANDS = {  # name: (module, one line for `distlab --help`)
    "run": ("harness.commands.run", "run one lab at one world size through a real launcher"),
    "doctor": ("harness.commands.doctor", "what this host offers and which labs it can run"),
    "data": ("harness.commands.data", "download CIFAR-10 once (needs internet)"),
    "grade": ("harness.commands.grade", "run labs at several world sizes and compare with expected results"),
    "grade-class": ("harness.commands.grade_class",
                    "grade a class of submissions, each in a sandbox, into a gradebook"),
    "calibrate": ("harness.commands.calibrate", "measure this host and write a profile of expected results"),
    "template": ("harness.commands.template", "print a Slurm or Kubernetes job for a lab"),
    "scale": ("harness.commands.scale", "strong or weak scaling: the scaling lab at several world sizes"),
    "plan": ("harness.commands.plan",
             "memory per GPU of DDP, ZeRO, FSDP, tensor and pipeline parallel: which fits"),
    "compare": ("harness.commands.compare",
                "DDP, Horovod, ZeRO, FSDP2 and DeepSpeed on one model: the lecture's table"),
    "predict": ("harness.commands.predict",
                "step time, throughput and efficiency at 1..1024 ranks (alpha-beta model)"),
    "bench": ("harness.commands.bench", "benchmarks that print ratios measured side by side"),
    "acceptance": ("harness.commands.acceptance",
                   "a fresh GPU host, end to end: every lab on NCCL, calibrate, grade"),
    "completion": ("harness.commands.completion", "print a shell completion script (lab names, options)"),
}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every option shows its default; descriptions and examples keep their line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        default = action.default
        if default is None or default is False or default == [] or "default" in (action.help or ""):
            return action.help  # no default to show, or the help already says it in words
        if isinstance(default, (list, tuple, float)):  # as people type it: 1,2,4 and 900, never [1, 2, 4] or 900.0
            shown = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else f"{default:g}"
            return f"{action.help} (default: {shown.replace('%', '%%')})"
        return super()._get_help_string(action)


def version() -> str:
    try:
        return metadata.version("distlab")
    except metadata.PackageNotFoundError:  # a checkout used without installing it
        return "unknown (not installed)"


def command_module(name: str) -> ModuleType:
    return importlib.import_module(COMMANDS[name][0])


def build_parser(only: str | None = None) -> Parser:
    """Every command's parser (`only`: that command's arguments alone, the others by name and help line)."""
    parser = Parser(prog="distlab", description=__doc__.splitlines()[0], formatter_class=HelpFormatter,
                    epilog="distlab COMMAND --help shows each command's options and examples.")
    parser.add_argument("--version", action="version", version=f"distlab {version()}")
    # Not required: `distlab` alone gets the list of commands (main), not argparse's "arguments are required".
    commands = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND", parser_class=Parser)
    for name, (_, line) in COMMANDS.items():
        if only is not None and name != only:
            commands.add_parser(name, help=line)
            continue
        module = command_module(name)
        command = commands.add_parser(name, help=line, formatter_class=HelpFormatter,
                                      description=getattr(module, "DESCRIPTION", None) or line[:1].upper() + line[1:],
                                      epilog=getattr(module, "EXAMPLES", None))
        module.add_arguments(command)
        command.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, lab_args = split_lab_args(argv)
    named = next((word for word in own if not word.startswith("-")), None)
    try:
        parser = build_parser(named if named in COMMANDS else None)
        args = parser.parse_args(own)
        if args.command is None:  # `distlab` alone: what it can do, and exit 2 as for any usage error
            parser.print_help(sys.stderr)
            return 2
        if getattr(args, "json", False):
            console.file = sys.stderr  # stdout carries the JSON summary alone
        return args.run(args, lab_args)
    except UsageError as error:
        print(f"distlab: error: {error}", file=sys.stderr)
        return 2
    except RunStopped as stop:  # Ctrl-C, SIGTERM, SIGHUP during a run (a KeyboardInterrupt too: caught first)
        what = "interrupted" if stop.signum == signal.SIGINT else str(stop)
        print(f"distlab: {what}; finished runs are kept, no process left running", file=sys.stderr)
        return stop.exit_code
    except KeyboardInterrupt:
        print("distlab: interrupted; finished runs are kept, no process left running", file=sys.stderr)
        return 130
    except HarnessError as error:  # the run was stopped and accounted for; the traceback is in its folder
        print(f"distlab: error: {error}", file=sys.stderr)
        return error.exit_code
    except ModuleNotFoundError as error:  # torch, torchvision, mpi4py or Horovod missing from this Python
        print(f"distlab: error: {error.name} is not installed in {sys.executable}; run `make setup` "
              "(or `distlab doctor` to see what this host has)", file=sys.stderr)
        return 2
    finally:
        console.file = None  # type: ignore[assignment]  # rich: None follows sys.stdout, whatever it is then


if __name__ == "__main__":
    sys.exit(main())
