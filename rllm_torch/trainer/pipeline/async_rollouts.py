"""Async training's rollout side (rLLM's ``rllm.async_training``): a producer that samples the
coming steps' batches with the weights its sampler holds while the trainer updates, a bounded
buffer between them, policy versions, and the staleness bound.

**Versions.** The trainer publishes its weights to the sampler after every
``trigger_parameter_sync_step`` (``T``) steps: version ``k`` is the policy after step ``k * T``,
and during step ``s`` (1-based) the trainer is at version ``(s - 1) // T``
(:meth:`AsyncTrainingConfig.version_at`). Every completion records the version that sampled it
(:data:`~rllm_torch.trainer.workflow.SAMPLED_VERSIONS`); an episode's version is its oldest
turn's (they differ only with ``partial_rollout``, when a sync reaches episodes in flight), a
group's is the oldest of its episodes, and a group trained at step ``s`` has staleness
``(s - 1) // T - version``. No group is trained with a staleness above ``staleness_threshold``.

**Wait or drop** (``stale_groups``). ``wait``: the producer starts a batch only when the version
it would be sampled with is within the bound of the step that will train it (its *label*: the
step after the previous batch's, or the step that is waiting for it, whichever is earlier; a
step takes at least one batch, so a batch is never trained later than its label), so nothing is
dropped. ``drop``: the producer runs ahead as far as the buffer holds, and groups past the bound
are dropped when they are taken (counted in ``async/groups_dropped_stale``).

The buffer holds ``(floor(staleness_threshold) + 1) * T`` batches (verl's fully-async queue:
required samples x (staleness + 1) x sync interval). With ``staleness_threshold=0`` and ``T=1``
the producer samples step ``s``'s batch only after step ``s - 1`` (its validation and
checkpoint included) published its weights: the synchronous run, draw for draw.
"""

from __future__ import annotations

import asyncio
import math
import warnings
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rllm_torch.core.errors import ConfigError
from rllm_torch.rllm.types import Episode
from rllm_torch.trainer.schema import AsyncTrainingSection

__all__ = [
    "AsyncTrainingConfig",
    "check_rllm_async_keys",
    "RolloutProducer",
    "StalenessTally",
    "drop_stale_groups",
    "staleness_counts",
]


@dataclass
class AsyncTrainingConfig(AsyncTrainingSection):
    """``rllm.async_training``: the schema's section (its settings, defaults and meaning:
    :class:`~rllm_torch.trainer.schema.AsyncTrainingSection`) with the rules read from it.
    As in rLLM (``rllm/trainer/algorithms/config.py``), a ``fwd_bwd_group_size`` of None becomes
    ``mini_batch_size`` (when that is set; None here means ``data.train_batch_size``)."""

    def __post_init__(self) -> None:
        if self.fwd_bwd_group_size is None and self.mini_batch_size is not None:
            self.fwd_bwd_group_size = self.mini_batch_size

    @classmethod
    def from_config(cls, config: DictConfig) -> AsyncTrainingConfig:
        """From a run config (:func:`~rllm_torch.trainer.schema.typed_run_config`)."""
        return cls(**OmegaConf.to_container(config.rllm.async_training, resolve=True))

    def version_at(self, step: int) -> int:
        """The trainer's policy version during step ``step`` (1-based): the syncs made before it."""
        return (step - 1) // self.trigger_parameter_sync_step

    @property
    def bound(self) -> int:
        """The largest staleness a trained group may have (versions are whole numbers)."""
        return math.floor(self.staleness_threshold)

    @property
    def capacity(self) -> int:
        """Batches the buffer holds."""
        return (self.bound + 1) * self.trigger_parameter_sync_step


#: rLLM's task batches per async training step (``async_training.mini_batch_size`` in its ``base.yaml``).
RLLM_ASYNC_MINI_BATCH_SIZE = 64


