"""A task from your own files: JSONL or Parquet rows of prompts and answers, and a reward
function given as ``"exact_match"`` or an import path ``"package.module:function"``."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from rllm_torch.core.errors import ConfigError, DatasetFormatError, DatasetNotFoundError
from rllm_torch.rollouts.single_turn import RewardFn
from rllm_torch.rollouts.task import Task, alphabet_of, exact_match_reward
from rllm_torch.trainer.schema import dataset_name

__all__ = ["load_rows", "load_reward_fn", "file_task"]


def load_rows(
    path: str, *, prompt_key: str = "prompt", answer_key: str = "answer", data_source: str = "file"
) -> list[dict]:
    """Read ``path`` (``.jsonl`` / ``.json`` lines, or ``.parquet``) into task dicts with
    ``prompt``, ``answer`` (as str) and ``data_source`` (a row's own ``data_source`` wins); other
    columns are kept.

    Raises:
        DatasetNotFoundError: the file does not exist.
        DatasetFormatError: it has an unknown suffix or no rows, a JSONL line is not a JSON
            object, or a row lacks a key.
    """
    file = Path(path)
    if not file.is_file():
        raise DatasetNotFoundError(
            f"dataset file {str(file)!r} does not exist; set task.train_path / task.val_path to a .jsonl or .parquet file."
        )
    if file.suffix in (".jsonl", ".json"):
        raw = _read_jsonl(file)
    elif file.suffix == ".parquet":
        import pyarrow.parquet as pq

        raw = pq.read_table(file).to_pylist()
    else:
        raise DatasetFormatError(f"dataset file {str(file)!r}: unknown suffix {file.suffix!r}; use .jsonl or .parquet.")
    if not raw:
        raise DatasetFormatError(
            f"dataset file {str(file)!r} has no rows; give at least one row with keys {prompt_key!r} and {answer_key!r}."
        )
    rows = []
    for i, row in enumerate(raw):
        if prompt_key not in row or answer_key not in row:
            raise DatasetFormatError(
                f"{str(file)!r} row {i}: needs keys {prompt_key!r} and {answer_key!r}, has {sorted(row)}."
            )
        rows.append(
            {
                **row,
                "prompt": str(row[prompt_key]),
                "answer": str(row[answer_key]),
                "data_source": row.get("data_source", data_source),
            }
        )
    return rows


def _read_jsonl(file: Path) -> list[dict]:
    """The JSON object of every non-blank line of ``file``; a bad line is named by its number (from 1)."""
    rows = []
    with file.open() as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetFormatError(
                    f'dataset file {str(file)!r}, line {number}: not valid JSON ({exc.msg} at column {exc.colno}); each line must be one JSON object such as {{"prompt": "3+4=", "answer": "7"}}.'
                ) from exc
            if not isinstance(row, dict):
                raise DatasetFormatError(
                    f'dataset file {str(file)!r}, line {number}: expected a JSON object, got {type(row).__name__}; each line must be one JSON object such as {{"prompt": "3+4=", "answer": "7"}}.'
                )
            rows.append(row)
    return rows


def load_reward_fn(spec: str) -> RewardFn:
    """``"exact_match"`` or ``"module:function"`` → the reward function.

    Raises:
        ConfigError: ``spec`` is not of the ``module:function`` form, or the module or function
            cannot be imported.
    """
    if spec == "exact_match":
        return exact_match_reward
    module_name, colon, attr = spec.partition(":")
    if not colon or not module_name or not attr:
        raise ConfigError(
            f"task.reward_fn={spec!r}: use 'exact_match' or the 'module:function' form, e.g. task.reward_fn=my_rewards:score for a function score in my_rewards.py (the module must be importable: run from its folder with PYTHONPATH=.)."
        )
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(
            f"task.reward_fn={spec!r}: cannot import it ({exc}); use 'exact_match' or 'package.module:function', importable from where you run (e.g. PYTHONPATH=. from the folder that holds the module)."
        ) from exc
    if not callable(fn):
        raise ConfigError(f"task.reward_fn={spec!r} is not callable.")
    return fn


def file_task(task_config: Any) -> Task:
    """Rows from ``task_config.train_path`` and ``val_path`` (None: no validation) with
    ``prompt_key``, ``answer_key``, ``reward_fn``; ``data_source`` (a row's own wins) is the
    :func:`~rllm_torch.trainer.schema.dataset_name` of the training file, for both splits: they are one dataset."""
    if not task_config.train_path:
        raise ConfigError("task.name=file needs task.train_path (a .jsonl or .parquet file).")
    keys = {"prompt_key": task_config.prompt_key, "answer_key": task_config.answer_key}
    source = dataset_name(task_config.train_path)
    train = load_rows(task_config.train_path, data_source=source, **keys)
    val = load_rows(task_config.val_path, data_source=source, **keys) if task_config.val_path else []
    return Task(
        name="file",
        train=train,
        val=val,
        reward_fn=load_reward_fn(task_config.reward_fn),
        alphabet=alphabet_of(train, val),
        answer_in_response=task_config.reward_fn == "exact_match",  # a custom reward may parse a part of it
    )
