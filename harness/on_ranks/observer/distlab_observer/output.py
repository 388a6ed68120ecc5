"""What the observer writes: each loader pass's line on this process's own stderr as the pass ends
(Output.announce), and at exit its observations, rank.<r>.json, and the final model's weights."""

from __future__ import annotations

import os
import sys
from typing import Any

from . import originals
from .digests import state_digest
from .fileformat import (
    PASS_LINE,
    RANK_FILE,
    RANK_WEIGHTS_FILE,
    SCHEMA,
    SCHEMA_VERSION,
    STOPPED_DIR,
    WEIGHTS_FILE,
)
from .model import _buffer_owners, _params_digest
from .observed import Observed
from .passes import PassRecorder


class Output(Observed):
    """The pass lines and the files of the observer (Observer's: observer.py)."""

    def announce(self, recorder: PassRecorder) -> None:
        """Once a pass is over, its digest on this process's own stderr (fileformat.PASS_LINE), once: the
        harness reads it as the launcher passes it on, before the program can change the record at exit."""
        if recorder.announced:
            return
        recorder.announced = True
        number = next((n for n, p in enumerate(self.passes) if p is recorder), None)
        if originals._stderr is None or number is None:  # no stderr, or a resume cell's stop left the pass out
            return
        line = PASS_LINE.format(rank=self.rank(), pid=originals._getpid(), number=number, digest=recorder.digest())
        # One write, one line: a pipe keeps it whole (PIPE_BUF).
        originals._os_write(originals._stderr, f"{line}\n".encode())

    # ----------------------------------------------------------------------------------- at exit

    def finish(self) -> None:
        """At exit: the final model, then rank.<r>.json. Processes that observed nothing write nothing."""
        self.reached("exit")
        try:
            if not (self.process_groups or self.passes or self.steps or self.saves):
                return  # a launcher, a DataLoader worker, a helper process
            rank = self.rank()
            for recorder in self.passes:  # passes still open at exit (a loader iterator the program kept)
                self.guard("pass line", self.announce, recorder)
            for what, now, ours in self.hooks:
                if now() is not ours:
                    self.error("hooks", RuntimeError(f"{what} was replaced during the run: the observer saw nothing "
                                                     "through it from then on"))
            directory = os.path.join(self.directory, STOPPED_DIR) if self.stopped else self.directory
            os.makedirs(directory, exist_ok=True)
            observed = {
                "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "rank": rank, "rank_source": self.rank_source(),
                "pid": os.getpid(), "argv": sys.argv, "process_groups": self.process_groups,
                "optimizer_steps": self.steps, "loader_passes": [p.to_json() for p in self.passes],
                "saves": self.saves, "loads": self.loads,
                "model": self.guard("final model", self._final_model, rank),
                "errors": self.errors,  # the same list: the final model's errors are in it too
                "stopped": self.stopped,
                "libraries": self.guard("libraries", self.libraries.to_json),
                "training": self.guard("training evidence", self._training_evidence),
                "timeline": self.timeline,
            }
            _write_atomically(os.path.join(directory, RANK_FILE.format(rank=rank)), _json_bytes(observed))
        except Exception as error:  # noqa: BLE001
            self.error("finish", error)

    def _training_evidence(self) -> dict[str, Any]:
        """What the parameters were before the first step and after sampled ones, their digest at exit
        (taken the same way: a program that trained nothing ends as it began), and this process's age
        on the observer's clock beside the kernel's account of it (/proc: no Python call of the program's
        stands between), so that a clock the program slowed shows."""
        return {"params_at_start": self.params_at_start, "params_at_steps": self.params_at_steps,
                "params_at_end": _params_digest(self.torch, self.optimizers[:1]) if self.optimizers else None,
                "clock_age_s": originals._clock() - self.born, "kernel_age_s": _kernel_age()}

    def _final_model(self, rank: int) -> dict[str, Any] | None:
        if self.model is None:
            return None
        torch = self.torch
        with torch.no_grad():
            state = {name: value.detach().cpu().clone() if isinstance(value, torch.Tensor) else value
                     for name, value in self.model.state_dict().items()}
        parameters = {name for name, _ in self.model.named_parameters()}
        found = {
            "class": f"{type(self.model).__module__}.{type(self.model).__qualname__}",
            "tensors": len(state),
            "state_sha256": state_digest(state),
            "params_sha256": state_digest({k: v for k, v in state.items() if k in parameters}),
            "buffers_sha256": state_digest({k: v for k, v in state.items() if k not in parameters}),
            # Each buffer's own digest and the kind of layer that holds it: which differ across ranks
            # is what the harness names (BatchNorm's running statistics, the course's lesson).
            "buffers": {name: {"sha256": state_digest({name: state[name]})[:16], "module": owner}
                        for name, owner in _buffer_owners(self.model).items() if name in state},
            "weights_file": None,
        }
        if self.stopped is None:  # a stopped attempt's model is not the run's: the resumed one's is
            name = WEIGHTS_FILE if rank == 0 else RANK_WEIGHTS_FILE.format(rank=rank)
            path = os.path.join(self.directory, name)
            temporary = f"{path}.{os.getpid()}.tmp"
            self._original_save(state, temporary)
            originals._os_replace(temporary, path)
            found["weights_file"] = name
        return found


def _kernel_age() -> float | None:
    """Seconds since this process started, by the kernel (/proc/self/stat's start time against
    /proc/uptime, in clock ticks); None where /proc does not say."""
    def read(path: str) -> str:
        fd = originals._os_open(path, os.O_RDONLY)
        try:
            return originals._os_read(fd, 4096).decode()
        finally:
            originals._os_close(fd)

    try:
        stat = read(f"/proc/{originals._getpid()}/stat")
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, counted after the command name
        uptime = float(read("/proc/uptime").split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


# ----------------------------------------------------------------------------------------- files


def _json_bytes(value: Any) -> bytes:
    import json

    return json.dumps(value, separators=(",", ":")).encode()


def _write_atomically(path: str, data: bytes) -> None:
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "wb") as out:
        out.write(data)
    originals._os_replace(temporary, path)