def check_rllm_async_keys(section: Any, batch: int) -> None:
    """rLLM's ``rllm.async_training`` keys that change nothing here when left at their defaults
    (``rllm/trainer/unified_trainer.py`` and ``rllm/trainer/buffer.py`` read them).

    Args:
        section: the run config's ``rllm.async_training`` (async mode on).
        batch: the prompts (task batches) of a training step (``prompts_per_step``).

    Warns:
        UserWarning: ``episode_offload_dir`` / ``trajectory_group_offload_dir`` set: rLLM pickles the
            buffer's waiting episodes / groups there; here they stay in memory (the same numbers).
            ``mini_batch_size`` null with ``data.train_batch_size`` other than rLLM's 64: rLLM's
            async step takes its ``base.yaml``'s 64 task batches (its ``data.train_batch_size``
            forced to 1); here the step takes ``data.train_batch_size`` prompts.

    Raises:
        ConfigError: ``fwd_bwd_group_size`` other than None or ``batch``: rLLM's tinker and fireworks
            backends then run ``batch / fwd_bwd_group_size`` forward-backward passes a step, each
            aggregating its own loss; here a step is one pass over its batch.
    """
    size = section.fwd_bwd_group_size
    if size is not None and size != batch:
        raise ConfigError(
            f"rllm.async_training.fwd_bwd_group_size={size}: rLLM's backends split a step's {batch} task batches into "
            f"forward-backward passes of {size}, each aggregating its own loss; here a step's loss is one pass over "
            f"its batch (backend.micro_batch_tokens bounds the memory): set it to null or {batch}."
        )
    if section.mini_batch_size is None and batch != RLLM_ASYNC_MINI_BATCH_SIZE:
        warnings.warn(
            f"rllm.async_training.mini_batch_size is null: an async step here takes data.train_batch_size={batch} "
            f"prompts; rLLM's takes {RLLM_ASYNC_MINI_BATCH_SIZE} (its base.yaml's mini_batch_size; it sets "
            f"data.train_batch_size to 1 in async mode). Set rllm.async_training.mini_batch_size={batch} to keep "
            f"these steps, or {RLLM_ASYNC_MINI_BATCH_SIZE} for rLLM's.",
            UserWarning,
            stacklevel=2,
        )
    for name in ("episode_offload_dir", "trajectory_group_offload_dir"):
        if section[name]:
            warnings.warn(
                f"rllm.async_training.{name}={section[name]!r}: rLLM's disk offload of the async buffer is not "
                "implemented here; the buffer stays in memory (the trained numbers are the same). Drop the key.",
                UserWarning,
                stacklevel=2,
            )


def drop_stale_groups(episodes: list[Episode], version_now: int, bound: int) -> tuple[list[Episode], list[int], int]:
    """The episodes of the groups (tasks) whose staleness ``version_now - oldest version`` is at
    most ``bound``.

    An episode without a version (one that failed before sampling) takes its group's.

    Returns:
        ``(kept episodes, the kept groups' staleness (one int per group), dropped groups)``.
    """
    oldest: dict[Any, int] = {}
    for episode in episodes:
        version = episode.info.get("policy_version")
        if version is not None:
            oldest[episode.task_id] = min(version, oldest.get(episode.task_id, version))
    staleness = {task_id: version_now - version for task_id, version in oldest.items()}
    kept = [e for e in episodes if staleness.get(e.task_id, 0) <= bound]
    groups = {e.task_id for e in episodes}
    kept_groups = [task_id for task_id in dict.fromkeys(e.task_id for e in kept)]
    return kept, [staleness.get(task_id, 0) for task_id in kept_groups], len(groups) - len(kept_groups)


def staleness_counts(staleness: list[int], bound: int) -> list[float]:
    """Groups per staleness ``0..bound`` (the histogram a step logs)."""
    counts = [0.0] * (bound + 1)
    for value in staleness:
        counts[value] += 1
    return counts


class StalenessTally:
    """One step's staleness: the groups :meth:`keep` let through (by staleness) and dropped."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.reset()

    def reset(self) -> None:
        self.staleness: list[int] = []
        self.dropped = 0

    def keep(self, episodes: list[Episode], version_now: int) -> list[Episode]:
        """:func:`drop_stale_groups` at the trainer's ``version_now``, tallied."""
        kept, staleness, dropped = drop_stale_groups(episodes, version_now, self.bound)
        self.staleness += staleness
        self.dropped += dropped
        return kept

    def metrics(self, ranks: Any, version: int, buffered: int) -> dict[str, float]:
        """The step's ``async/*`` metrics over every rank of ``ranks`` (a
        :class:`~rllm_torch.trainer.ranks.RunRanks`; two collectives on several ranks)."""
        *counts, dropped, total = ranks.reduce(
            [*staleness_counts(self.staleness, self.bound), self.dropped, sum(self.staleness)]
        )
        oldest, buffered = ranks.reduce([max(self.staleness, default=0), buffered], "max")
        return {
            **{f"async/staleness/{k}": count for k, count in enumerate(counts)},
            "async/groups_dropped_stale": dropped,
            "async/staleness_mean": total / max(sum(counts), 1),
            "async/staleness_max": oldest,
            "async/buffer_batches": buffered,
            "async/policy_version": version,
        }


