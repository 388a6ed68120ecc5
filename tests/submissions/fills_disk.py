"""Hostile: fills its folder with 8 MiB files until something stops it (each file under any file-size limit)."""
import itertools
import os

chunk = b"\1" * (1 << 20)
for number in itertools.count():
    with open(f"fill.{os.getpid()}.{number}", "wb") as out:
        for _ in range(8):
            out.write(chunk)
