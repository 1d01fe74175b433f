"""Errors of the programs as one block on stderr, without a traceback (:func:`report_error`), and
the exit status they end with (:data:`ERROR_EXIT_STATUS`); the warnings' counterpart is
:mod:`~rllm_torch.cli.warning_lines`."""

from __future__ import annotations

import os
import sys
from typing import TextIO

from rllm_torch.core.errors import RLLMTorchError

__all__ = ["ERROR_EXIT_STATUS", "report_error"]

#: The exit status of a run stopped by one of the package's errors (a bad setting, a bad input).
ERROR_EXIT_STATUS = 2


def report_error(exc: RLLMTorchError, stream: TextIO | None = None) -> None:
    """One block on stderr: the error's type and message (which says the fix), no traceback;
    under a torchrun launch of several processes, the rank that prints it."""
    stream = stream or sys.stderr
    rank = f" (rank {os.environ.get('RANK')})" if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1 else ""
    print(f"rllm-torch-train{rank}: {type(exc).__name__}: {exc}", file=stream)
    print("  (set HYDRA_FULL_ERROR=1 to see the traceback)", file=stream, flush=True)
