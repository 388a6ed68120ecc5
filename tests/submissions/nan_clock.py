"""Hostile: sets the clock the observer times each step by to NaN, then trains as a correct program does.

Before #44 its observations said "step_times": [NaN, ...], which a reader taking any JSON turns into a
NaN rate, and statistics over the repeats raised in the grader's own process (the whole class stopped).
The observer now keeps its own clock, taken before the program's first line, so the NaN never reaches it.

Alone, this file only sets the clock. The class test appends the correct program
(tests/programs/ddp_program.py) below it, since a sandboxed submission reads no file but its own; the
course's lab would not do: its ResNet-18 checkpoint is larger than the test's 64 MiB output limit.
"""
import math
import types

import distlab_observer.originals as observer  # the observer's clock's module: on every rank's path, first

observer.time = types.SimpleNamespace(**{**vars(observer.time), "perf_counter": lambda: math.nan})
