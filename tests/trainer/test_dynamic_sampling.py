"""DAPO's dynamic sampling in the trainer: a step draws batches until it has
``data.train_batch_size`` prompts whose groups have signal, trains on exactly that many, and
says so when the cap on batches (or the epoch's data) stops it short."""

from __future__ import annotations

import json

import pytest
import torch
from trainer_fakes import RecordingBackend, make_config

from rllm_torch import UnifiedTrainer
from rllm_torch.core.errors import ConfigError
from rllm_torch.rllm.types import Episode, Step, TerminationReason, Trajectory
from rllm_torch.trainer.pipeline.dynamic_sampling import DynamicSamplingConfig
from rllm_torch.trainer.workflow import Workflow

SIGNAL = {0, 3, 4, 5, 9, 10, 11}  # the prompts whose rollouts disagree; batches of 2: [0 1] [2 3] [4 5] ...
TRAIN = [{"prompt": f"p{i}", "signal": i in SIGNAL} for i in range(12)]


class SignalWorkflow(Workflow):
    """Reward = rollout index % 2 on a prompt with signal, 1.0 for every rollout of the others."""

    async def run(self, task, uid):
        k = int(uid.rsplit(":", 1)[1])
        reward = float(k % 2) if task["signal"] else 1.0
        step = Step(prompt_ids=[5, 6], response_ids=[7, 8], logprobs=[-0.1, -0.2])
        return Episode(
            trajectories=[Trajectory(name="solver", reward=reward, steps=[step])],
            is_correct=reward >= 1.0,
            termination_reason=TerminationReason.ENV_DONE,
        )


class TaskRecordingBackend(RecordingBackend):
    """Records the task ids each step trains on."""

    def __init__(self, config, **kwargs):
        super().__init__(config, **kwargs)
        self.trained: list[list[str]] = []

    def transform_to_backend_batch(self, trainer_state):
        self.trained.append([g.task_id for g in trainer_state.trajectory_groups])
        return super().transform_to_backend_batch(trainer_state)


def run(tmp_path, *overrides):
    config = make_config(
        tmp_path,
        "data.train_batch_size=2",
        "rllm.rollout.n=4",
        "rllm.trainer.total_epochs=1",
        "rllm.trainer.val_before_train=false",
        "rllm.algorithm.filter_groups.enable=true",
        *overrides,
    )
    trainer = UnifiedTrainer(TaskRecordingBackend, config, SignalWorkflow, TRAIN, None)
    trainer.fit()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return trainer, [r for r in rows if "batch/dynamic_sampling/gen_batches" in r]


@pytest.mark.parametrize("metric", ["reward", "is_correct"])
def test_each_step_draws_batches_until_it_has_the_batch_size_in_prompts_with_signal(tmp_path, metric):
    trainer, rows = run(tmp_path, f"rllm.algorithm.filter_groups.metric={metric}")
    # step 1: [t0 t1] has t0, [t2 t3] adds t3; step 2: [t4 t5]; step 3: [t6 t7] none, [t8 t9] t9,
    # [t10 t11] two more: three found, the first two drawn are kept
    assert trainer.backend.trained == [["t0", "t3"], ["t4", "t5"], ["t9", "t10"]]
    assert [r["batch/dynamic_sampling/gen_batches"] for r in rows] == [2.0, 1.0, 3.0]
    assert [r["batch/dynamic_sampling/prompts_with_signal"] for r in rows] == [2.0, 2.0, 3.0]
    assert all(r["batch/dynamic_sampling/prompts_short"] == 0.0 for r in rows)
    assert len(rows) == 3  # six batches, one epoch: three steps


def test_every_batch_a_step_draws_counts_as_done_so_a_resume_skips_it(tmp_path):
    run(tmp_path, "rllm.trainer.total_batches=1")
    saved = torch.load(tmp_path / "checkpoints" / "step_000001" / "trainer.pt", weights_only=False)
    assert (saved["global_step"], saved["batch_in_epoch"]) == (1, 2)


def test_a_step_that_reaches_the_cap_trains_on_what_it_found_with_a_counted_warning(tmp_path):
    with pytest.warns(UserWarning, match=r"step 3: max_num_gen_batches=2 reached with 1 of 2 prompts .*short step 1"):
        trainer, rows = run(tmp_path, "rllm.algorithm.filter_groups.max_num_gen_batches=2")
    assert trainer.backend.trained == [["t0", "t3"], ["t4", "t5"], ["t9"], ["t10", "t11"]]
    assert [r["batch/dynamic_sampling/prompts_short"] for r in rows] == [0.0, 0.0, 1.0, 0.0]
    assert trainer.training_step.dynamic_sampler.short_steps == 1


