"""Stopping a run on request: pre-emption signals under any launcher (torchrun, SLURM, Ctrl-C).

train.py enters a StopSignal before any work. SIGTERM, SIGUSR1 and SIGINT then stop the run:
at once during start-up (nothing written yet), and after the current step, with a checkpoint,
once training runs. A worker of torchrun also stops when its launcher dies.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
PR_SET_PDEATHSIG = 1  # linux/prctl.h


class StartupStopped(Exception):
    """A stop signal arrived before training began: nothing was written."""


class StopSignal:
    """Records SIGTERM, SIGUSR1 and SIGINT (pre-emption, Ctrl-C); the loop checks it between steps.

    During start-up a signal interrupts at once: nothing has been written, and a stop must not wait
    for a compile. Once training runs, it only sets a flag: the loop finishes its step, writes a
    checkpoint and exits 0. A torchrun worker whose launcher dies gets SIGTERM from the kernel
    (Linux), and the parent's pid is checked as well: no orphan trains on holding its GPU.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.launcher_gone = False
        self.starting = True
        self._previous: dict[int, Any] = {}
        self._parent = os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else None

    def __enter__(self) -> StopSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        if self._parent is not None:
            _signal_on_parent_death(signal.SIGTERM)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        self.signum = signum
        if self.starting:
            raise StartupStopped(signal.Signals(signum).name)

    def training_started(self) -> None:
        self.starting = False
        if self.signum is not None:  # arrived in a stretch the handler could not interrupt
            raise StartupStopped(signal.Signals(self.signum).name)

    @property
    def requested(self) -> bool:
        if self.signum is None and self._parent is not None and os.getppid() != self._parent:
            self.launcher_gone = True  # the kernel's SIGTERM may not have come
        return self.signum is not None or self.launcher_gone

    @property
    def under_torchrun(self) -> bool:
        """Whether torchrun launched this process (its workers carry TORCHELASTIC_RUN_ID)."""
        return self._parent is not None

    def cause(self) -> str:
        """What asked for the stop, for the stop message."""
        gone = self.launcher_gone or (self._parent is not None and os.getppid() != self._parent)
        if self.signum is not None:
            name = signal.Signals(self.signum).name
            return f"{name} (the launcher exited)" if gone else name
        return "the launcher's exit" if gone else "a signal on another rank"


def clean_stop_line(stopped: str, exit_status: int, under_torchrun: bool) -> str:
    """The last line a run stopped by a signal prints (rank 0): `stopped` (where, and which checkpoint
    a resume starts from), that the stop was clean, and its exit status; under torchrun, that the
    launcher's own report after it (a SignalException traceback, exit 1) is no failure of the run."""
    line = f"{stopped} A clean stop: this process exits with status {exit_status}; resume with --init_from=auto."
    if under_torchrun:
        line += " A torchrun report after this line (a SignalException traceback, torchrun's exit status 1) is expected: the launcher got the signal too."
    return line


def _signal_on_parent_death(sig: signal.Signals) -> None:
    """Ask the kernel to send `sig` when the launcher dies (Linux's PR_SET_PDEATHSIG)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig))
    except (OSError, AttributeError):  # no prctl: the parent-pid check above still notices
        pass
