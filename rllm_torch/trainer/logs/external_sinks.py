"""Metric sinks of other tools: TensorBoard (``torch.utils.tensorboard``) and offline wandb."""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path
from typing import Any

__all__ = ["TensorBoardSink", "WandbSink", "open_wandb_sink"]


class TensorBoardSink:
    """Scalars into ``log_dir``; with ``resume_step``, events after that step are purged."""

    def __init__(self, log_dir: Path, resume_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        purge = resume_step + 1 if resume_step is not None else None  # -1 (a fresh run): purge everything
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge)

    def log(self, row: dict[str, Any], step: int) -> None:
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()


class WandbSink:
    """An offline wandb run (``wandb sync RUN_DIR/wandb/offline-run-*`` uploads it later)."""

    def __init__(self, run: Any) -> None:
        self.run = run

    def log(self, row: dict[str, Any], step: int) -> None:
        self.run.log({k: v for k, v in row.items() if k != "step"}, step=step)

    def finish(self) -> None:
        self.run.finish()


def open_wandb_sink(run_dir: Path, project: str, name: str, config: dict | None) -> WandbSink | None:
    """A :class:`WandbSink` in offline mode (no network, no account), or None with a warning
    when wandb is not installed. The run id is derived from ``run_dir``, so a resumed run continues it."""
    try:
        import wandb
    except ImportError:
        warnings.warn(
            "rllm.trainer.logger includes wandb, but wandb is not installed (pip install 'rllm_torch[wandb]'); "
            "no wandb run is written. Metrics still go to the other loggers.",
            stacklevel=3,
        )
        return None
    run_id = hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:12]
    run_dir.mkdir(parents=True, exist_ok=True)
    run = wandb.init(
        project=project, name=name, id=run_id, resume="allow", dir=str(run_dir), mode="offline", config=config or {}
    )
    return WandbSink(run)
