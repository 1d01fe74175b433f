"""Where a training step's episodes come from: the one outer loop of
:class:`~rllm_torch.trainer.unified_trainer.UnifiedTrainer` takes its batches from a
:class:`SyncBatches` (each batch sampled when its step starts, with the policy as it is) or an
:class:`AsyncBatches` (sampled ahead by a producer on the sampler's own weights,
``rllm.async_training``). Both give the batches of the epochs in order from the resumed position
on (:func:`positioned_batches`), keep the run's position (``state.epoch``, ``state.batch_in_epoch``)
at the batches taken, and let a step draw more batches of its own epoch (dynamic sampling).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rllm_torch.rllm.types import Episode
from rllm_torch.trainer.pipeline.async_rollouts import AsyncTrainingConfig, RolloutProducer, StalenessTally
from rllm_torch.trainer.ranks import RunRanks
from rllm_torch.trainer.state import TrainerState

__all__ = ["PositionedBatch", "positioned_batches", "SyncBatches", "AsyncBatches"]


@dataclass
class PositionedBatch:
    """A batch of tasks and where it is in its epoch; ``episodes`` once sampled (async: ahead)."""

    epoch: int
    batch_in_epoch: int  # batches of the epoch done once this one is
    last_in_epoch: bool
    batch: Any
    episodes: list[Episode] | None = None


def positioned_batches(dataloader: Any, epochs: Iterator[int], start_epoch: int, start_batch: int) -> Iterator:
    """The epochs' batches as :class:`PositionedBatch`, from a resumed position on (the batches of
    ``start_epoch`` before ``start_batch`` are skipped; ``set_epoch`` is called on each epoch)."""
    for epoch in epochs:
        if hasattr(dataloader, "set_epoch"):
            dataloader.set_epoch(epoch)
        skip = start_batch if epoch == start_epoch else 0
        for index, batch in enumerate(itertools.islice(dataloader, skip, None), skip + 1):
            yield PositionedBatch(epoch, index, index == len(dataloader), batch)


class _Source:
    """What both sources share: the position kept in the state, and one batch put back."""

    def __init__(self) -> None:
        self._put_back: PositionedBatch | None = None

    def take(self, item: PositionedBatch, state: TrainerState) -> PositionedBatch:
        """``item`` is the step's: the run's position moves to it."""
        state.epoch, state.batch_in_epoch = item.epoch, item.batch_in_epoch
        return item

    async def _next(self, step: int) -> PositionedBatch | None:
        raise NotImplementedError

    async def next(self, step: int) -> PositionedBatch | None:
        """The first batch of step ``step`` (None: the data ran out)."""
        item, self._put_back = self._put_back, None
        return item if item is not None else await self._next(step)

    async def more(self, state: TrainerState) -> list[Episode] | None:
        """Another batch's episodes for the step in progress (dynamic sampling), from the step's
        own epoch only (None when it has no batch left: the next epoch's first is put back for the
        next step)."""
        item = await self.next(state.global_step)
        if item is None or item.epoch != state.epoch:
            self._put_back = item
            return None
        return await self.episodes(self.take(item, state), state)

    async def episodes(self, item: PositionedBatch, state: TrainerState) -> list[Episode]:
        raise NotImplementedError

    def step_metrics(self, state: TrainerState) -> dict[str, float]:
        """The source's metrics of the step that ended (none for the synchronous one)."""
        return {}

    async def after_step(self, state: TrainerState, last_step: bool) -> None:
        """After a step's validation and checkpoint (async: the weight sync, when due)."""

    async def start(self) -> None:
        """Before the first step."""

    async def stop(self) -> None:
        """After the last step (or a stop)."""


class SyncBatches(_Source):
    """Each batch is sampled when its step takes it, by ``backend.generate_episodes`` through
    ``engine`` with the policy as it is (the synchronous loop)."""

    def __init__(self, backend: Any, engine: Any, batches: Iterator[PositionedBatch]) -> None:
        super().__init__()
        self.backend, self.engine, self.batches = backend, engine, batches

    async def _next(self, step: int) -> PositionedBatch | None:
        return next(self.batches, None)

    async def episodes(self, item: PositionedBatch, state: TrainerState) -> list[Episode]:
        self.engine.set_training_step(state.global_step, mode="train", epoch=state.epoch)
        return await self.backend.generate_episodes(item.batch, agent_workflow_engine=self.engine, is_validation=False)


class AsyncBatches(_Source):
    """Batches a :class:`~rllm_torch.trainer.pipeline.async_rollouts.RolloutProducer` samples
    ahead through ``engine`` (which holds its own copy of the policy), within the staleness bound;
    every ``trigger_parameter_sync_step`` steps (:meth:`after_step`) the policy's weights are
    published to the sampler as the next policy version. A batch whose groups are all past the
    bound (drop mode) on every rank gives way to the next one.

    Its step metrics: ``async/staleness/<k>`` (groups of staleness ``k``), ``async/groups_dropped_stale``,
    ``async/staleness_mean`` and ``_max``, ``async/policy_version``, ``async/buffer_batches``
    (batches waiting when the step ended), over every rank, and ``time/weight_sync`` (the last
    sync's seconds, a cost of the step after it).
    """

    def __init__(
        self,
        backend: Any,
        engine: Any,
        batches: Iterator[PositionedBatch],
        config: AsyncTrainingConfig,
        ranks: RunRanks,
        *,
        start_step: int,
    ) -> None:
        super().__init__()
        self.backend, self.engine, self.config, self.ranks = backend, engine, config, ranks
        self.producer = RolloutProducer(config, self._generate, batches, start_step=start_step)
        self.tally = StalenessTally(config.bound)
        self.synced_s = 0.0  # the last weight sync's seconds: a cost of the step after it

    async def _generate(self, item: PositionedBatch, step: int) -> PositionedBatch:
        self.engine.set_training_step(step, mode="train", epoch=item.epoch)
        item.episodes = await self.backend.generate_episodes(
            item.batch, agent_workflow_engine=self.engine, is_validation=False
        )
        return item

    async def start(self) -> None:
        self.backend.publish_weights(self.producer.version)  # the sampler starts from the (resumed) policy
        self.producer.start()

    async def stop(self) -> None:
        await self.producer.stop()

    async def _next(self, step: int) -> PositionedBatch | None:
        return await self.producer.get(step)

    async def episodes(self, item: PositionedBatch, state: TrainerState) -> list[Episode]:
        kept = self.tally.keep(item.episodes, self.config.version_at(state.global_step))
        if self.ranks.any(bool(kept)) or self.ranks.any((later := await self._next(state.global_step)) is None):
            return kept
        return await self.episodes(self.take(later, state), state)

    def step_metrics(self, state: TrainerState) -> dict[str, float]:
        metrics = self.tally.metrics(self.ranks, self.config.version_at(state.global_step), self.producer.ready)
        metrics["time/weight_sync"], self.synced_s = self.synced_s, 0.0
        self.tally.reset()
        return metrics

    async def after_step(self, state: TrainerState, last_step: bool) -> None:
        every = self.config.trigger_parameter_sync_step
        if state.global_step % every == 0 and not last_step:
            start = time.perf_counter()
            version = state.global_step // every
            self.backend.publish_weights(version)
            await self.producer.publish(version)
            self.synced_s = time.perf_counter() - start
