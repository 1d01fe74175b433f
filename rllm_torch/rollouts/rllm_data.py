"""rLLM's datasets (``rllm.data``: ``rllm/data/dataset.py`` of rLLM main 9beb6e0f): :class:`Dataset`,
a list of task rows with rLLM's methods, and :class:`DatasetRegistry`, named splits stored as
files under a directory with a JSON registry, in rLLM's layout and format, so a registry rLLM
wrote (``rllm dataset pull countdown``, an example's ``prepare_*_data.py``) is read here as it is,
and one written here is read by rLLM.

The layout (rLLM's): ``<dir>/registry.json`` (``{"version": 2, "datasets": {name: {"metadata":
{...}, "splits": {split: {"path": "<name>/<split>.parquet", "num_examples": n, "fields": [...]}}}}}``)
and one Parquet file per split (rLLM's ``.arrow`` files, for rows with image bytes, are read too).
``<dir>`` is, as in rLLM, ``$RLLM_HOME/datasets`` or ``~/.rllm/datasets``, read when the registry
is used; :meth:`DatasetRegistry.set_dataset_dir` points it elsewhere without the environment.

Differences, each on purpose: rLLM also writes a verl copy of each split (``<split>_verl.parquet``);
verl is not here, so it is not written and ``get_verl_data_path`` finds only one rLLM wrote.
rLLM migrates a version-1 registry of its own source tree; here a registry must be version 2
(rLLM rewrites any it reads). ``load_dataset(..., as_tasks=True)`` (rLLM's eval ``Task``) is refused.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from typing import Any

from rllm_torch.core.errors import ConfigError, DatasetFormatError

__all__ = ["Dataset", "DatasetRegistry"]

logger = logging.getLogger(__name__)


def _default_dir() -> str:
    """rLLM's default (``rllm/paths.py``): ``$RLLM_HOME/datasets``, else ``~/.rllm/datasets``."""
    return os.path.join(os.path.expanduser(os.environ.get("RLLM_HOME", "~/.rllm")), "datasets")


def _read_rows(path: str) -> list[dict[str, Any]]:
    """The rows of a Parquet or Arrow IPC file (pyarrow; rLLM reads with polars, the same values)."""
    import pyarrow.ipc
    import pyarrow.parquet

    if path.endswith(".arrow"):
        with pyarrow.OSFile(path, "rb") as source:
            return pyarrow.ipc.open_file(source).read_all().to_pylist()
    return pyarrow.parquet.read_table(path).to_pylist()


class Dataset:
    """A list of task rows (dicts) with a name and a split (rLLM's ``rllm.data.Dataset``); ``len``
    and indexing make it a ``torch.utils.data`` map-style dataset.

    Args:
        data: the rows.
        name, split: the registry's names of it (None for one made by hand).
    """

    def __init__(self, data: list[dict[str, Any]], name: str | None = None, split: str | None = None) -> None:
        self.data = data
        self.name = name
        self.split = split

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, idx: int) -> dict[str, Any]:
        return self.data[idx]

    def get_data(self) -> list[dict[str, Any]]:
        """The rows (the list itself, not a copy, as in rLLM)."""
        return self.data

    def repeat(self, n: int) -> Dataset:
        """Each row ``n`` times, the copies next to each other (``[a, a, b, b]`` for ``n=2``); each
        copy a shallow copy of the row.

        Raises:
            ValueError: ``n <= 0`` (rLLM's error).
        """
        if n <= 0:
            raise ValueError("Repeat count must be positive")
        return Dataset([row.copy() for row in self.data for _ in range(n)], name=self.name, split=self.split)

    def shuffle(self, seed: int | None = None) -> Dataset:
        """The rows in a random order: with ``seed``, ``random.Random(seed).shuffle`` of the
        indices (the order rLLM gives for that seed); without one, the global ``random``'s."""
        indices = list(range(len(self.data)))
        if seed is not None:
            random.Random(seed).shuffle(indices)
        else:
            random.shuffle(indices)
        return Dataset([self.data[i] for i in indices], name=self.name, split=self.split)

    def select(self, indices: list[int] | range) -> Dataset:
        """The rows at ``indices``, in that order; an index outside ``[0, len)`` is skipped (rLLM's)."""
        return Dataset([self.data[i] for i in indices if 0 <= i < len(self.data)], name=self.name, split=self.split)

    def get_data_path(self) -> str | None:
        """The absolute path of this split's file in the registry, or None (not registered)."""
        if self.name is None or self.split is None:
            return None
        info = DatasetRegistry.get_dataset_info(self.name) or {}
        split = info.get("splits", {}).get(self.split)
        return None if split is None else DatasetRegistry._resolve_path(split["path"])

    def get_verl_data_path(self) -> str | None:
        """The verl copy of this split (``<split>_verl.parquet``) when rLLM wrote one, else None."""
        path = self.get_data_path()
        if path is None:
            return None
        verl = DatasetRegistry._verl_path_for(path)
        return verl if os.path.exists(verl) else None

    @classmethod
    def load_data(cls, path: str) -> Dataset:
        """A dataset from a ``.json`` (a list of rows), ``.jsonl``, ``.csv``, ``.parquet`` or
        ``.arrow`` file, unnamed (rLLM's ``Dataset.load_data``).

        Raises:
            FileNotFoundError: no file at ``path``.
            ValueError: another extension (rLLM's message).
        """
        if not os.path.exists(path):
            raise FileNotFoundError(f"Dataset file not found at {path}")
        ext = os.path.splitext(path)[1].lower()
        if ext == ".json":
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        elif ext == ".jsonl":
            with open(path, encoding="utf-8") as f:
                data = [json.loads(line) for line in f]
        elif ext == ".csv":
            import pyarrow.csv

            data = pyarrow.csv.read_csv(path).to_pylist()
        elif ext in (".parquet", ".arrow"):
            data = _read_rows(path)
        else:
            raise ValueError(f"Unsupported file format: {ext}")
        return cls(data=data)


