"""``BackendProtocol``: what a training backend provides to the unified trainer.

The backend serves the model; the trainer's step (:mod:`~rllm_torch.trainer.step`) calls, per
batch: ``generate_episodes`` → (the trainer's transform and filters) → ``transform_to_backend_batch``
→ ``process_backend_batch`` (with ``trainer_state.needs``) → (the trainer's advantages, or the
backend's ``compute_advantages`` when it overrides it) → ``update_policy``; and the ``on_*`` hooks
around training, epochs, batches and validation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

from omegaconf import DictConfig

from rllm_torch.core.errors import ConfigError
from rllm_torch.rllm.config import AlgorithmConfig
from rllm_torch.trainer.pipeline.token_advantages import compute_token_advantages
from rllm_torch.trainer.ranks import RunRanks
from rllm_torch.trainer.schema import typed_run_config
from rllm_torch.trainer.state import TrainerState

__all__ = ["BackendProtocol"]


class BackendProtocol(ABC):
    """Abstract base of training backends (rLLM's ``BackendProtocol``).

    A subclass is built as ``backend_cls(config=config, ranks=ranks, **backend_args)``;
    ``self.config`` is the config typed by :func:`~rllm_torch.trainer.schema.typed_run_config`, its
    ``backend`` section by the backend's settings dataclass; ``backend.name`` selects a subclass
    registered with :func:`~rllm_torch.trainer.backend_registry.register_backend` (the class
    attribute ``name`` is rLLM's, not read here). The
    methods that touch the model are abstract; the hooks default to doing nothing, and
    :meth:`compute_advantages` defaults to the tensor estimators on a :class:`TokenBatch`.

    In a run of several processes (``ranks.world_size > 1``) the trainer calls every method on
    every rank, each with its own share of the batch; a backend must then keep its collectives
    in step across the ranks, also on a rank whose share of a step is empty.
    """

    name: str = "base"

    def __init__(self, config: DictConfig, ranks: RunRanks | None = None, **kwargs: Any) -> None:
        self.config = typed_run_config(config)
        self.ranks = ranks if ranks is not None else RunRanks()

    # ---- set-up ----------------------------------------------------------------------------
    @abstractmethod
    def init_rollout_engine(self, **kwargs: Any) -> Any:
        """Build and return the rollout engine the workflows sample from."""

    def validate_config(self) -> None:
        """Raise :class:`~rllm_torch.core.errors.ConfigError` for backend settings that cannot work."""

    def validate_prompts(self, tasks: list[dict]) -> None:
        """Raise :class:`~rllm_torch.core.errors.ConfigError` for task prompts the backend cannot
        serve (e.g. too long for the model's context); called at start-up with every training
        and validation task. The default: no check."""

    @abstractmethod
    def get_dataloader(self, dataset: Any, trainer_state: TrainerState) -> Iterable:
        """Batches of tasks from ``dataset`` (one pass = one epoch); must support ``len``.

        If the loader has ``set_epoch(epoch)``, the trainer calls it before each epoch. Resuming a
        run skips the batches already done in the epoch, so an epoch's order must depend only on
        the epoch (and the seed), never on how many passes this process has made."""

    # ---- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything the backend needs to continue training that is the same on every rank
        (model, optimizer, lr scheduler), as objects ``torch.save`` can write; rank 0's is saved.
        The default: nothing."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (called on every rank before training resumes)."""

    def sharded_state_dict(self) -> dict[str, Any] | None:
        """State that each rank holds a shard of (e.g. an FSDP model and optimizer), as a
        ``torch.distributed.checkpoint`` state dict: every rank writes its shards with ``dcp.save``
        and a resume loads into this structure with ``dcp.load``. The default: None (nothing sharded)."""
        return None

    def load_sharded_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`sharded_state_dict`'s structure, filled from a checkpoint."""

    def rank_state_dict(self) -> dict[str, Any]:
        """What differs from rank to rank (e.g. each rank's sampling generator); every rank's is
        saved. The default: nothing."""
        return {}

    def load_rank_state_dict(self, state: dict[str, Any]) -> None:
        """Restore this rank's :meth:`rank_state_dict`."""

    # ---- per batch -------------------------------------------------------------------------
    @abstractmethod
    async def generate_episodes(self, batch: Any, agent_workflow_engine: Any, is_validation: bool = False) -> list:
        """Run the workflows on a batch of tasks (``rollout.n`` or ``rollout.n_val`` times each)."""

    async def generate_baseline_episodes(self, batch: Any, agent_workflow_engine: Any) -> list:
        """One greedy rollout of each task of a training batch (temperature 0, the policy's
        argmax): ``remax``'s baselines, scored by the same workflows and never trained on.

        Raises:
            ConfigError: the default: this backend cannot sample greedy rollouts.
        """
        raise ConfigError(
            f"{type(self).__name__} cannot sample greedy baseline rollouts (generate_baseline_episodes), which "
            "rllm.algorithm.adv_estimator=remax needs: use another estimator, or the torch backend."
        )

    # ---- async training (rllm.async_training.enable) ------------------------------------------
    def init_async_rollout_engine(self) -> Any:
        """A second rollout engine that holds its own copy of the policy's weights (policy
        version 0), for sampling while the update runs; it takes new weights only through
        :meth:`publish_weights` and its ``sync_weights``.

        Raises:
            ConfigError: the default: this backend cannot train asynchronously.
        """
        raise ConfigError(
            f"{type(self).__name__} cannot sample while it trains (init_async_rollout_engine), which "
            "rllm.async_training.enable=true needs: set it to false, or use the torch backend."
        )

    def publish_weights(self, version: int) -> None:
        """Hand the policy's current weights to the async engine as policy ``version`` (called
        between steps, never during an update)."""
        raise ConfigError(f"{type(self).__name__} cannot publish weights to an async sampler.")

    @abstractmethod
    def transform_to_backend_batch(self, trainer_state: TrainerState) -> Any:
        """Turn ``trainer_state.trajectory_groups`` into the backend's batch."""

    async def process_backend_batch(self, trainer_state: TrainerState) -> None:
        """Compute what the update and the estimators need before the advantages: old log-probs,
        and what ``trainer_state.needs`` names (the run's estimators' and losses' declared inputs,
        e.g. ``sum_pi_squared``)."""

    async def compute_advantages(self, trainer_state: TrainerState, algorithm_config: AlgorithmConfig) -> None:
        """rLLM's hook. The trainer computes the advantages itself (the same function, with the
        run's plan resolved once) unless a backend overrides this; this default is what it
        computes: token-level advantages on ``trainer_state.backend_batch`` (a :class:`TokenBatch`),
        :func:`compute_token_advantages` over every rank of ``self.ranks``. Metrics go into
        ``trainer_state.metrics``."""
        plan = trainer_state.plan or algorithm_config  # the run's, bound once; a config outside a trainer
        trainer_state.metrics.update(
            compute_token_advantages(trainer_state.backend_batch, plan, process_group=self.ranks.estimator_group)
        )

    @abstractmethod
    async def update_policy(self, trainer_state: TrainerState) -> None:
        """Update the policy from ``trainer_state.backend_batch``; put metrics in the state."""

    def summary_rows(self) -> list[tuple[str, str]]:
        """Extra ``(name, value)`` rows of the start-up summary (e.g. the memory settings); none by default."""
        return []

    # ---- hooks -----------------------------------------------------------------------------
    async def on_train_start(self, trainer_state: TrainerState) -> None:
        """Before the first validation and batch."""

    async def on_train_end(self, trainer_state: TrainerState) -> None:
        """After the final validation and its checkpoint (e.g. export the final model). A run
        stopped during it calls it again on the next start, until :meth:`train_end_complete`."""

    def train_end_complete(self) -> bool:
        """Whether what :meth:`on_train_end` writes is there and whole (called when a run starts
        whose checkpoint holds every step: False runs ``on_train_end`` again); True by default."""
        return True

    async def on_epoch_start(self, trainer_state: TrainerState) -> None:
        """Before the first batch of an epoch."""

    async def on_epoch_end(self, trainer_state: TrainerState) -> None:
        """After the last batch of an epoch."""

    async def on_batch_start(self, trainer_state: TrainerState) -> None:
        """Before a batch's first stage."""

    async def on_batch_end(self, trainer_state: TrainerState) -> None:
        """After a batch's update, before it is logged (the trainer itself writes the checkpoints)."""

    async def on_validation_start(self, trainer_state: TrainerState) -> bool:
        """Before validation; return False to skip it."""
        return True

    async def on_validation_end(self, trainer_state: TrainerState) -> None:
        """After validation."""

    def shutdown(self) -> None:
        """Release resources."""
