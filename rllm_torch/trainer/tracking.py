"""``Tracking``: where metrics go: ``console`` (one line per log call) and ``jsonl``
(``{run_dir}/metrics.jsonl``, one JSON object per log call with its ``step``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rllm_torch.errors import ConfigError

__all__ = ["Tracking", "LOGGER_BACKENDS"]

LOGGER_BACKENDS = ("console", "jsonl")


class Tracking:
    """Metrics sinks of a run.

    Args:
        backends: names from :data:`LOGGER_BACKENDS` (a str or a list of them).
        run_dir: directory of ``metrics.jsonl`` (needed for ``jsonl``).

    Raises:
        ConfigError: an unknown backend name, or ``jsonl`` without a run directory.
    """

    def __init__(self, backends: str | list[str], run_dir: str | Path | None = None, **kwargs: Any) -> None:
        self.backends = [backends] if isinstance(backends, str) else list(backends)
        unknown = [b for b in self.backends if b not in LOGGER_BACKENDS]
        if unknown:
            raise ConfigError(f"rllm.trainer.logger: unknown logger(s) {unknown}; choose from {list(LOGGER_BACKENDS)}.")
        self._file = None
        if "jsonl" in self.backends:
            if run_dir is None:
                raise ConfigError("the jsonl logger needs a run directory (rllm.trainer.default_local_dir).")
            Path(run_dir).mkdir(parents=True, exist_ok=True)
            self._file = open(Path(run_dir) / "metrics.jsonl", "a")  # noqa: SIM115 - closed in finish()

    def log(self, data: dict[str, Any], step: int, **kwargs: Any) -> None:
        """Record ``data`` (numbers; other values are written as strings) at ``step``."""
        row = {"step": step, **{k: _plain(v) for k, v in data.items()}}
        if self._file is not None:
            self._file.write(json.dumps(row, default=str) + "\n")
            self._file.flush()
        if "console" in self.backends:
            shown = {k: v for k, v in row.items() if k != "step" and ("pass@" in k or k.endswith("reward/solver/mean") or k.startswith(("reward/", "actor/loss", "time/step")))}
            print(f"step {step}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(shown.items())), flush=True)

    def finish(self) -> None:
        """Close the files."""
        if self._file is not None:
            self._file.close()
            self._file = None


def _plain(value: Any) -> Any:
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
