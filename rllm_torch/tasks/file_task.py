"""A task from your own files: JSONL or Parquet rows of prompts and answers, and a reward
function given as ``"exact_match"`` or an import path ``"package.module:function"``."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from rllm_torch.errors import ConfigError, DatasetNotFoundError
from rllm_torch.tasks.base import Task, alphabet_of, exact_match_reward
from rllm_torch.workflows.single_turn import RewardFn

__all__ = ["load_rows", "load_reward_fn", "file_task"]


def load_rows(path: str, *, prompt_key: str = "prompt", answer_key: str = "answer", data_source: str = "file") -> list[dict]:
    """Read ``path`` (``.jsonl`` / ``.json`` lines, or ``.parquet``) into task dicts with
    ``prompt``, ``answer`` (as str) and ``data_source`` (a row's own ``data_source`` wins); other
    columns are kept.

    Raises:
        DatasetNotFoundError: the file does not exist, has an unknown suffix, or a row lacks a key.
    """
    file = Path(path)
    if not file.is_file():
        raise DatasetNotFoundError(f"dataset file {str(file)!r} does not exist; set task.train_path / task.val_path to a .jsonl or .parquet file.")
    if file.suffix in (".jsonl", ".json"):
        with file.open() as f:
            raw = [json.loads(line) for line in f if line.strip()]
    elif file.suffix == ".parquet":
        import pyarrow.parquet as pq

        raw = pq.read_table(file).to_pylist()
    else:
        raise DatasetNotFoundError(f"dataset file {str(file)!r}: unknown suffix {file.suffix!r}; use .jsonl or .parquet.")
    rows = []
    for i, row in enumerate(raw):
        if prompt_key not in row or answer_key not in row:
            raise DatasetNotFoundError(f"{str(file)!r} row {i}: needs keys {prompt_key!r} and {answer_key!r}, has {sorted(row)}.")
        rows.append({**row, "prompt": str(row[prompt_key]), "answer": str(row[answer_key]), "data_source": row.get("data_source", data_source)})
    return rows


def load_reward_fn(spec: str) -> RewardFn:
    """``"exact_match"`` or ``"module:function"`` → the reward function.

    Raises:
        ConfigError: the module or function cannot be imported.
    """
    if spec == "exact_match":
        return exact_match_reward
    module_name, _, attr = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"task.reward_fn={spec!r}: cannot import it ({exc}); use 'exact_match' or 'package.module:function'.") from exc
    if not callable(fn):
        raise ConfigError(f"task.reward_fn={spec!r} is not callable.")
    return fn


def file_task(task_config: Any) -> Task:
    """Rows from ``task_config.train_path`` and ``val_path`` (None: no validation) with
    ``prompt_key``, ``answer_key``, ``reward_fn``; ``data_source`` defaults to the file stem."""
    if not task_config.train_path:
        raise DatasetNotFoundError("task.name=file needs task.train_path (a .jsonl or .parquet file).")
    keys = {"prompt_key": task_config.prompt_key, "answer_key": task_config.answer_key}
    train = load_rows(task_config.train_path, data_source=Path(task_config.train_path).stem, **keys)
    val = load_rows(task_config.val_path, data_source=Path(task_config.val_path).stem, **keys) if task_config.val_path else []
    return Task(name="file", train=train, val=val, reward_fn=load_reward_fn(task_config.reward_fn), alphabet=alphabet_of(train, val))
