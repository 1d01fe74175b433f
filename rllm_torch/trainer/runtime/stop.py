"""A stop that loses nothing: SIGTERM (what Slurm, Kubernetes and torchrun send before a kill) and,
once the steps began, Ctrl-C (SIGINT) ask the run to write its trained weights and end, within
seconds, at whatever stage it is in.

:class:`StopSignals` installs the handler for the duration of a ``with`` block (the command line's
training run; the Python API installs nothing unless asked). The first signal records the request
(one line on standard error). A second SIGTERM changes nothing (a scheduler's repeated signal must
not cost the checkpoint being written); a second Ctrl-C is a person who will not wait: it raises
:class:`InterruptedAgain` at once (what was trained since the newest checkpoint is lost); SIGKILL
ends a run at once too. Before :meth:`StopSignals.take_ctrl_c` (the start-up: model, data, the
first validation, nothing trained to keep) a Ctrl-C is what it was: Python's ``KeyboardInterrupt``.

Where the request is honoured:

* **inside a stage** (:class:`StopGuard`): the trainer marks the stages a request may abandon
  (a training step, a validation, the end-of-run export). Inside one, the work checks
  :func:`stop_point` at safe places (each transformer block of a forward, and of a backward that
  recomputes them under activation checkpointing: :func:`add_stop_points`; each decoding step of
  the ``hf`` sampler, each micro-batch of the log-prob passes and of the update before its first
  optimizer step, each stage of a step, each file of the export), which raises
  :class:`StopRequested`. The guard then
  puts back what the stage changed of the run's state (the step counters, the rejection-sampling
  state, every random generator: a checkpoint taken now is the one taken before the stage, and a
  resumed run repeats the stage exactly), writes the checkpoint of the trained weights unless it
  is on disk already, and raises :class:`TrainingStopped`.
* **past a point of no return** (:func:`no_stop_points`): an update whose first optimizer step is
  taken has moved the weights, AdamW's moments and the learning-rate schedule, and cannot be
  resumed halfway; its stop points (those between blocks included) raise nothing, the update
  runs to its end (``backend.mini_batch_size`` below the batch or ``backend.ppo_epochs`` > 1: the
  rest of one update) and the request is honoured at the step boundary, which checkpoints the
  step as done (issue 52: it was abandoned, and its moved weights checkpointed as the step before).
* **at a step boundary**, agreed across the ranks (a stop on one rank stops them all at the same
  step): on several processes the stages are not abandoned (each rank would stop at another safe
  place, between two collectives), so the request waits for the step to end.

Stages without safe places (a vLLM ``generate`` call, a reward function, writing a checkpoint)
run to their end first.
"""

from __future__ import annotations

import contextvars
import copy
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from rllm_torch.trainer.runtime.run_checkpoint import capture_rng_states, restore_rng_states

__all__ = [
    "add_stop_points",
    "InterruptedAgain",
    "no_stop_points",
    "StopSignals",
    "StopGuard",
    "StopRequested",
    "TrainingStopped",
    "STOPPED_EXIT_STATUS",
    "stop_point",
    "stop_requested",
]

STOPPED_EXIT_STATUS = 128 + signal.SIGTERM  # 143, the shell's convention for a process ended by SIGTERM


class TrainingStopped(Exception):
    """The run stopped on a signal with the checkpoint of ``step`` written (``checkpoint``: its
    directory on rank 0, None elsewhere, or None when nothing was trained yet); the same command
    continues from it. ``exit_status``: the shell's for the signal (128 + its number: 143 for
    SIGTERM, 130 for SIGINT)."""

    def __init__(self, signal_name: str, step: int, checkpoint: Path | None) -> None:
        super().__init__(f"stopped by {signal_name} after step {step}")
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint
        self.exit_status = 128 + signal.Signals[signal_name]


class InterruptedAgain(KeyboardInterrupt):
    """A second Ctrl-C while a stop was under way: the run ends at once, without the checkpoint
    the stop was to write (what was trained since the newest checkpoint on disk is lost)."""


class StopRequested(BaseException):
    """Raised by :func:`stop_point` inside a stage a :class:`StopGuard` may abandon. A
    ``BaseException`` (as ``KeyboardInterrupt``), so that a workflow's or the workflow engine's
    ``except Exception`` (a retry) does not take it for a failed episode."""


_ABANDONABLE: contextvars.ContextVar[StopSignals | None] = contextvars.ContextVar("abandonable", default=None)


def stop_requested() -> bool:
    """Whether a stop was requested and the caller runs inside a stage that may be abandoned."""
    signals = _ABANDONABLE.get()
    return signals is not None and signals.requested


def stop_point() -> None:
    """A safe place to abandon the stage: raise :class:`StopRequested` when a stop was requested
    and the caller runs inside a :meth:`StopGuard.stage` (else nothing: one context-variable read).

    Raises:
        StopRequested: as said.
    """
    if stop_requested():
        raise StopRequested


@contextmanager
def no_stop_points() -> Iterator[None]:
    """Inside, :func:`stop_point` raises nothing: work past its point of no return (an update after
    its first optimizer step) runs to its end, and a stop request waits for the step boundary."""
    token = _ABANDONABLE.set(None)
    try:
        yield
    finally:
        _ABANDONABLE.reset(token)


