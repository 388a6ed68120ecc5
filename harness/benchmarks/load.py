"""A busy machine made on purpose, for the benchmarks that show a verdict holds under load."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import subprocess
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def busy_processes(count: int) -> Iterator[None]:
    """`count` CPU-bound processes for the duration, a busy machine made on purpose. They end with the
    block, with this process if it is killed (PR_SET_PDEATHSIG), and SIGTERM ends the block like Ctrl-C."""
    libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None

    def die_with_parent() -> None:
        if libc is not None:
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    load = [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=die_with_parent)
            for _ in range(count)]
    try:
        yield
    finally:
        for process in load:
            process.kill()
            process.wait()
        signal.signal(signal.SIGTERM, previous)
