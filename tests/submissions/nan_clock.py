"""Hostile: sets the clock the observer times each step by to NaN, then trains as the course's lab does:
its observations say "step_times": [NaN, ...], which a reader taking any JSON turns into a NaN rate,
and statistics over the repeats raise in the grader's own process (the whole class stopped)."""
import math
import os
import runpy
import sys
import types

import distlab_observer.observer as observer  # the observer's module: on every rank's path, first

observer.time = types.SimpleNamespace(**{**vars(observer.time), "perf_counter": lambda: math.nan})
lab = next(os.path.join(p, "labs/ddp/train.py") for p in os.environ["PYTHONPATH"].split(os.pathsep)
           if os.path.isfile(os.path.join(p, "labs/ddp/train.py")))  # the checkout is on every rank's path
sys.argv[0] = lab
runpy.run_path(sys.argv[0], run_name="__main__")
