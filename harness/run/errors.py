"""How a run is refused, stopped or failed by the harness itself: the exceptions of the run stage."""

from __future__ import annotations

from harness.run.launchers import signal_name
from harness.usage import UsageError


class RunRefused(UsageError):
    """A run that cannot start (bad request, results folder unwritable or full): one line, exit 2."""


class HarnessError(RuntimeError):
    """The harness itself failed around a run; run.json says so and names the file with the details."""

    exit_code = 1


class RunStopped(KeyboardInterrupt):
    """A signal (Ctrl-C, SIGTERM, SIGHUP) stopped the run; raised once its run.json is written.

    A KeyboardInterrupt, so whoever handles Ctrl-C handles these too; exit_code is 128 + the signal.
    """

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {signal_name(signum)}")
