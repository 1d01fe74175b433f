"""What a run writes into its directory besides checkpoints: the metric sinks and episode log
(:func:`run_loggers`), and, once training starts, the command's files and the resume record
(:func:`write_run_files`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rllm_torch.trainer.logs.tracking import Tracking
from rllm_torch.trainer.ranks import RunRanks
from rllm_torch.trainer.runtime.checkpoint import CheckpointInfo
from rllm_torch.trainer.workflow_engine import EpisodeLogger

__all__ = ["run_directory", "run_loggers", "write_run_files"]


def run_directory(config: DictConfig) -> Path:
    """The run directory: ``rllm.trainer.default_local_dir``, else ``outputs/<project>/<experiment>``."""
    trainer = config.rllm.trainer
    return Path(trainer.default_local_dir or f"outputs/{trainer.project_name}/{trainer.experiment_name}")


def run_loggers(config: DictConfig, ranks: RunRanks) -> tuple[Path, EpisodeLogger | None, Tracking]:
    """The run directory (``rllm.trainer.default_local_dir``, else ``outputs/<project>/<experiment>``),
    the episode logger (``rllm.episode_logging.log_episodes``; one subdirectory per rank under
    torchrun) and the metric sinks of ``rllm.trainer.logger`` (rank 0's; the other ranks get a
    ``Tracking`` without sinks, whose log calls do nothing)."""
    trainer, logging = config.rllm.trainer, config.rllm.episode_logging
    run_dir = run_directory(config)
    subdirectory = f"episodes/rank{ranks.rank}" if ranks.distributed else "episodes"
    episode_logger = (
        EpisodeLogger(logging.episode_log_dir or str(run_dir), subdirectory) if logging.log_episodes else None
    )
    backends = trainer.logger if isinstance(trainer.logger, str) else OmegaConf.to_container(trainer.logger)
    backends = backends if ranks.is_main else []
    tracking = Tracking(
        backends,
        run_dir=run_dir,
        project_name=trainer.project_name,
        experiment_name=trainer.experiment_name,
        config=OmegaConf.to_container(config, resolve=True) if "wandb" in backends else None,
        table_every=trainer.log_table_every,
    )
    return run_dir, episode_logger, tracking


def write_run_files(
    run_dir: Path, files: dict[str, str], resumed: CheckpointInfo | None, changes: dict[str, tuple[Any, Any]]
) -> None:
    """Rank 0, when training starts: ``files`` (``{path relative to run_dir: text}``), and for a
    resume a line of ``resumes.jsonl``: the checkpoint, its step and the resumable settings
    changed since (``changes``: ``{key: (old, new)}``)."""
    for name, text in files.items():
        path = run_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if resumed is not None:
        row = {
            "step": resumed.step,
            "checkpoint": str(resumed.path),
            "changed": {k: list(v) for k, v in changes.items()},
        }
        run_dir.mkdir(parents=True, exist_ok=True)
        with open(run_dir / "resumes.jsonl", "a") as file:
            file.write(json.dumps(row, default=str) + "\n")
