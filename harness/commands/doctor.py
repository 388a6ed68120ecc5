"""`distlab doctor`: what this host offers, and which labs, launchers and world sizes it can run
(the facts: harness/run/capabilities.py); non-zero when something a lab needs is missing."""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.run.capabilities import facts, problems
from labs.common.host import pip_install, setup_command

EXAMPLES = "examples:\n  distlab doctor\n  distlab doctor --json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the facts as JSON")


def run(args: argparse.Namespace, lab_args: list[str]) -> int:
    return main(as_json=args.json)


def main(as_json: bool = False) -> int:
    try:
        found = facts()
    except ImportError as error:
        print(f"distlab doctor: error: {error}; {setup_command(pip_install('torch torchvision'))} to install torch",
              file=sys.stderr)
        return 1
    missing = problems(found)
    if as_json:
        print(json.dumps({**found, "problems": missing}, indent=2))
        return 1 if missing else 0
    console = Console(highlight=False)
    versions = Table(title="versions", show_header=False)
    for name, value in found["versions"].items():
        versions.add_row(name, escape(value) if value else "[red]missing[/red]")
    versions.add_row("horovod ops", ", ".join(found["horovod_build"].get("tensor operations", [])) or "-")
    versions.add_row("horovod controllers", ", ".join(found["horovod_build"].get("controllers", [])) or "-")
    console.print(versions)
    gpus = found["gpus"]
    cpu = found["cpu"]
    limited = cpu["cores_limited_by"] != "host"
    ours = f" of the host's {cpu['host_cores']} ({cpu['cores_limited_by']})" if limited else ""
    console.print(f"CPU: {cpu['model']}, {cpu['cores']} cores{ours}; GPUs: "
                  + (f"{gpus['count']} x {gpus['models'][0]} (driver {gpus['driver']})" if gpus["count"] else "none"))
    console.print("backends: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in found["backends"].items()))
    labs = Table(title="runnable here")
    for column in ("lab", "backend", "launchers", "world sizes (no oversubscription)"):
        labs.add_column(column)
    for lab, usable in found["labs"].items():
        if not usable:
            labs.add_row(lab, "[red]none[/red]", "", "")
        for entry in usable:
            labs.add_row(lab, entry["backend"], ", ".join(entry["launchers"]),
                         entry["world_sizes_without_oversubscribing"])
    console.print(labs)
    for problem in missing:
        console.print(f"[red]problem:[/red] {escape(problem)}")
    return 1 if missing else 0
