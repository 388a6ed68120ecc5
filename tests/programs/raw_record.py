"""A stand-in lab for runner tests: writes the file given by --raw as its record, byte for byte.

    python raw_record.py --raw record-to-write.json --record RECORD
"""
import os
import sys

argv = sys.argv[1:]
record = argv[argv.index("--record") + 1]
with open(argv[argv.index("--raw") + 1]) as src, open(record + ".tmp", "w") as dst:
    dst.write(src.read())
os.rename(record + ".tmp", record)
