"""A task from your own files: JSONL or Parquet rows of prompts and answers, and a reward
function given as ``"exact_match"`` or an import path ``"package.module:function"``."""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path
from typing import Any

from rllm_torch.core.errors import ConfigError, DatasetFormatError, DatasetNotFoundError
from rllm_torch.rollouts.single_turn import RewardFn
from rllm_torch.rollouts.task import Task, alphabet_of, exact_match_reward
from rllm_torch.trainer.resolvers import dataset_name

__all__ = ["load_rows", "load_reward_fn", "file_task"]


def load_rows(
    path: str, *, prompt_key: str = "prompt", answer_key: str = "answer", data_source: str = "file"
) -> list[dict]:
    """Read ``path`` (``.jsonl`` / ``.json`` lines, or ``.parquet``) into task dicts with
    ``prompt``, ``answer`` (as str) and ``data_source`` (a row's own ``data_source`` wins); other
    columns are kept.

    The values' rule (nothing becomes text it was not): a prompt is a non-empty string; an answer
    is a string, an integer or a finite float (converted with ``str``: ``7`` -> ``"7"``, ``2.5``
    -> ``"2.5"``). A null (JSON ``null``, a Parquet null), NaN, an infinity, a boolean, a list or
    an object is refused, naming the row as a person counts it: the line of a JSONL file, the
    row of a Parquet file, both from 1.

    Raises:
        DatasetNotFoundError: the file does not exist.
        DatasetFormatError: it has an unknown suffix or no rows, is not UTF-8 text (JSONL) or not
            a Parquet file, a JSONL line is not a JSON object, or a row has a value of the wrong
            kind or lacks a key (naming ``task.prompt_key`` / ``task.answer_key`` and the row's keys).
    """
    file = Path(path)
    if not file.is_file():
        raise DatasetNotFoundError(
            f"dataset file {str(file)!r} does not exist; set task.train_path / task.val_path to a .jsonl or .parquet file."
        )
    if file.suffix in (".jsonl", ".json"):
        raw = _read_jsonl(file)
    elif file.suffix == ".parquet":
        raw = [(f"row {number}", row) for number, row in enumerate(_read_parquet(file), start=1)]
    else:
        raise DatasetFormatError(f"dataset file {str(file)!r}: unknown suffix {file.suffix!r}; use .jsonl or .parquet.")
    if not raw:
        raise DatasetFormatError(
            f"dataset file {str(file)!r} has no rows; give at least one row with keys {prompt_key!r} and {answer_key!r}."
        )
    rows = []
    for where, row in raw:
        for setting, key in (("task.prompt_key", prompt_key), ("task.answer_key", answer_key)):
            if key not in row:
                raise DatasetFormatError(
                    f"dataset file {str(file)!r}, {where}: no {key!r} key ({setting}={key}); the row has {sorted(row)}: "
                    f"set {setting} to the key that holds it{_likely_key(row, setting, prompt_key, answer_key)}."
                )
        rows.append(
            {
                **row,
                "prompt": _prompt(row[prompt_key], f"dataset file {str(file)!r}, {where}: {prompt_key!r}"),
                "answer": _answer(row[answer_key], f"dataset file {str(file)!r}, {where}: {answer_key!r}"),
                "data_source": row.get("data_source", data_source),
            }
        )
    return rows


_USUAL_KEYS = {
    "task.prompt_key": ("prompt", "question", "problem", "input", "query", "instruction", "text"),
    "task.answer_key": ("answer", "solution", "output", "target", "label", "ground_truth", "completion", "response"),
}


def _likely_key(row: dict, setting: str, *taken: str) -> str:
    """``", e.g. task.prompt_key=question"``: the row's first key of the usual names for the setting."""
    for key in _USUAL_KEYS[setting]:
        if key in row and key not in taken:
            return f", e.g. {setting}={key}"
    return ""


def _prompt(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise DatasetFormatError(f"{where} must be a non-empty string, got {_shown(value)}; fix or drop the row.")
    return value


def _answer(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return str(value)
    raise DatasetFormatError(
        f"{where} must be a string, an integer or a finite number, got {_shown(value)}; fix or drop the row."
    )


def _shown(value: Any) -> str:
    return "null" if value is None else f"{type(value).__name__} {value!r}"[:80]


def _read_parquet(file: Path) -> list[dict]:
    import pyarrow
    import pyarrow.parquet as pq

    try:
        return pq.read_table(file).to_pylist()
    except (pyarrow.ArrowException, OSError) as exc:
        raise DatasetFormatError(
            f"dataset file {str(file)!r} is not a readable Parquet file ({exc}); write it with pyarrow or pandas "
            "(DataFrame.to_parquet), or give a .jsonl file."
        ) from exc


def _read_jsonl(file: Path) -> list[tuple[str, dict]]:
    """``("line N", object)`` for every non-blank line of ``file``; a bad line is named by its number (from 1)."""
    rows = []
    with file.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DatasetFormatError(
                    f"dataset file {str(file)!r}, line {number}: not UTF-8 text (byte {raw[exc.start]:#04x} at column "
                    f"{exc.start + 1}); save the file as UTF-8."
                ) from exc
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
            rows.append((f"line {number}", row))
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
    except Exception as exc:  # a missing module or name, and whatever the module raises at import (SyntaxError too)
        raise ConfigError(
            f"task.reward_fn={spec!r}: cannot import it ({type(exc).__name__}: {exc}); use 'exact_match' or 'package.module:function', importable from where you run (e.g. PYTHONPATH=. from the folder that holds the module)."
        ) from exc
    if not callable(fn):
        raise ConfigError(f"task.reward_fn={spec!r} is not callable.")
    return fn


def file_task(task_config: Any) -> Task:
    """Rows from ``task_config.train_path`` and ``val_path`` (None: no validation) with
    ``prompt_key``, ``answer_key``, ``reward_fn``; ``data_source`` (a row's own wins) is the
    :func:`~rllm_torch.trainer.resolvers.dataset_name` of the training file, for both splits: they are one dataset."""
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
