"""What the observer takes before the program's first line (sitecustomize imports this module through
observer.install): its clock, the os functions it reads /proc and writes its files with, and a
descriptor of this process's stderr. Each is read as `originals.name` where it is used: this module is
the one place they are kept.
"""

from __future__ import annotations

import os
import time

_os_replace = os.replace  # the real one: ours is hooked once torch loads
# The clock, taken before the program's first line runs (sitecustomize imports this module): a program
# that slows time.perf_counter slows its own timing, not the harness's (issue 44, "slows its own clock").
_clock = time.perf_counter
# The clock of the run's timeline (fileformat.TIMELINE): CLOCK_MONOTONIC on Linux, one clock for every
# process of the host, so a rank's stamps compare with the harness's own (time.monotonic() around the
# launch, harness/observe/timeline.py) and with the other ranks'. Not _clock: perf_counter is the same
# clock on Linux today, but Python promises that of monotonic only; time.time() would jump with NTP.
_stamp = time.monotonic
_sleep = time.sleep  # the observer's waits, whatever the program does to time.sleep
_os_open, _os_read, _os_close, _os_write, _getpid = os.open, os.read, os.close, os.write, os.getpid


def _own_stderr() -> int | None:
    """A descriptor of this process's stderr, taken before the program's first line: where each pass's
    line goes (fileformat.PASS_LINE), whatever the program does with sys.stderr or descriptor 2 later."""
    try:
        return os.dup(2)  # not inherited across exec (PEP 446): a child's program never holds it
    except OSError:  # no stderr at all
        return None


_stderr = _own_stderr()