class RolloutProducer:
    """Samples the batches of ``batches`` in order, ahead of the trainer, into a bounded buffer
    (what ``generate`` returns for each, in the order the batches started).

    A batch starts when the staleness rule lets it (:meth:`_may_start`) and the buffer has room
    for it (batches sampling count against it). With ``partial_rollout`` several batches sample at
    once (their episodes take new weights mid-flight anyway, each turn recording its version),
    so environment waits of consecutive batches overlap; without it one batch samples at a time,
    so a sync reaches the sampler only between batches. Batches reach the buffer in the order
    they started.

    Args:
        config: the async settings.
        generate: ``generate(batch, step)`` → the sampled batch (its episodes sampled by the async
            sampler; ``step``: the batch's label, for the episode log).
        batches: the batches to sample, from the resumed position on.
        start_step: the steps done before this producer starts.

    A failure while sampling (e.g. a ``WorkflowError``) is raised by :meth:`get`.
    """

    def __init__(
        self,
        config: AsyncTrainingConfig,
        generate: Callable[[Any, int], Awaitable[Any]],
        batches: Iterator[Any],
        *,
        start_step: int,
    ) -> None:
        self.config, self.generate, self.batches = config, generate, batches
        self.buffer: asyncio.Queue[Any] = asyncio.Queue()
        self.version = config.version_at(start_step + 1)  # the newest published
        self.next_label = start_step + 1
        self.sampling = 0  # batches started and not yet in the buffer
        self.ready = 0  # batches in the buffer (not its end-of-data marker)
        self.max_sampling = config.capacity if config.partial_rollout else 1
        self._changed = asyncio.Condition()
        self._started: asyncio.Queue = asyncio.Queue()  # sampling tasks, in start order
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        self._tasks = [asyncio.ensure_future(self._run()), asyncio.ensure_future(self._deliver())]

    async def stop(self) -> None:
        """Cancel sampling (the batches in flight and in the buffer are not trained)."""
        while not self._started.empty():
            if (started := self._started.get_nowait()) is not None:
                started.cancel()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def publish(self, version: int) -> None:
        """The trainer's weights of ``version`` were staged in the sampler."""
        async with self._changed:
            self.version = version
            self._changed.notify_all()

    async def get(self, step: int) -> Any:
        """The next batch, for step ``step`` (None: the data ran out). When none is sampling or
        waiting, the next to start is labelled ``step`` at the latest (the trainer waits for it)."""
        run, deliver = self._tasks
        while self.buffer.empty():
            for task in self._tasks:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    task.result()  # the producer's error
            if deliver.done():  # every batch was delivered and taken
                return None
            if self.sampling == 0:
                async with self._changed:
                    self.next_label = min(self.next_label, step)
                    self._changed.notify_all()
            getter = asyncio.ensure_future(self.buffer.get())
            await asyncio.wait({getter, *(t for t in self._tasks if not t.done())}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                return await self._taken(getter.result())
            getter.cancel()
        return await self._taken(self.buffer.get_nowait())  # a batch, or None (the data ran out)

    async def _taken(self, item: Any) -> Any:
        """``item`` left the buffer: its room may start the next batch (drop mode's only gate)."""
        async with self._changed:
            self.ready -= item is not None
            self._changed.notify_all()
        return item

    def _may_start(self) -> bool:
        if self.sampling >= self.max_sampling or self.sampling + self.ready >= self.config.capacity:
            return False
        needed = self.config.version_at(self.next_label) - self.config.bound
        return self.config.stale_groups == "drop" or self.version >= needed

    async def _run(self) -> None:
        for batch in self.batches:
            async with self._changed:
                await self._changed.wait_for(self._may_start)
                label, self.next_label = self.next_label, self.next_label + 1
                self.sampling += 1
            await self._started.put(asyncio.ensure_future(self.generate(batch, label)))
        await self._started.put(None)

    async def _deliver(self) -> None:
        """Move each sampled batch into the buffer, in the order the batches started."""
        while (task := await self._started.get()) is not None:
            sampled = await task
            async with self._changed:
                self.buffer.put_nowait(sampled)
                self.sampling -= 1
                self.ready += 1
                self._changed.notify_all()
        self.buffer.put_nowait(None)
