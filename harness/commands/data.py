"""`distlab data`: CIFAR-10 downloaded once into a folder the labs read (needs internet)."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.console import console

EXAMPLES = "examples:\n  distlab data --data-dir data"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", type=Path, default=Path("data"), help="where to keep it (default ./data)")


def run(args: argparse.Namespace, lab_args: list[str]) -> int:
    from labs.common.data import fetch_cifar10  # torchvision's downloader: the training kit, loaded only here

    path = fetch_cifar10(args.data_dir)
    console.print(f"CIFAR-10 ready in {path}", markup=False)
    return 0
