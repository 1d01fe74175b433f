"""Async training (``rllm.async_training``): at staleness 0 with a weight sync every step it is the
synchronous run, metric for metric and weight for weight; with a bound above 0 the sampler runs
ahead, and no group is ever trained past the bound (counted from the versions the episodes
recorded, not from the trainer's own metrics); partial rollouts record each turn's version; the
producer's gating never waits for a step that waits for it; settings async mode cannot honour
stop the run at start-up naming the setting."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tiny_runs import TINY_STEPS
from trainer_fakes import make_config

from rllm_torch.backends.torch_backend.backend import TorchBackend
from rllm_torch.cli.train_command import run
from rllm_torch.core.errors import ConfigError
from rllm_torch.rllm.types import Episode
from rllm_torch.trainer.config_checks import check_run_config
from rllm_torch.trainer.pipeline.async_rollouts import (
    AsyncTrainingConfig,
    RolloutProducer,
    drop_stale_groups,
    staleness_counts,
)
from rllm_torch.trainer.workflow import SAMPLED_VERSIONS

TINY = (*TINY_STEPS, "rllm.trainer.total_batches=4", "backend.num_threads=1")


def _rows(run_dir: Path, *, drop_prefixes=("time/", "async/")) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(drop_prefixes)} for r in rows]


@pytest.mark.parametrize(
    "task",
    [
        ("task.val_size=4", "rllm.trainer.test_freq=2", "rllm.rollout.n_val=2"),  # validation between steps
        ("task.name=chain", "task.turns=2", "rllm.rollout.max_new_tokens=2"),
        ("task.train_size=1024", "rllm.algorithm.filter_groups.enable=true"),  # a step draws more batches
    ],
    ids=["arithmetic_with_validation", "chain_multi_turn", "dynamic_sampling"],
)
def test_staleness_0_with_a_sync_every_step_is_the_synchronous_run(tmp_path, task):
    sync, streamed = tmp_path / "sync", tmp_path / "async"
    run(make_config(sync, *TINY, *task))
    run(make_config(streamed, *TINY, *task, "rllm.async_training.enable=true"))
    assert _rows(streamed) == _rows(sync)
    async_rows = [r for r in _rows(streamed, drop_prefixes=("time/",)) if "actor/loss" in r]
    assert async_rows and all(r["async/staleness_max"] == 0 for r in async_rows)
    assert [r["async/policy_version"] for r in async_rows] == [r["step"] - 1 for r in async_rows]
    weights = [(d / "checkpoints" / "final" / "model.safetensors").read_bytes() for d in (sync, streamed)]
    assert weights[0] == weights[1]


class SlowTorchBackend(TorchBackend):
    """The torch backend whose update takes 50 ms longer (a slow consumer), and which records,
    for every step, the policy version each trained episode was sampled with."""

    trained: list[tuple[int, list[tuple[str, int]]]] = []

    async def update_policy(self, trainer_state):
        episodes = [(e.task_id, e.info["policy_version"]) for e in trainer_state.episodes]
        SlowTorchBackend.trained.append((trainer_state.global_step, episodes))
        time.sleep(0.05)
        await super().update_policy(trainer_state)


@pytest.mark.parametrize(
    "threshold, sync_every, stale_groups",
    [(1, 1, "wait"), (2, 1, "wait"), (1, 2, "wait"), (1, 1, "drop"), (0, 1, "drop")],
)
def test_no_group_is_trained_beyond_the_staleness_bound(tmp_path, monkeypatch, threshold, sync_every, stale_groups):
    from rllm_torch.cli import train_command

    monkeypatch.setattr(train_command, "backend_class", lambda name: SlowTorchBackend)
    SlowTorchBackend.trained = []
    overrides = (
        *TINY_STEPS,
        "rllm.trainer.total_batches=8",
        "task.train_size=64",
        "rllm.async_training.enable=true",
        f"rllm.async_training.staleness_threshold={threshold}",
        f"rllm.async_training.trigger_parameter_sync_step={sync_every}",
        f"rllm.async_training.stale_groups={stale_groups}",
    )
    run(make_config(tmp_path, *overrides))
    # each trained group's staleness, from the versions its episodes recorded when sampled
    ages: dict[int, list[int]] = {}
    for step, episodes in SlowTorchBackend.trained:
        oldest: dict[str, int] = {}
        for task_id, version in episodes:
            oldest[task_id] = min(version, oldest.get(task_id, version))
        ages[step] = [(step - 1) // sync_every - v for v in oldest.values()]
    every = [age for step_ages in ages.values() for age in step_ages]
    assert every and max(every) <= threshold
    assert max(every) == threshold  # the sampler did run ahead as far as the bound lets it
    rows = {r["step"]: r for r in _rows(tmp_path, drop_prefixes=("time/",)) if "async/staleness_max" in r}
    for step, step_ages in ages.items():  # the logged histogram is the groups' real staleness
        assert [rows[step][f"async/staleness/{k}"] for k in range(threshold + 1)] == staleness_counts(
            step_ages, threshold
        )
        assert rows[step]["async/staleness_mean"] == pytest.approx(sum(step_ages) / len(step_ages))
        assert rows[step]["async/staleness_max"] == max(step_ages)
        # batches waiting at the step's end: never more than the buffer holds, nor (wait mode) than
        # the staleness gate let start at the step's version (step - 1) // T
        gate = ((step - 1) // sync_every + threshold + 1) * sync_every - step
        room = (threshold + 1) * sync_every
        assert 0 <= rows[step]["async/buffer_batches"] <= (min(room, gate) if stale_groups == "wait" else room)
    if stale_groups == "wait":
        assert all(r["async/groups_dropped_stale"] == 0 for r in rows.values())


def test_stale_groups_reach_the_rollout_correction_with_the_samplers_log_probs(tmp_path, monkeypatch):
    """Decoupled PPO: the sampler's log-probs are the behaviour policy's. A group one version stale
    was sampled before the last update, so pi_old (recomputed) differs from them and the weights
    pi_old / pi_sampler are not 1; at staleness 0 they are 1 to float32 rounding."""
    from rllm_torch.cli import train_command

    monkeypatch.setattr(train_command, "backend_class", lambda name: SlowTorchBackend)
    correction = (
        "rllm.algorithm.rollout_correction.tis_mode=token_mask",
        "rllm.algorithm.rollout_correction.tis_cap=5",
    )
    diffs = {}
    for threshold in (0, 1):
        run_dir = tmp_path / str(threshold)
        overrides = (*TINY, "task.train_size=64", "rllm.async_training.enable=true", *correction)
        run(make_config(run_dir, *overrides, f"rllm.async_training.staleness_threshold={threshold}"))
        rows = [r for r in _rows(run_dir, drop_prefixes=("time/",)) if "actor/loss" in r]
        diffs[threshold] = [(r["async/staleness_max"], r["actor/rollout_logprob_abs_diff"]) for r in rows]
        assert all(0 < r["rollout_corr/ess"] <= 1 for r in rows)
    assert all(diff < 1e-6 for _, diff in diffs[0])
    stale = [diff for staleness, diff in diffs[1] if staleness == 1]
    assert stale and all(diff > 1e-4 for diff in stale)


def _episode(task_id: str, version: int | None) -> Episode:
    return Episode(task_id=task_id, info={} if version is None else {"policy_version": version})


def test_drop_stale_groups_keeps_whole_groups_within_the_bound_by_their_oldest_episode():
    episodes = [_episode("a", 3), _episode("a", 2), _episode("b", 3), _episode("c", 1), _episode("c", None)]
    kept, ages, dropped = drop_stale_groups(episodes, version_now=4, bound=2)
    assert [e.task_id for e in kept] == ["a", "a", "b"]  # c's oldest is 3 versions behind
    assert ages == [2, 1] and dropped == 1
    assert staleness_counts(ages, 2) == [0.0, 1.0, 1.0]
    kept, ages, dropped = drop_stale_groups(episodes, version_now=3, bound=2)
    assert len(kept) == 5 and ages == [1, 0, 2] and dropped == 0


def test_the_producer_never_waits_for_a_step_that_waits_for_it():
    """Wait mode at staleness 0: a batch is sampled only once the trainer published the version
    of the step that will train it; when a step draws a second batch (dynamic sampling), the
    producer samples it at once for that step instead of waiting for the next version."""

    async def scenario() -> list[tuple[str, int, int]]:
        log = []
        producer = None

        async def generate(batch, step):
            log.append(("sampled", batch, producer.version))
            return [_episode(str(batch), producer.version)]

        batches = iter(range(6))
        producer = RolloutProducer(AsyncTrainingConfig(enable=True), generate, batches, start_step=0)
        producer.start()
        first = await producer.get(1)
        await asyncio.sleep(0.01)
        assert [entry[1] for entry in log] == [0]  # batch 1 waits for version 1
        second = await asyncio.wait_for(producer.get(1), 1.0)  # step 1 draws another batch
        log.append(("taken", second[0].task_id, producer.version))
        await producer.publish(1)
        third = await asyncio.wait_for(producer.get(2), 1.0)
        await producer.stop()
        return log + [("first", int(first[0].task_id), 0), ("third", int(third[0].task_id), 1)]

    log = asyncio.run(scenario())
    assert ("sampled", 1, 0) in log and ("taken", "1", 0) in log
    assert ("sampled", 2, 1) in log and ("third", 2, 1) in log


@pytest.mark.parametrize("partial, most", [(False, 1), (True, 2)])
def test_with_partial_rollouts_batches_sample_at_once_within_the_buffer(partial, most):
    """Staleness 1 (a buffer of 2): with partial rollouts two batches sample at once (their
    environment waits overlap), without them one; batches reach the trainer in order either way."""

    async def scenario() -> tuple[int, list[int]]:
        now = most_seen = 0

        async def generate(batch, step):
            nonlocal now, most_seen
            now += 1
            most_seen = max(most_seen, now)
            await asyncio.sleep(0.02 if batch % 2 == 0 else 0.005)  # the second finishes first
            now -= 1
            return [_episode(str(batch), 0)]

        config = AsyncTrainingConfig(enable=True, staleness_threshold=1, partial_rollout=partial)
        producer = RolloutProducer(config, generate, iter(range(4)), start_step=0)
        producer.start()
        order = []
        for step in (1, 2):
            order.append(int((await asyncio.wait_for(producer.get(step), 1.0))[0].task_id))
            await producer.publish(step)
        order += [int((await asyncio.wait_for(producer.get(s), 1.0))[0].task_id) for s in (3, 4)]
        await producer.stop()
        return most_seen, order

    most_seen, order = asyncio.run(scenario())
    assert most_seen == most and order == [0, 1, 2, 3]


def test_the_producer_raises_its_error_to_the_trainer():
    async def scenario():
        async def generate(batch, step):
            raise RuntimeError("the environment died")

        producer = RolloutProducer(AsyncTrainingConfig(enable=True), generate, iter([0]), start_step=0)
        producer.start()
        try:
            await asyncio.wait_for(producer.get(1), 1.0)
        finally:
            await producer.stop()

    with pytest.raises(RuntimeError, match="the environment died"):
        asyncio.run(scenario())


def _backend(*overrides: str) -> TorchBackend:
    backend = TorchBackend(make_config("/tmp/unused", *TINY_STEPS, "rllm.async_training.enable=true", *overrides))
    backend.init_rollout_engine()
    return backend


@pytest.mark.parametrize("partial", [False, True])
def test_each_turn_records_the_version_that_sampled_it(partial):
    """A sync staged between an episode's two turns reaches its second turn only with partial rollouts."""
    backend = _backend(f"rllm.async_training.partial_rollout={str(partial).lower()}")
    engine = backend.init_async_rollout_engine()

    async def episode() -> list[int]:
        versions: list[int] = []
        SAMPLED_VERSIONS.set(versions)
        first = await engine.generate("1+2=")
        with torch.no_grad():
            backend.model.get_input_embeddings().weight.add_(1.0)  # an update
        backend.publish_weights(1)
        second = await engine.generate("3+4=")
        assert [first.info["policy_version"], second.info["policy_version"]] == versions
        return versions

    engine.sync_weights()
    assert asyncio.run(episode()) == ([0, 1] if partial else [0, 0])
    engine.sync_weights()  # a batch boundary: the staged weights are taken either way
    assert engine.version == 1
    for (name, p), (_, q) in zip(backend.model.named_parameters(), engine.model.named_parameters(), strict=True):
        assert torch.equal(p, q), name


