"""Hostile: writes its output below a path longer than PATH_MAX (20 folders of 250 characters), where
a measure of its folder by paths fails quietly and counts nothing, until something stops it."""
import itertools
import os

for level in range(20):
    name = f"{level:02d}" + "d" * 248
    os.makedirs(name, exist_ok=True)  # both ranks walk down the same folders
    os.chdir(name)  # relative steps: no path the system is asked for is longer than one name
chunk = b"\1" * (1 << 20)
for number in itertools.count():
    with open(f"fill.{os.getpid()}.{number}", "wb") as out:
        for _ in range(8):
            out.write(chunk)
