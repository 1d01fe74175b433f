"""rLLM's ``AgentTrainer``: the entry rLLM's examples use, ``AgentTrainer(workflow_class=...,
workflow_args=..., config=config, train_dataset=..., val_dataset=..., backend=...).train()``,
on the torch backend. ``train()`` runs what ``rllm-torch-train`` runs (the same start-up checks,
run directory, checkpoints, SIGTERM handling), with the given workflow and datasets."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rllm_torch.cli.train_command import run
from rllm_torch.core.errors import ConfigError
from rllm_torch.rollouts.rllm_data import DatasetRegistry
from rllm_torch.rollouts.task import Task
from rllm_torch.trainer.rllm_settings import drop_rllm_backend_keys
from rllm_torch.trainer.schema import typed_run_config
from rllm_torch.trainer.workflow import PROMPT_KEYS

__all__ = ["AgentTrainer", "task_rows"]

_UNSUPPORTED = ("agent_flow", "evaluator", "hooks", "sandbox_backend", "sandbox_concurrency")


def task_rows(dataset: Any, which: str) -> list[dict]:
    """A dataset as a list of task dicts: a list (or any iterable) of dicts, or an object with
    ``get_data()`` (rLLM's ``Dataset``).

    Raises:
        ConfigError: something else, or a row that is not a dict with one of rLLM's prompt keys.
    """
    if dataset is None:
        return []
    rows = dataset.get_data() if hasattr(dataset, "get_data") else dataset
    if isinstance(rows, (str, bytes, dict)) or not isinstance(rows, Iterable):
        raise ConfigError(f"{which} must be a list of task dicts (or rLLM's Dataset), got {type(dataset).__name__}.")
    rows = list(rows)
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or not any(row.get(k) is not None for k in PROMPT_KEYS):
            raise ConfigError(
                f"{which}[{i}] must be a dict with one of {', '.join(PROMPT_KEYS)} (rLLM's task keys), got {row!r:.120}."
            )
    return rows


def _alphabet(*datasets: list[dict]) -> str:
    """Every character of the rows' prompts and answers: the tiny model's vocabulary."""
    chars = set()
    for rows in datasets:
        for row in rows:
            for key in (*PROMPT_KEYS, "answer", "ground_truth"):
                value = row.get(key)
                if isinstance(value, str):
                    chars |= set(value)
                elif isinstance(value, list):
                    chars |= {c for m in value if isinstance(m, dict) for c in str(m.get("content", ""))}
    return "".join(sorted(chars))


class AgentTrainer:
    """rLLM's ``AgentTrainer`` (``rllm.trainer.AgentTrainer``) on the torch backend.

    Args:
        config: the run config (rLLM's examples get it from ``@hydra.main``; here from
            ``rllm_torch.configs`` / the compatibility package's ``unified`` config).
        workflow_class: the :class:`~rllm_torch.trainer.workflow.Workflow` run on each task.
        train_dataset, val_dataset: lists of task dicts in rLLM's format (or rLLM ``Dataset``s).
        workflow_args: keyword arguments of the workflow.
        backend: ``"torch"`` (rLLM's ``verl``, ``tinker`` and ``fireworks`` are its own services).
        store: rLLM's cross-episode store, given to workflows that take one.

    A model built from scratch (no ``model.path``) gets every character of the datasets' prompts
    and answers as its vocabulary.

    Raises:
        ConfigError: another backend, rLLM's agent flows / sandbox hooks, no workflow class, a key
            of rLLM's backends given to a ported script (naming the key here that does the same),
            datasets that are not task dicts, or no training rows (rLLM's ``load_dataset`` gives
            None for a dataset its registry lacks) unless ``rllm.trainer.val_only``.
    """

    def __init__(
        self,
        config: DictConfig,
        workflow_class: type | None = None,
        train_dataset: Any = None,
        val_dataset: Any = None,
        workflow_args: dict | None = None,
        backend: str = "torch",
        store: Any = None,
        **kwargs: Any,
    ) -> None:
        if backend != "torch":
            raise ConfigError(
                f"AgentTrainer(backend={backend!r}): rllm_torch trains on its own torch backend; rLLM's verl, tinker "
                "and fireworks backends are services of rLLM. Pass backend='torch'."
            )
        if given := sorted(k for k in _UNSUPPORTED if kwargs.get(k) is not None):
            raise ConfigError(
                f"AgentTrainer({given[0]}=...): rLLM's agent flows, gateway and sandbox hooks are not part of rllm_torch; "
                "write the agent as a Workflow (workflow_class=...)."
            )
        if unknown := sorted(set(kwargs) - set(_UNSUPPORTED)):
            raise ConfigError(f"AgentTrainer got unknown keyword argument(s) {unknown}.")
        if workflow_class is None:
            raise ConfigError("AgentTrainer needs workflow_class (a Workflow subclass).")
        if isinstance(
            config, DictConfig
        ):  # a ported @hydra.main script's: rLLM's backend keys named, their places gone
            drop_rllm_backend_keys(config)
        self.config = typed_run_config(config)
        train, val = task_rows(train_dataset, "train_dataset"), task_rows(val_dataset, "val_dataset")
        if not train and not self.config.rllm.trainer.val_only:
            raise ConfigError(
                f"AgentTrainer(train_dataset={train_dataset!r:.40}): no training rows. rLLM's DatasetRegistry.load_dataset "
                f"gives None for a split its registry ({DatasetRegistry.dataset_dir()}) lacks: register it there (e.g. "
                "examples/rllm_countdown/prepare_countdown_data.py), or point $RLLM_HOME / DatasetRegistry.set_dataset_dir "
                "at the registry that has it."
            )
        sources = sorted({str(row.get("data_source")) for row in train if row.get("data_source") is not None})
        name = sources[0] if len(sources) == 1 else getattr(workflow_class, "__name__", "workflow")
        OmegaConf.update(self.config, "task.name", name)  # the summary's and the default run directory's name
        args = dict(workflow_args or {})
        if store is not None:
            args["store"] = store
        self.task = Task(
            name=name,
            train=train,
            val=val,
            reward_fn=None,
            alphabet=_alphabet(train, val),
            workflow=workflow_class,
            workflow_args=args,
        )
        self.trainer = None

    def train(self) -> None:
        """Train (as ``rllm-torch-train`` does, with this workflow and these datasets)."""
        self.trainer = run(self.config, task=self.task)
