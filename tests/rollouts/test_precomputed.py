"""Precomputed (workflow-written) token advantages through the trainer: alone and mixed with an
RL role in one batch; the distillation workflow and its fixed teacher."""

from __future__ import annotations

import json

import pytest
import torch
from trainer_fakes import make_config

from rllm_torch import AlgorithmConfig, GroupedRewards, UnifiedTrainer, compute_advantages
from rllm_torch.backends.torch_backend import TorchBackend
from rllm_torch.core.errors import ConfigError
from rllm_torch.rllm.types import Step, Trajectory, TrajectoryGroup
from rllm_torch.rollouts import build_task
from rllm_torch.trainer import build_token_batch, compute_token_advantages

SMALL = (
    "model.num_layers=1",
    "model.hidden_size=32",
    "model.num_heads=2",
    "task.train_size=64",
    "data.train_batch_size=16",
    "rllm.rollout.n=4",
    "rllm.trainer.val_before_train=false",
)


def _mixed_groups():
    distill = TrajectoryGroup(
        [Trajectory("distill", [Step(prompt_ids=[1], response_ids=[5, 6], advantage=[0.5, -2.0])], 0.0)],
        group_id="t0:distill",
    )
    solver = TrajectoryGroup(
        [
            Trajectory("solver", [Step(prompt_ids=[1], response_ids=[7])], 1.0),
            Trajectory("solver", [Step(prompt_ids=[1], response_ids=[8])], 0.0),
        ],
        group_id="t0:solver",
    )
    return [distill, solver]


def test_a_precomputed_group_keeps_its_token_advantages_and_the_rl_group_gets_the_estimators():
    # distill row: [prompt 0, 0.5, -2.0] as written; solver rows (RLOO, n = 2): 1 - 0 = 1 and 0 - 1 = -1 on their one token
    batch = build_token_batch(_mixed_groups(), pad_token_id=0, use_precomputed_advantage=True)
    metrics = compute_token_advantages(batch, AlgorithmConfig(estimator="rloo", use_precomputed_advantage=True))
    assert batch.advantages.tolist() == [[0.0, 0.5, -2.0], [0.0, 1.0, 0.0], [0.0, -1.0, 0.0]]
    assert metrics["advantage/distill/mean"] == pytest.approx(-0.75)  # (0.5 - 2.0) / 2 tokens
    assert metrics["reward/solver/mean"] == 0.5 and "reward/distill/mean" not in metrics


def test_without_use_precomputed_advantage_every_group_is_rl_as_in_rllm():
    batch = build_token_batch(_mixed_groups(), pad_token_id=0)
    assert batch.precomputed_advantages is None and batch.group_precomputed is None


class RecordingTorchBackend(TorchBackend):
    """The real torch backend; it also keeps each batch's groups and advantages before updating."""

    def __init__(self, config, **kwargs):
        super().__init__(config, **kwargs)
        self.updates = []

    async def update_policy(self, trainer_state):
        batch = trainer_state.backend_batch
        self.updates.append((trainer_state.trajectory_groups, batch.advantages.clone(), batch.input_ids.shape[1]))
        await super().update_policy(trainer_state)


def _train(tmp_path, *overrides):
    config = make_config(
        tmp_path, "task.name=distill", "rllm.algorithm.use_precomputed_advantage=true", *SMALL, *overrides
    )
    task = build_task(config.task)
    trainer = UnifiedTrainer(
        RecordingTorchBackend,
        config,
        task.workflow,
        train_dataset=task.train,
        val_dataset=None,
        workflow_args=task.workflow_args,
        backend_args={"alphabet": task.alphabet},
    )
    try:
        trainer.fit()
    finally:
        trainer.shutdown()
    return trainer, [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def test_mixed_with_an_rl_role_the_distilled_advantages_reach_the_loss_unchanged_and_the_rl_ones_come_from_grpo(
    tmp_path,
):
    trainer, _ = _train(tmp_path, "task.mix_rl=true", "rllm.trainer.total_batches=2")
    for groups, adv_RT, _ in trainer.backend.updates:
        assert {g.group_role for g in groups} == {"distill", "solver"}
        solver = [g for g in groups if g.group_role == "solver"]
        rewards = torch.tensor([t.reward for g in solver for t in g.trajectories])
        index = torch.tensor([i for i, g in enumerate(solver) for _ in g.trajectories])
        expected_solver = iter(
            compute_advantages(GroupedRewards.from_flat(rewards, index, num_groups=len(solver)), "grpo")[0].tolist()
        )
        row = 0
        for group in groups:
            for traj in group.trajectories:
                step = traj.steps[0]
                start, num = len(step.prompt_ids), len(step.response_ids)
                got = adv_RT[row, start : start + num].cpu()
                want = (
                    torch.tensor(step.advantage)
                    if group.group_role == "distill"
                    else torch.full((num,), next(expected_solver))
                )
                torch.testing.assert_close(got, want, rtol=0, atol=0 if group.group_role == "distill" else 1e-6)
                row += 1


def test_distillation_alone_trains_the_policy_towards_the_teacher(tmp_path):
    # mean token advantage = -(reverse-KL estimate to the teacher): it rises as the student learns
    _, rows = _train(tmp_path, "rllm.trainer.total_batches=12", "backend.lr=0.003")
    adv = [r["advantage/distill/mean"] for r in rows if "advantage/distill/mean" in r]
    assert len(adv) == 12 and "reward/distill/mean" not in rows[0]
    assert sum(adv[-3:]) / 3 > sum(adv[:3]) / 3 + 0.2


def test_a_task_that_writes_advantages_refuses_to_run_without_use_precomputed_advantage(tmp_path):
    from rllm_torch.cli.train_command import run

    with pytest.raises(ConfigError, match="use_precomputed_advantage=true"):
        run(make_config(tmp_path, "task.name=distill"))


def test_a_teacher_confidence_outside_the_open_unit_interval_is_refused():
    from rllm_torch.rollouts.distill import AnswerTeacher

    with pytest.raises(ConfigError, match="confidence must be in"):
        AnswerTeacher(1.0)