def test_the_epochs_end_stops_a_step_short_and_says_why(tmp_path):
    # batches of 6: [t0..t5] has 4 prompts with signal, [t6..t11] 3 more: 6 wanted, 7 found: step 1
    # trains on the first 6 drawn, and the epoch is over
    trainer, rows = run(tmp_path, "data.train_batch_size=6")
    assert trainer.backend.trained == [["t0", "t3", "t4", "t5", "t9", "t10"]]
    # batches of 8: [t0..t7] has 4, the last batch [t8..t11] 3 more: 7 of 8 when the epoch ends
    with pytest.warns(UserWarning, match=r"step 1: the epoch's data ran out with 7 of 8 prompts.*next epoch"):
        trainer, rows = run(tmp_path / "short", "data.train_batch_size=8")
    assert trainer.backend.trained == [["t0", "t3", "t4", "t5", "t9", "t10", "t11"]]
    assert rows[0]["batch/dynamic_sampling/prompts_short"] == 1.0


def test_bad_settings_are_config_errors():
    with pytest.raises(ConfigError, match="verl's 'acc' is 'is_correct'"):
        DynamicSamplingConfig(enable=True, metric="acc")
    with pytest.raises(ConfigError, match="max_num_gen_batches must be an int >= 1"):
        DynamicSamplingConfig(enable=True, max_num_gen_batches=0)


def test_dynamic_sampling_and_episode_mode_rejection_sampling_are_exclusive(tmp_path):
    config = make_config(tmp_path, "rllm.algorithm.filter_groups.enable=true", "rllm.rejection_sample.enable=true")
    with pytest.raises(ConfigError, match="both accumulate groups"):
        UnifiedTrainer(TaskRecordingBackend, config, SignalWorkflow, TRAIN, None)


def test_total_batches_counts_steps_even_when_steps_draw_several_batches(tmp_path, capsys):
    """Three steps fill one epoch of six batches: five steps take a second epoch, not a short run."""
    trainer, rows = run(tmp_path, "rllm.trainer.total_batches=5")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    trainer, rows = run(tmp_path / "epochs", "rllm.trainer.total_epochs=1")  # no total_batches: one pass
    assert len(rows) == 3
    assert "dynamic sampling: trained 3 steps in rllm.trainer.total_epochs=1 (of 6 batches)" in capsys.readouterr().out


class OtherRankShort:
    """A RunRanks of 2 whose other rank is short of its share for ``rounds`` more rounds (the
    lockstep rule of several processes, without the processes)."""

    world_size, is_main = 2, True

    def __init__(self, rounds: int):
        self.rounds, self.calls = rounds, 0

    def any(self, flag: bool) -> bool:
        # fill asks in turn "is a rank short?" and, after a draw, "has a rank's data run out?"
        self.calls += 1
        if flag or self.calls % 2 == 0:
            return flag  # the other rank's data has not run out
        self.rounds -= 1
        return self.rounds >= 0

    def reduce(self, values, op="sum"):
        return [2 * v for v in values]  # the other rank found as many


def test_on_several_ranks_a_rank_keeps_drawing_while_another_is_short_and_trains_on_its_share():
    import asyncio

    from rllm_torch.trainer.pipeline.dynamic_sampling import DynamicSampler

    def episodes(ids):
        return [
            Episode(id=f"{i}:{k}", task_id=str(i), trajectories=[Trajectory(name="solver", reward=float(k))])
            for i in ids
            for k in range(2)
        ]

    def to_groups(eps):
        from rllm_torch.rllm.types import TrajectoryGroup

        ids = dict.fromkeys(e.task_id for e in eps)
        return [
            TrajectoryGroup([t for e in eps if e.task_id == i for t in e.trajectories], group_id=i, task_id=i)
            for i in ids
        ]

    batches = iter([episodes([2, 3]), episodes([4, 5]), episodes([6, 7])])
    draws = []

    async def draw():
        draws.append(1)
        return next(batches, None)

    sampler = DynamicSampler(DynamicSamplingConfig(enable=True, target_prompts=4), ranks=OtherRankShort(rounds=2))
    kept, drawn, metrics = asyncio.run(sampler.fill(episodes([0, 1]), draw, to_groups, step=1))
    # this rank had its share (2 of 4 prompts) at once, and drew 2 more batches while the other was short
    assert len(draws) == 2 and metrics["batch/dynamic_sampling/gen_batches"] == 3.0
    assert sorted({e.task_id for e in kept}) == ["0", "1"] and len(drawn) == 12
