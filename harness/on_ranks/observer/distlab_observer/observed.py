"""What one process observed, as the hooks (hooks.py) record it and the observer writes it at exit
(output.py), and how the observer reports its own failures (Observed.guard, Observed.error)."""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from typing import Any

from . import originals
from .fileformat import ERRORS_FILE, STOP_AFTER_EPOCHS
from .libraries import Libraries
from .passes import PassRecorder

# Where a rank's number is before any process group exists, launcher by launcher (labs/README.md).
RANK_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "HOROVOD_RANK", "PMI_RANK", "SLURM_PROCID")


class Observed:
    """The observer's state: everything one process observed; Observer (observer.py) is the whole."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.process_groups: list[dict[str, Any]] = []
        self.passes: list[PassRecorder] = []
        self.loaders: dict[int, tuple[int, Any]] = {}  # id(index sampler) -> (number, the sampler, kept alive)
        self.datasets: dict[int, tuple[int, Any]] = {}
        self.steps = 0
        self.step_depth = 0
        self.last_batch_from: PassRecorder | None = None  # the pass whose batch the loop received last
        self.optimizers: list[Any] = []  # kept alive: the program's may be gone by exit
        self.model: Any = None
        self.saves: list[dict[str, Any]] = []
        self.loads: list[dict[str, Any]] = []
        self.saved_paths: dict[str, dict[str, Any]] = {}
        self.errors: list[str] = []
        self.torch: Any = None
        self._original_save: Any = None
        self.stop_after = _stop_after()  # training epochs before a resume cell's stop; None: never
        self.stopped: dict[str, Any] | None = None
        self.libraries = Libraries(self)  # beyond torch's entry points: libraries.py
        # This process's age on the observer's clock, compared at exit with the kernel's.
        self.born = originals._clock()
        self.params_at_start: str | None = None  # the optimizers' parameters before their first step
        self.params_at_steps: dict[str, str] = {}  # step (SAMPLED_STEPS) -> their digest after it
        # Each hook as installed: what it is, how to find what stands there now, and ours. At exit a hook
        # that is no longer ours is an error of the observer's (its evidence stopped there), never a pass.
        self.hooks: list[tuple[str, Callable[[], Any], Any]] = []
        self.paused = 0.0  # seconds the observer spent digesting parameters between steps
        # When this process reached each milestone of fileformat.TIMELINE (originals._stamp): where its time went.
        self.timeline: dict[str, float] = {}
        self.reached("observer_loaded")

    # ------------------------------------------------------------------------------------- errors

    def guard(self, what: str, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except Exception as error:  # noqa: BLE001 - never the program's problem
            self.error(what, error)
            return None

    def error(self, what: str, error: BaseException) -> None:
        line = f"{what}: {type(error).__name__}: {error}"
        if len(self.errors) < 20:  # a hook failing at every batch must not fill the memory
            self.errors.append(line)
        try:
            os.makedirs(self.directory, exist_ok=True)
            with open(os.path.join(self.directory, ERRORS_FILE.format(pid=os.getpid())), "a") as out:
                out.write(line + "\n" + "".join(traceback.format_exception(error)) + "\n")
        except OSError:
            pass

    def training_clock(self) -> float:
        """The observer's clock less the time it spent on its own digests: the harness times the
        program's training, not the observer (a ResNet-18's digest is some 0.1 s on a CPU)."""
        return originals._clock() - self.paused

    def reached(self, milestone: str, again: bool = False) -> None:
        """Stamp a milestone of fileformat.TIMELINE the first time (every time with `again`: the last counts)."""
        if again or milestone not in self.timeline:
            self.timeline[milestone] = originals._stamp()

    # ----------------------------------------------------------------------------------- at exit

    def rank(self) -> int:
        if self.process_groups:
            return int(self.process_groups[-1]["rank"])
        for name in RANK_VARIABLES:
            value = os.environ.get(name, "")
            if value.isdigit():
                return int(value)
        return 0

    def rank_source(self) -> str:
        if self.process_groups:
            return self.process_groups[-1]["api"]
        return next((f"env {name}" for name in RANK_VARIABLES if os.environ.get(name, "").isdigit()), "default 0")


def _stop_after() -> int | None:
    """The training epochs a resume cell lets the first attempt run (None: no stop, or a restart)."""
    value = os.environ.get(STOP_AFTER_EPOCHS, "")
    if not value.isdigit() or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return None
    return int(value)
