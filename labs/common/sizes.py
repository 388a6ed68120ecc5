"""Message sizes as people and nccl-tests write them: one grammar for every flag that takes bytes."""

from __future__ import annotations

import argparse
import re

# Binary multiples, as nccl-tests reads -b/-e: 1K is 1024 bytes, whether written K, KB or KiB.
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """8, 1K, 8M, 1G (also 8KB, 8MiB, lower case): bytes. An argparse type: bad text is a usage error."""
    match = re.fullmatch(r"(\d+)\s*([KMG]?)(I?B)?", text.strip().upper())
    if not match:
        raise argparse.ArgumentTypeError(f"size {text!r} is not a number of bytes like 8, 1K, 8M or 1G")
    return int(match[1]) * UNITS[match[2]]

