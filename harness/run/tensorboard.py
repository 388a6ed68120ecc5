"""TensorBoard event files of a run's per-epoch metrics, with the optional extra distlab[tensorboard].

The runner calls write_epochs where it writes epochs.csv (harness/run/runner.py), with the same rows:
one scalar per metric per epoch, the epoch as the step, in <run dir>/tensorboard/. Then
`tensorboard --logdir results/` shows every run's curves side by side. Without the tensorboard
package nothing is written and nothing fails. The files are written by the harness, from the
record, after the run: a lab needs nothing for it, and a program graded with --program gets the
same curves.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def available() -> bool:
    """Whether the extra is installed (asked without importing torch, which takes seconds)."""
    return importlib.util.find_spec("tensorboard") is not None


def write_epochs(log_dir: Path, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> Path | None:
    """Each row is [epoch, value per column]; a value that is not a finite number is left out.

    The event files are written into a new folder beside log_dir, then renamed into place, so a
    reader never sees half of them and whatever the program left at log_dir (a link, a file) is set
    aside, never written through. Returns log_dir, or None without the extra. Raises OSError only.
    """
    if not available():
        return None
    try:
        # TensorBoard's own event-file writer, the one torch.utils.tensorboard wraps: going through
        # torch's SummaryWriter imported torch into the harness after every run, 1.4 s of CPU.
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except Exception as error:  # a broken install must not cost the run its account
        raise OSError(f"tensorboard: cannot be loaded ({type(error).__name__}: {error})") from None
    from harness import files

    staged = Path(tempfile.mkdtemp(dir=log_dir.parent, prefix=f".{log_dir.name}.", suffix=".tmp"))
    try:
        writer = EventFileWriter(str(staged))
        try:
            for epoch, *values in rows:
                for name, value in zip(columns, values, strict=True):
                    if _finite_number(value):
                        scalar = Summary(value=[Summary.Value(tag=name, simple_value=float(value))])
                        writer.add_event(Event(wall_time=time.time(), step=int(epoch), summary=scalar))
        finally:
            writer.close()
        files.replace(staged, log_dir)
    except BaseException as error:
        with contextlib.suppress(OSError):
            shutil.rmtree(staged)
        if isinstance(error, Exception) and not isinstance(error, OSError):
            raise OSError(f"tensorboard: {type(error).__name__}: {error}") from None
        raise
    return log_dir


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