def add_stop_points(model: Any) -> int:
    """A :func:`stop_point` in each block of ``model`` (the modules of its longest ``ModuleList``: a
    transformer's layers), as a forward pre-hook of the block's first submodule: a stop request is
    then honoured between two blocks of a forward, and of a backward with activation checkpointing,
    whose recomputation runs each block's forward again (``transformers`` checkpoints a layer's
    ``forward``, so the layer's own hooks stay outside it; its submodules' run inside), not only
    between micro-batches. Returns the number of blocks (0: no module list, nothing added).
    """
    from torch import nn

    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    if not lists:
        return 0
    blocks = max(lists, key=len)
    for block in blocks:
        first = next(block.children(), block)
        first.register_forward_pre_hook(lambda module, args: stop_point())
    return len(blocks)


class StopSignals:
    """Records the first of ``signals`` received while the ``with`` block runs; a later SIGTERM is
    ignored but for one line (the stop is under way), a later SIGINT raises
    :class:`InterruptedAgain` (a second Ctrl-C: at once). A SIGINT before :meth:`take_ctrl_c`
    goes to the handler found on entry (Python's ``KeyboardInterrupt``).

    Outside the main thread (where Python cannot install signal handlers) it does nothing; a
    signal the process was started ignoring (SIGINT in a shell's background job) stays ignored.

    Args:
        signals: the signals that ask for a stop (default: SIGTERM; the command line adds SIGINT).
        announce: print one line on standard error when the first arrives (rank 0 of a run).
    """

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM,), *, announce: bool = True) -> None:
        self.signals, self.announce = signals, announce
        self.received: int | None = None
        self.ctrl_c_stops = False
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.received is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received is not None else ""

    def take_ctrl_c(self) -> None:
        """From here a SIGINT (when among ``signals``) asks for a stop as SIGTERM does: the trainer
        calls it when its steps begin, when there is trained work to keep."""
        self.ctrl_c_stops = True

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and not self.ctrl_c_stops:  # the start-up: Ctrl-C as it was
            previous = self._previous.get(signum)
            if callable(previous):
                return previous(signum, frame)
            raise KeyboardInterrupt
        again = self.received is not None
        if again and signum == signal.SIGINT:
            raise InterruptedAgain
        self.received = self.received or signum
        if self.announce:
            text = (
                "already stopping: the trained weights are being written (SIGKILL ends the run at once)"
                if again
                else "stopping: the trained weights are written first, within seconds"
            )
            if signum == signal.SIGINT:
                text += " (Ctrl-C again ends the run at once, losing what was trained since the newest checkpoint)"
            print(f"rllm-torch-train: {signal.Signals(signum).name} received; {text}", file=sys.stderr, flush=True)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                if signum != signal.SIGINT or signal.getsignal(signum) is not signal.SIG_IGN:
                    self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()


class StopGuard:
    """The trainer's side of a stop inside a stage (see the module docstring).

    Args:
        signals: the run's :class:`StopSignals` (None: signals are not handled, nothing is abandoned).
        checkpoint: writes the checkpoint of a state (the trainer's ``RunCheckpointer.save`` with its
            validation history); called only when the step is not on disk yet.
        saved_step: the step of the newest checkpoint on disk (None: none).
        newest: the newest checkpoint's directory (rank 0; None elsewhere or when there is none).
        backend: gives and takes its per-rank state (``rank_state_dict``: the sampling generator).
        distributed: several processes: stages are never abandoned (the step boundary's check stands).
    """

    def __init__(
        self,
        signals: StopSignals | None,
        *,
        checkpoint: Callable[[Any], None],
        saved_step: Callable[[], int | None],
        newest: Callable[[], Path | None],
        backend: Any,
        distributed: bool,
    ) -> None:
        self.signals, self.checkpoint, self.saved_step, self.newest = signals, checkpoint, saved_step, newest
        self.backend, self.distributed = backend, distributed

    @contextmanager
    def stage(self, state: Any, val_history: list | None = None) -> Iterator[None]:
        """Inside, a stop request abandons the work at its next :func:`stop_point`: ``state``
        (a ``TrainerState``), ``val_history`` and every generator are put back as they were on
        entry, the trained weights are checkpointed (unless that step is on disk), and
        :class:`TrainingStopped` is raised. A request that arrived before the stage abandons it at
        its first safe place.

        Raises:
            TrainingStopped: as said.
        """
        if self.signals is None or self.distributed:
            yield
            return
        saved = _Snapshot(state, self.backend, val_history)
        token = _ABANDONABLE.set(self.signals)
        try:
            yield
        except StopRequested:
            saved.restore()
            if state.global_step > 0 and self.saved_step() != state.global_step:
                self.checkpoint(state)
            checkpoint = self.newest() if state.global_step > 0 else None
            raise TrainingStopped(self.signals.name or "SIGTERM", state.global_step, checkpoint) from None
        finally:
            _ABANDONABLE.reset(token)


class _Snapshot:
    """What a checkpoint holds of the run's state besides the weights, taken at a stage's entry."""

    FIELDS = ("global_step", "epoch", "batch_in_epoch", "last_validation_step")

    def __init__(self, state: Any, backend: Any, val_history: list | None) -> None:
        self.state, self.backend, self.val_history = state, backend, val_history
        self.fields = {name: getattr(state, name) for name in self.FIELDS}
        self.rs_state = copy.deepcopy(state.rs_state)
        self.validations = len(val_history) if val_history is not None else 0
        self.rng = capture_rng_states()
        self.rank_state = copy.deepcopy(backend.rank_state_dict())

    def restore(self) -> None:
        for name, value in self.fields.items():
            setattr(self.state, name, value)
        self.state.rs_state = self.rs_state
        if self.val_history is not None:
            del self.val_history[self.validations :]
        restore_rng_states(self.rng)
        self.backend.load_rank_state_dict(self.rank_state)
