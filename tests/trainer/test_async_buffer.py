"""The async producer's batches started ahead, counted exactly for each configuration against the
closed form of the module's rules, and the step's ``async/*`` metrics against hand-counted ages.

The rules (:mod:`~rllm_torch.trainer.pipeline.async_rollouts`), with ``T`` the sync interval,
``b = floor(staleness_threshold)`` and ``v`` the newest published version: the buffer holds
``(b + 1) T`` batches (sampling ones included), so at most ``taken + (b + 1) T`` batches have
started; in wait mode batch ``i`` (1-based, trained at step ``i``) starts only when
``v >= (i - 1) // T - b``, i.e. at most ``(v + b + 1) T`` have started; drop mode has no such
gate; without partial rollouts one batch samples at a time."""

from __future__ import annotations

import asyncio
import itertools
import math

import pytest

from rllm_torch.rllm.types import Episode
from rllm_torch.trainer.pipeline.async_rollouts import AsyncTrainingConfig, RolloutProducer, StalenessTally
from rllm_torch.trainer.ranks import RunRanks

BATCHES = 14
CONFIGS = [
    (threshold, sync_every, stale_groups, partial)
    for threshold, sync_every, stale_groups, partial in itertools.product(
        (0, 1, 2.5), (1, 2, 3), ("wait", "drop"), (False, True)
    )
]


def expected_started(config: AsyncTrainingConfig, taken: int, version: int) -> int:
    """Batches started once the producer has done all it may (instant sampling)."""
    bound, every = math.floor(config.staleness_threshold), config.trigger_parameter_sync_step
    most = min(BATCHES, taken + (bound + 1) * every)
    if config.stale_groups == "wait":
        most = min(most, (version + bound + 1) * every)
    return most


async def settle() -> None:
    for _ in range(50):  # every task of the producer runs until it waits
        await asyncio.sleep(0)


@pytest.mark.parametrize("threshold, sync_every, stale_groups, partial", CONFIGS)
def test_the_producer_starts_exactly_the_batches_its_rules_allow(threshold, sync_every, stale_groups, partial):
    """The trainer takes a batch a step and publishes every ``T`` steps, as ``fit_streaming`` does;
    in drop mode it also takes two steps without publishing (a slow sync), where only the room
    of the buffer stops the producer."""
    config = AsyncTrainingConfig(
        enable=True,
        staleness_threshold=threshold,
        trigger_parameter_sync_step=sync_every,
        stale_groups=stale_groups,
        partial_rollout=partial,
    )

    async def scenario() -> list[tuple[str, int, int]]:
        started: list[int] = []

        async def generate(batch, step):
            started.append(batch)
            await asyncio.sleep(0)
            return [Episode(task_id=str(batch))]

        positions = iter(range(BATCHES))
        producer = RolloutProducer(config, generate, positions, start_step=0)
        producer.start()
        seen, taken, version = [], 0, 0
        try:
            await settle()
            seen.append(("start", len(started), expected_started(config, taken, version)))
            for step in range(1, 9):
                batch = await asyncio.wait_for(producer.get(step), 2.0)
                assert int(batch[0].task_id) == taken  # in order, none skipped
                taken += 1
                await settle()
                seen.append((f"took {step}", len(started), expected_started(config, taken, version)))
                if step % sync_every == 0:
                    version = step // sync_every
                    await producer.publish(version)
                    await settle()
                    seen.append((f"published {version}", len(started), expected_started(config, taken, version)))
        finally:
            await producer.stop()
        return seen

    seen = asyncio.run(scenario())
    assert [(when, got) for when, got, _ in seen] == [(when, want) for when, _, want in seen]


@pytest.mark.parametrize("threshold, sync_every, stale_groups, partial", CONFIGS)
def test_batches_sampling_at_once_are_one_without_partial_rollouts_else_the_buffer(
    threshold, sync_every, stale_groups, partial
):
    """Sampling that never finishes (an environment that waits): one batch in flight without
    partial rollouts; with them as many as the buffer and the staleness gate allow at version 0."""
    config = AsyncTrainingConfig(
        enable=True,
        staleness_threshold=threshold,
        trigger_parameter_sync_step=sync_every,
        stale_groups=stale_groups,
        partial_rollout=partial,
    )

    async def scenario() -> int:
        started, gate = [], asyncio.Event()

        async def generate(batch, step):
            started.append(batch)
            await gate.wait()
            return [Episode(task_id=str(batch))]

        positions = iter(range(BATCHES))
        producer = RolloutProducer(config, generate, positions, start_step=0)
        producer.start()
        await settle()
        in_flight = len(started)
        await producer.stop()
        return in_flight

    assert asyncio.run(scenario()) == (expected_started(config, 0, 0) if partial else 1)


def test_a_steps_async_metrics_are_its_groups_ages_by_hand():
    """Three taken batches at trainer version 5 with bound 2: groups sampled at versions 5, 4, 4, 3
    (kept: staleness 0, 1, 1, 2) and 2, 1 (dropped: 3 and 4 versions behind)."""
    tally = StalenessTally(bound=2)
    tally.keep([Episode(task_id="a", info={"policy_version": 5}), Episode(task_id="b", info={"policy_version": 4})], 5)
    tally.keep([Episode(task_id="c", info={"policy_version": 4}), Episode(task_id="d", info={"policy_version": 2})], 5)
    tally.keep(
        [
            Episode(task_id="e", info={"policy_version": 3}),
            Episode(task_id="e", info={"policy_version": 4}),  # a group's age is its oldest episode's
            Episode(task_id="f", info={"policy_version": 1}),
        ],
        5,
    )
    metrics = tally.metrics(RunRanks(), version=5, buffered=2)
    assert metrics == {
        "async/staleness/0": 1,
        "async/staleness/1": 2,
        "async/staleness/2": 1,
        "async/groups_dropped_stale": 2,
        "async/staleness_mean": 1.0,  # (0 + 1 + 1 + 2) / 4
        "async/staleness_max": 2,
        "async/buffer_batches": 2,
        "async/policy_version": 5,
    }
    tally.reset()
    assert tally.metrics(RunRanks(), version=6, buffered=0)["async/staleness_mean"] == 0.0  # no group: 0, not NaN
