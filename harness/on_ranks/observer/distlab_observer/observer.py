"""What the harness sees of one rank, from torch's own entry points, without the program's help.

`install(directory)` (called by sitecustomize.py when DISTLAB_OBSERVE_DIR is set) arms hooks that
wait for the program to import torch (and horovod.torch); nothing is imported before it does. Then:

- the process group: torch.distributed.init_process_group and Horovod's hvd.init(), as torch and
  Horovod report them afterwards (backend, world size, rank), not as the program asked;
- the data: every sample index each DataLoader handed out, one list per pass over the loader (an
  epoch), with the dataset's length and the optimizer steps taken during that pass: passes with
  steps are training, passes without are evaluation;
- the optimizer steps (torch's global step hooks, so Horovod's DistributedOptimizer too), each with
  the time it ended and the images its pass had handed out by then: the harness times training
  itself, rather than reading the program's img_per_sec;
- every torch.save, by resolved path, followed through a rename (checkpoints are written to a
  temporary file and renamed into place), with the optimizer steps taken before it: the harness
  loads the last one into the model itself (harness/observe/checkpoint_loads.py); and every torch.load of a
  file (the first LOADS_KEPT), so a resumed run shows which checkpoint it read;
- at exit: the model the optimizers trained (found from their parameters), its state's digests and
  the state itself (final_weights.pt on rank 0, final_weights.<r>.pt on the others), so the harness
  can evaluate each rank's own model where the replicas differ.

- training evidence (issue 44): the digest of the parameters the optimizers update before the first
  step and at exit (a program that trained nothing ends as it began), after sampled steps (1, 2, 4,
  ...: compared across ranks, the replicas must be equal during training, not only at the end), and
  the process's age on the observer's clock beside the kernel's account of it (/proc);
- at exit, whether each of its hooks is still its own: one a program replaced is an error of the
  observer's (the checks then say so), never a silent gap;
- as each loader pass ends (its iterator's StopIteration, its next pass, or the iterator dropped; a
  pass still open, at exit), one line with the pass's digest (fileformat.PASS_LINE: the indices kept
  and the steps, digests.pass_digest) on this process's stderr, through a descriptor taken when this
  module loads (originals.py): the harness keeps the lines as the launcher passes them on and holds each recorded
  pass against its line, so a record rewritten before exit shows (issue 44, "rewrites the observer").

The observer's clock (time.perf_counter) and the os functions it reads /proc with are taken when
this module loads (originals.py, which it imports), before the program's first line: a program that
slows time.perf_counter slows its own timing, not the harness's.

Where the time goes (issue 51): the process's timeline, when it reached each of fileformat.TIMELINE's
milestones (observer loaded, torch imported, init_process_group called and returned, first batch, last
step, exit), on the host's CLOCK_MONOTONIC (originals._stamp), which the harness compares with its own
stamps around the launch (harness/observe/timeline.py); for the user's information, never for a verdict.

A resume cell asks the first attempt to stop (fileformat.STOP_AFTER_EPOCHS): once that many
training epochs are done, at the first optimizer step of the next, the observer writes this
attempt's observations to <directory>/stopped/ and ends the rank (fileformat.STOP_EXIT_CODE), as a
failure would; torchrun then starts every rank again, and the program resumes from its checkpoint.

Everything goes to <directory>/rank.<r>.json at exit, written atomically; nothing is written per step
(a line per loader pass on stderr, above).
The hooks cost a list append per batch, two clock reads and two array appends per step (the second
read: the timeline's last step, below). Any failure of
the observer is caught and written to <directory>/observer-errors.<pid>.txt: the program runs as it
would without it.
The file names and the schema's name are fileformat.py's; the digests (digests.py) are shared with
harness/observe/accuracy.py.

This module arms the observer (install) and holds its post-import watcher; the rest is beside it, by
concern: Observer's state and error reporting (observed.py), its hooks on torch (hooks.py), the pass
lines and the files it writes (output.py), one loader pass's record (passes.py), the trained model
(model.py), what it takes before the program runs (originals.py), the libraries' hooks (libraries.py).
"""

from __future__ import annotations

import atexit
import importlib.abc
import sys
from collections.abc import Callable
from typing import Any

from .hooks import Hooks

_observer: Observer | None = None


def install(directory: str) -> None:
    """Arm the hooks in this process (once); they take effect when torch and horovod.torch load."""
    global _observer
    if _observer is not None:
        return
    _observer = Observer(directory)
    watcher = _PostImportWatcher({"torch": _observer.on_torch, "horovod.torch": _observer.on_horovod_torch,
                                  **_observer.libraries.watched()})
    sys.meta_path.insert(0, watcher)
    # Registered before the program's own handlers (and torch's), so it runs after all of them.
    atexit.register(_observer.finish)
    for name in list(watcher.callbacks):  # already imported (an embedding interpreter): hook now
        if name in sys.modules:
            watcher.fire(name, sys.modules[name])


class _PostImportWatcher(importlib.abc.MetaPathFinder):
    """Calls back once a watched module has been executed, before its importer gets it.

    It finds the module with the finders after it and wraps only the loader's exec_module; once
    the module has run, its __loader__ and __spec__.loader are the real loader again. A callback
    fires once, at the module's execution: a mere importlib.util.find_spec (a library asking
    whether torch is installed) does not use it up.
    """

    def __init__(self, callbacks: dict[str, Callable[[Any], None]]) -> None:
        self.callbacks = callbacks
        self._searching: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.callbacks or fullname in self._searching:
            return None
        self._searching.add(fullname)
        try:
            spec = None
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._searching.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _CallbackLoader(spec.loader, self, fullname)
        return spec

    def fire(self, name: str, module: Any) -> None:
        callback = self.callbacks.pop(name, None)
        if callback is not None:
            callback(module)  # each callback catches its own errors


class _CallbackLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, watcher: _PostImportWatcher, name: str) -> None:
        self._loader, self._watcher, self._name = loader, watcher, name

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        self._watcher.fire(self._name, module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class Observer(Hooks):
    """Everything one process observed; written once, at exit."""
