"""Async training's loop (``rllm.async_training.enable=true``): :func:`fit_streaming` trains the
steps of a :class:`~rllm_torch.trainer.unified_trainer.UnifiedTrainer` run from batches that a
:class:`~rllm_torch.trainer.pipeline.async_rollouts.RolloutProducer` samples ahead, with the
trainer's own stages for everything else (its step, its end of step, its stop requests).

The update runs in a thread of its own, so the event loop keeps sampling, and waiting on
environments, meanwhile: the producer's sampling never touches the policy being trained (the
sampler holds a copy) and never calls a collective, so on several ranks every collective of a
step still comes from one place, in one order."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

from rllm_torch.rllm.types import Episode
from rllm_torch.trainer.logs.summary import StepPlan
from rllm_torch.trainer.pipeline.async_rollouts import RolloutBatch, RolloutProducer, StalenessTally
from rllm_torch.trainer.state import TrainerState

__all__ = ["fit_streaming"]


def positioned_batches(
    dataloader: Any, epochs: Iterator[int], start_epoch: int, start_batch: int
) -> Iterator[tuple[int, int, bool, Any]]:
    """``(epoch, batches of the epoch done once this one is, last of its epoch, batch)`` from a
    resumed position on: the epochs' batches in the order the synchronous loop takes them."""
    for epoch in epochs:
        if hasattr(dataloader, "set_epoch"):
            dataloader.set_epoch(epoch)
        skip = start_batch if epoch == start_epoch else 0
        for index, batch in enumerate(itertools.islice(dataloader, skip, None), skip + 1):
            yield epoch, index, index == len(dataloader), batch


async def fit_streaming(trainer: Any, state: TrainerState, dataloader: Any, plan: StepPlan) -> None:
    """Train ``trainer``'s remaining steps from a producer that samples the coming steps' batches
    with the sampler's own weights while this loop trains; every ``trigger_parameter_sync_step``
    steps, after the step's validation and checkpoint, the policy's weights are published to the
    sampler as the next policy version (so at staleness 0 with a sync every step the producer
    samples exactly when the synchronous loop does).

    Each step logs ``async/staleness/<k>`` (its groups of staleness ``k``, ``k`` up to the bound),
    ``async/groups_dropped_stale``, ``async/staleness_mean`` and ``_max``, ``async/policy_version``
    and ``async/buffer_batches`` (batches waiting when the step ended), over every rank. Batches
    sampled but not trained when the run stops are sampled again by a resumed run (from the
    checkpoint's weights and position): no batch is trained twice or skipped.

    Args:
        trainer: the :class:`~rllm_torch.trainer.unified_trainer.UnifiedTrainer`.
        state, dataloader, plan: the run's state (resumed or new), its training batches and steps.
    """
    cfg, engine, ranks = trainer.async_config, trainer.async_workflow_engine, trainer.ranks

    async def generate(batch: Any, step: int, epoch: int) -> list[Episode]:
        engine.set_training_step(step, mode="train", epoch=epoch)
        return await trainer.backend.generate_episodes(batch, agent_workflow_engine=engine, is_validation=False)

    batches = positioned_batches(dataloader, trainer.epochs(state, plan), state.epoch, state.batch_in_epoch)
    producer = RolloutProducer(cfg, generate, batches, start_step=state.global_step)
    trainer.backend.publish_weights(producer.version)  # the sampler starts from the (resumed) policy
    taken: list[RolloutBatch] = []
    tally = StalenessTally(cfg.bound)

    async def take(item: RolloutBatch, state: TrainerState) -> list[Episode]:
        """A buffered batch's groups within the bound; a batch left with none on every rank: the next one."""
        taken.append(item)
        state.epoch, state.batch_in_epoch = item.epoch, item.batch_in_epoch
        kept = tally.keep(item.episodes, cfg.version_at(state.global_step))
        if ranks.any(bool(kept)) or ranks.any((later := await producer.get(state.global_step)) is None):
            return kept
        return await take(later, state)

    producer.start()
    synced_s = 0.0  # the last weight sync's seconds: a cost of the step after it
    try:
        while state.global_step < plan.total_steps:
            trainer.stop_if_asked(state)
            start = time.perf_counter()
            item = await producer.get(state.global_step + 1)
            waited = time.perf_counter() - start
            if ranks.any(item is None):  # the data ran out (on some rank: every rank stops)
                break
            if not taken or item.epoch != taken[-1].epoch:
                await trainer.backend.on_epoch_start(state)
            state.reset_batch()
            state.global_step += 1
            taken.clear()
            tally.reset()
            await trainer.backend.on_batch_start(state)
            await trainer.train_batch(item, state, lambda: producer.get(state.global_step), take)
            state.metrics |= tally.metrics(ranks, cfg.version_at(state.global_step), producer.ready)
            # the step's time as the synchronous loop's: waiting for its batch is its generate stage
            state.metrics["time/generate"] = state.metrics.get("time/generate", 0.0) + waited
            state.metrics["time/weight_sync"] = synced_s
            state.metrics["time/step"] = time.perf_counter() - start + synced_s
            await trainer.end_step(state)
            if taken[-1].last_in_epoch and state.global_step < plan.total_steps:
                await trainer.backend.on_epoch_end(state)
                state.epoch, state.batch_in_epoch = taken[-1].epoch + 1, 0
            synced_s = 0.0
            if state.global_step % cfg.trigger_parameter_sync_step == 0 and state.global_step < plan.total_steps:
                synced = time.perf_counter()
                version = state.global_step // cfg.trigger_parameter_sync_step
                trainer.backend.publish_weights(version)
                await producer.publish(version)
                synced_s = time.perf_counter() - synced
    finally:
        await producer.stop()
