"""A stop that loses nothing: SIGTERM (what Slurm, Kubernetes and torchrun send before a kill) asks
the run to stop at the next step boundary, after a checkpoint of that step.

:class:`StopSignals` installs the handler for the duration of a ``with`` block (the command line's
training run; the Python API installs nothing unless asked). The first SIGTERM only records the
request (one line on standard error); the trainer checks it before every step, agreed across the
ranks (a stop on one rank stops them all at the same step), writes the step's checkpoint unless it
has just written it, and raises :class:`TrainingStopped`. A second SIGTERM, for a grace period
shorter than a step, ends the process at once with the signal's default action: the newest
checkpoint already written is kept (checkpoints are written atomically).
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = ["StopSignals", "TrainingStopped", "STOPPED_EXIT_STATUS"]

STOPPED_EXIT_STATUS = 128 + signal.SIGTERM  # 143, the shell's convention for a process ended by SIGTERM


class TrainingStopped(Exception):
    """The run stopped at a step boundary on a signal, after the checkpoint of ``step`` (``checkpoint``:
    its directory on rank 0, None elsewhere); the same command continues from it."""

    def __init__(self, signal_name: str, step: int, checkpoint: Path | None) -> None:
        super().__init__(f"stopped by {signal_name} after step {step}")
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint


class StopSignals:
    """Records the first of ``signals`` received while the ``with`` block runs; the second ends
    the process at once (the signal's previous handler, by default the kernel's).

    Outside the main thread (where Python cannot install signal handlers) it does nothing.

    Args:
        signals: the signals that ask for a stop (default: SIGTERM).
        announce: print one line on standard error when the first arrives (rank 0 of a run).
    """

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM,), *, announce: bool = True) -> None:
        self.signals, self.announce = signals, announce
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.received is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received is not None else ""

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None:  # the second: no more grace
            signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))
            signal.raise_signal(signum)
            return
        self.received = signum
        if self.announce:
            print(
                f"rllm-torch-train: {signal.Signals(signum).name} received; stopping after the current step and its "
                "checkpoint (send it again to stop at once, keeping the newest checkpoint)",
                file=sys.stderr,
                flush=True,
            )

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
