"""Ctrl-C at any moment of ``rllm-torch-train``'s start-up ends in one line and exit status 130: while it
starts (:func:`interrupted_while_starting`: nothing was written), and once the run began, before its
steps (:func:`interrupted`: what the same command then does). Once the steps began, a Ctrl-C asks
for a stop as SIGTERM does (the trained weights checkpointed, :mod:`rllm_torch.trainer.runtime.stop`),
and a second one ends here at once (:func:`interrupted` with ``again``). A library may catch the
``KeyboardInterrupt`` and raise an error of its own (``transformers``' lazy imports raise
``ModuleNotFoundError``): :func:`watch_ctrl_c` remembers the signal, so that error ends as a
Ctrl-C too (:func:`ctrl_c_received`)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

__all__ = [
    "INTERRUPTED_EXIT_STATUS",
    "watch_ctrl_c",
    "ctrl_c_received",
    "interrupted_while_starting",
    "interrupted",
    "ignore_stop_signals",
]

INTERRUPTED_EXIT_STATUS = 130  # 128 + SIGINT, the shell's convention for Ctrl-C

_CTRL_C = {"received": False}


def _on_ctrl_c(signum: int, frame: FrameType | None) -> None:
    _CTRL_C["received"] = True
    raise KeyboardInterrupt


def watch_ctrl_c() -> None:
    """Python's Ctrl-C (a ``KeyboardInterrupt``), remembered (:func:`ctrl_c_received`). A SIGINT the
    process was started ignoring (a shell's background job) stays ignored."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) not in (
        signal.SIG_IGN,
        None,
    ):
        signal.signal(signal.SIGINT, _on_ctrl_c)


def ctrl_c_received() -> bool:
    """Whether a Ctrl-C reached this process since :func:`watch_ctrl_c`."""
    return _CTRL_C["received"]


def interrupted_while_starting(program: str) -> None:
    """Ctrl-C before a run began: remove the run directory Hydra had just made (when still empty),
    say so in one line, exit with status 130 (128 + SIGINT)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C while this ends changes nothing
    run_directory = sys.modules.get("rllm_torch.cli.run_directory")
    made = run_directory.LAUNCH["made"] if run_directory is not None else None
    if made is not None and made.is_dir() and not any(made.iterdir()):
        run_directory.remove_empty_run_dir(made)
    print(f"{program}: interrupted while starting, before the run began; nothing was written", file=sys.stderr)
    sys.exit(INTERRUPTED_EXIT_STATUS)


def interrupted(config: Any, *, again: bool = False) -> None:
    """Ctrl-C's end of a run (rank 0 says it): remove the run directory if still empty, one line
    saying what the same command does, exit status 130. ``again``: a second Ctrl-C cut short the
    stop the first one asked for; the line says what is lost (what was trained since the newest
    checkpoint)."""
    from hydra.core.hydra_config import HydraConfig

    from rllm_torch.cli.run_directory import remove_empty_run_dir, resume_point

    ignore_stop_signals()
    if os.environ.get("RANK", "0") == "0" and HydraConfig.initialized():
        hydra_dir = HydraConfig.get().runtime.output_dir
        run_dir = config.rllm.trainer.default_local_dir or hydra_dir
        remove_empty_run_dir(run_dir)
        remove_empty_run_dir(hydra_dir)
        where = resume_point(run_dir)
        what = (
            "interrupted again before the checkpoint was written: what was trained since the newest checkpoint is "
            f"lost; the same command {where}"
            if again
            else f"interrupted; the same command {where}"
        )
        print(f"rllm-torch-train: {what}", file=sys.stderr, flush=True)
    sys.exit(INTERRUPTED_EXIT_STATUS)


def ignore_stop_signals() -> None:
    """Ignore SIGINT and SIGTERM from here on: the process is ending with its own exit status."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