class DatasetRegistry:
    """Named dataset splits stored under a directory (rLLM's ``rllm.data.DatasetRegistry``; the
    module docstring gives the layout). Every method is a classmethod, as in rLLM."""

    _dataset_dir: str | None = None  # set_dataset_dir's; None: rLLM's default, read at each use

    @classmethod
    def set_dataset_dir(cls, path: str | os.PathLike | None) -> None:
        """Store and look up datasets under ``path`` from now on (None: rLLM's default again,
        ``$RLLM_HOME/datasets`` or ``~/.rllm/datasets``). rLLM has no such call; its registry
        moves with ``$RLLM_HOME``, which is read here too."""
        cls._dataset_dir = None if path is None else os.fspath(path)

    @classmethod
    def dataset_dir(cls) -> str:
        """The directory the registry is in now (absolute, ``~`` expanded)."""
        return os.path.abspath(os.path.expanduser(cls._dataset_dir or _default_dir()))

    @classmethod
    def _registry_file(cls) -> str:
        return os.path.join(cls.dataset_dir(), "registry.json")

    @classmethod
    def _resolve_path(cls, rel_path: str) -> str:
        return rel_path if os.path.isabs(rel_path) else os.path.join(cls.dataset_dir(), rel_path)

    @staticmethod
    def _verl_path_for(path: str) -> str:
        return (
            path[: -len(".arrow")] + "_verl.parquet"
            if path.endswith(".arrow")
            else path.replace(".parquet", "_verl.parquet")
        )

    @classmethod
    def _load_registry(cls) -> dict:
        """The registry (``{"version": 2, "datasets": {}}`` when there is none; rLLM logs a
        warning and starts a new one when the file is not JSON).

        Raises:
            DatasetFormatError: a registry of another version (rLLM's version 1: let rLLM migrate it).
        """
        path = cls._registry_file()
        if not os.path.exists(path):
            return {"version": 2, "datasets": {}}
        try:
            with open(path, encoding="utf-8") as f:
                registry = json.load(f)
        except json.JSONDecodeError:
            logger.warning("Invalid JSON in registry file %s. Creating a new registry.", path)
            return {"version": 2, "datasets": {}}
        if not isinstance(registry, dict) or registry.get("version") != 2:
            raise DatasetFormatError(
                f"{path} is not a version-2 rLLM dataset registry (rLLM's version 1 is migrated by rLLM: run any rLLM "
                "dataset command once), or point DatasetRegistry.set_dataset_dir at another directory."
            )
        return registry

    @classmethod
    def _save_registry(cls, registry: dict) -> None:
        os.makedirs(cls.dataset_dir(), exist_ok=True)
        with open(cls._registry_file(), "w", encoding="utf-8") as f:
            json.dump(registry, f, indent=2)

    @classmethod
    def register_dataset(
        cls,
        name: str,
        data: list[dict[str, Any]] | Any,
        split: str = "default",
        source: str = "",
        description: str = "",
        category: str = "",
    ) -> Dataset:
        """Write ``data`` as split ``split`` of dataset ``name`` (``<dir>/<name>/<split>.parquet``)
        and record it in the registry, replacing an earlier split of that name; a non-empty
        ``source`` / ``description`` / ``category`` is kept in the dataset's metadata.

        Args:
            data: a list of row dicts, or anything with ``to_pandas()`` or ``to_list()`` (a
                HuggingFace dataset).

        Returns:
            The rows as a :class:`Dataset` named ``name``, ``split``.

        Raises:
            ConfigError: ``name`` or ``split`` empty or with a path separator; a row that is not a dict.
            DatasetFormatError: rows Parquet cannot hold as one table (a column with mixed types).
        """
        import pyarrow
        import pyarrow.parquet

        for label, value in (("name", name), ("split", split)):
            if not isinstance(value, str) or not value or os.sep in value or value in (".", ".."):
                raise ConfigError(f"DatasetRegistry.register_dataset: {label}={value!r} must be a plain file name.")
        if hasattr(data, "to_list") and callable(data.to_list):
            rows = data.to_list()
        elif hasattr(data, "to_pandas") and callable(data.to_pandas):
            rows = data.to_pandas().to_dict("records")
        else:
            rows = list(data)
        if (bad := next((i for i, row in enumerate(rows) if not isinstance(row, dict)), None)) is not None:
            raise ConfigError(
                f"DatasetRegistry.register_dataset({name!r}): row {bad} is not a dict: {rows[bad]!r:.80}."
            )
        try:
            table = pyarrow.Table.from_pylist(rows)
        except (pyarrow.ArrowInvalid, pyarrow.ArrowTypeError) as exc:
            raise DatasetFormatError(f"DatasetRegistry.register_dataset({name!r}, split={split!r}): {exc}") from exc
        rel_path = os.path.join(name, f"{split}.parquet")
        os.makedirs(os.path.join(cls.dataset_dir(), name), exist_ok=True)
        pyarrow.parquet.write_table(table, cls._resolve_path(rel_path))
        registry = cls._load_registry()
        entry = registry.setdefault("datasets", {}).setdefault(name, {"metadata": {}, "splits": {}})
        for key, value in (("source", source), ("description", description), ("category", category)):
            if value:
                entry["metadata"][key] = value
        entry["splits"][split] = {"path": rel_path, "num_examples": len(rows), "fields": list(table.column_names)}
        cls._save_registry(registry)
        return Dataset(data=rows, name=name, split=split)

    @classmethod
    def load_dataset(cls, name: str, split: str = "default", *, as_tasks: bool = False) -> Dataset | None:
        """Split ``split`` of dataset ``name``, or None (with a logged warning, as rLLM) when the
        registry has no such dataset or split, or its file is gone.

        Raises:
            ConfigError: ``as_tasks=True`` (rLLM's eval ``Task`` objects are not mirrored; the rows are).
        """
        if as_tasks:
            raise ConfigError(
                "DatasetRegistry.load_dataset(as_tasks=True) wraps rows as rLLM's eval Task, which rllm_torch does not "
                "mirror; load the rows (as_tasks=False) and pass them to AgentTrainer."
            )
        info = cls.get_dataset_info(name)
        if info is None:
            logger.warning("Dataset '%s' not found in registry.", name)
            return None
        if split not in info.get("splits", {}):
            logger.warning("Split '%s' not found in dataset '%s'.", split, name)
            return None
        path = cls._resolve_path(info["splits"][split]["path"])
        if not os.path.exists(path):
            logger.warning("Dataset file not found: %s", path)
            return None
        return Dataset(data=_read_rows(path), name=name, split=split)

    @classmethod
    def get_dataset_names(cls) -> list[str]:
        """The registered datasets' names, in registration order."""
        return list(cls._load_registry().get("datasets", {}))

    @classmethod
    def get_dataset_splits(cls, name: str) -> list[str]:
        """Dataset ``name``'s splits, in registration order ([] when it is not registered)."""
        return list((cls.get_dataset_info(name) or {}).get("splits", {}))

    @classmethod
    def dataset_exists(cls, name: str, split: str | None = None) -> bool:
        """Whether dataset ``name`` (and, given one, its split ``split``) is registered."""
        info = cls.get_dataset_info(name)
        return info is not None and (split is None or split in info.get("splits", {}))

    @classmethod
    def get_dataset_info(cls, name: str) -> dict | None:
        """Dataset ``name``'s registry entry (``{"metadata": ..., "splits": ...}``), or None."""
        return cls._load_registry().get("datasets", {}).get(name)

    @classmethod
    def remove_dataset_split(cls, name: str, split: str) -> bool:
        """Remove one split (its file, a verl copy rLLM wrote, its entry; the dataset's entry and
        directory when it was the last). Returns False when it is not registered."""
        registry = cls._load_registry()
        datasets = registry.get("datasets", {})
        if split not in datasets.get(name, {}).get("splits", {}):
            logger.warning("Dataset '%s' split '%s' not found in registry.", name, split)
            return False
        cls._remove_files(datasets[name]["splits"].pop(split))
        if not datasets[name]["splits"]:
            del datasets[name]
            cls._remove_dir(name)
        cls._save_registry(registry)
        return True

    @classmethod
    def remove_dataset(cls, name: str) -> bool:
        """Remove every split of dataset ``name`` and its entry. Returns False when it is not registered."""
        registry = cls._load_registry()
        datasets = registry.get("datasets", {})
        if name not in datasets:
            logger.warning("Dataset '%s' not found in registry.", name)
            return False
        for info in datasets.pop(name).get("splits", {}).values():
            cls._remove_files(info)
        cls._remove_dir(name)
        cls._save_registry(registry)
        return True

    @classmethod
    def _remove_files(cls, split_info: dict) -> None:
        path = cls._resolve_path(split_info["path"])
        for file in (path, cls._verl_path_for(path)):
            if os.path.exists(file):
                os.remove(file)

    @classmethod
    def _remove_dir(cls, name: str) -> None:
        directory = os.path.join(cls.dataset_dir(), name)
        if os.path.isdir(os.path.join(directory, "images")):  # rLLM's older image folders
            shutil.rmtree(os.path.join(directory, "images"))
        if os.path.isdir(directory) and not os.listdir(directory):
            os.rmdir(directory)
