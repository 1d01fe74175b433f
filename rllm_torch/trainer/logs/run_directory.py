"""What a run writes into its directory besides checkpoints: the metric sinks and episode log
(:func:`run_loggers`), and, once training starts, the command's files and the resume record
(:func:`write_run_files`)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rllm_torch.trainer.logs.tracking import Tracking
from rllm_torch.trainer.ranks import RunRanks
from rllm_torch.trainer.runtime.checkpoint import CheckpointInfo
from rllm_torch.trainer.workflow_engine import EpisodeLogger

__all__ = ["run_directory", "run_loggers", "write_run_files", "config_as_run"]

_YAML_KEY = re.compile(r"^( *)([^\s:#'\"-][^:]*):(?: |$)")


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


def config_as_run(given_yaml: str, used: DictConfig, sources: dict[str, str]) -> str:
    r"""The run directory's ``config.yaml``: ``given_yaml`` (the config as given, resolved) with
    each setting of ``sources`` that is ``null`` there set to its value in ``used`` (the
    backend's config, its defaults filled in), and ``# <source>`` after it, so that the file says
    what the run used and running it again gives the same run.

    Args:
        given_yaml: ``OmegaConf.to_yaml(config, resolve=True)`` of the run's config.
        used: the config the backend runs with.
        sources: ``{dotted key: where its value comes from}`` (the backend's ``setting_sources``).

    Examples:
        >>> from omegaconf import OmegaConf
        >>> print(config_as_run("backend:\n  lr: null\n", OmegaConf.create({"backend": {"lr": 0.001}}),
        ...                     {"backend.lr": "null: the default"}), end="")
        backend:
          lr: 0.001  # null: the default
    """
    config = OmegaConf.create(given_yaml)
    filled = {}
    for key, source in sources.items():
        value = OmegaConf.select(used, key, default=None)
        if OmegaConf.select(config, key, default=None) is None and value is not None:
            OmegaConf.update(config, key, value, merge=False)
            filled[key] = source
    lines, path = [], []
    for line in OmegaConf.to_yaml(config).splitlines():
        match = _YAML_KEY.match(line)
        if match:
            depth = len(match.group(1)) // 2
            path[depth:] = [match.group(2)]
            if (key := ".".join(path)) in filled:
                line = f"{line}  # {filled[key]}"
        lines.append(line)
    return "\n".join(lines) + "\n"