def test_with_lora_only_the_adapters_travel():
    pytest.importorskip("peft")
    backend = _backend("model.lora.r=2")
    backend.init_async_rollout_engine()
    backend.publish_weights(1)
    staged, version = backend.async_rollout_engine._staged
    assert version == 1 and staged and all("lora_" in name for name in staged)
    trainable = {n for n, p in backend.model.named_parameters() if p.requires_grad}
    assert set(staged) == trainable


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["rllm.async_training.enable=true", "rllm.async_training.staleness_threshold=-1"], "staleness_threshold=-1"),
        (
            ["rllm.async_training.enable=true", "rllm.async_training.trigger_parameter_sync_step=0"],
            "trigger_parameter_sync_step=0",
        ),
        (
            ["rllm.async_training.staleness_threshold=2"],
            r"read only in async mode: add rllm.async_training.enable=true",
        ),
        (["rllm.async_training.enable=true", "rllm.algorithm.adv_estimator=remax"], "cannot run with .*remax"),
        (["rllm.async_training.enable=true", "rllm.async_training.stale_groups=later"], "stale_groups"),
        (["rllm.async_training.enable=true", "rllm.async_training.mini_batch_size=0"], "mini_batch_size=0"),
    ],
)
def test_a_setting_async_mode_cannot_honour_is_refused_naming_it(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        check_run_config(make_config(tmp_path, *overrides))


def test_a_bad_async_setting_on_the_command_line_exits_2_with_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "rllm_torch.train", "rllm.async_training.enable=true"]
        + ["rllm.async_training.trigger_parameter_sync_step=0", f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("rllm-torch-train: ConfigError: ")
    assert "trigger_parameter_sync_step" in done.stderr and "Traceback" not in done.stderr


def test_mini_batch_size_sets_the_prompts_of_an_async_step(tmp_path):
    run(make_config(tmp_path, *TINY, "rllm.async_training.enable=true", "rllm.async_training.mini_batch_size=4"))
    rows = [r for r in _rows(tmp_path) if "actor/loss" in r]
    assert [r["groups/num_groups"] for r in rows] == [4, 4, 4, 4]
