"""UnifiedTrainer with fakes: stage order, validation schedule, per-role estimator map."""

from __future__ import annotations

import json

import pytest
import torch
from trainer_fakes import RecordingBackend, TwoRoleWorkflow, make_config

from rllm_torch import GroupedRewards, UnifiedTrainer, compute_advantages
from rllm_torch.core.errors import ConfigError, UnknownEstimatorError, WorkflowError

TRAIN = [{"prompt": f"p{i}"} for i in range(8)]
VAL = [{"prompt": "v0", "data_source": "a"}, {"prompt": "v1", "data_source": "b"}]


def trainer_for(tmp_path, *overrides, estimator_map=None, val=VAL):
    config = make_config(tmp_path, "data.train_batch_size=2", "rllm.rollout.n=4", "rllm.rollout.n_val=2", *overrides)
    return UnifiedTrainer(
        RecordingBackend, config, TwoRoleWorkflow, TRAIN, val, traj_group_adv_estimator_map=estimator_map
    )


def steps_validated(trainer):
    return [step for step, _ in trainer.val_history]


def test_one_training_step_calls_the_stages_in_the_reference_order(tmp_path):
    trainer = trainer_for(tmp_path, "rllm.trainer.total_batches=1", "rllm.trainer.val_before_train=false")
    trainer.fit()
    calls = trainer.backend.calls
    assert calls[:2] == ["validate_config", "init_rollout_engine"]
    assert calls[2:] == [
        "on_train_start@0",
        "on_epoch_start@0",
        "on_batch_start@1",
        "generate_episodes",
        "transform_to_backend_batch",
        "process_backend_batch",
        "compute_advantages",
        "update_policy",
        "on_batch_end@1",
        "on_epoch_end@1",
        "on_validation_start@1",
        "generate_episodes:val",
        "on_validation_end@1",
        "on_train_end@1",
    ]


def test_validation_runs_before_training_every_test_freq_steps_and_once_at_the_end(tmp_path):
    trainer = trainer_for(tmp_path, "rllm.trainer.test_freq=2", "rllm.trainer.total_batches=3")
    trainer.fit()
    assert steps_validated(trainer) == [0, 2, 3]


def test_the_final_validation_is_not_repeated_when_the_last_step_was_just_validated(tmp_path):
    trainer = trainer_for(tmp_path, "rllm.trainer.test_freq=2", "rllm.trainer.total_epochs=1")  # 4 batches
    trainer.fit()
    assert steps_validated(trainer) == [0, 2, 4]
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in lines if "val/a/pass@1" in row] == [0, 2, 4]


def test_val_only_validates_once_and_trains_nothing(tmp_path):
    trainer = trainer_for(tmp_path, "rllm.trainer.val_only=true", "rllm.trainer.val_before_train=false")
    trainer.fit()
    assert steps_validated(trainer) == [0]
    assert "update_policy" not in trainer.backend.calls


def test_validation_reports_pass_at_1_and_pass_at_n_per_data_source(tmp_path):
    trainer = trainer_for(tmp_path, "rllm.trainer.val_only=true")
    trainer.fit()
    metrics = trainer.val_history[0][1]
    # n_val=2 rollouts per task: rollout 1 is correct, rollout 0 is not
    assert metrics["val/a/pass@1"] == 0.5 and metrics["val/b/pass@1"] == 0.5
    assert metrics["val/a/pass@2"] == 1.0 and metrics["val/b/pass@2"] == 1.0


def test_a_per_role_estimator_map_picks_each_roles_estimator_in_the_backend_batch(tmp_path):
    trainer = trainer_for(
        tmp_path,
        "rllm.trainer.total_batches=1",
        "rllm.trainer.val_before_train=false",
        estimator_map={"judge": "reinforce"},
    )
    trainer.fit()
    batch = trainer.backend.batches[0]
    roles_N = [batch.group_roles[g] for g in batch.group_index.tolist()]
    adv_N = batch.advantages.sum(1) / batch.response_mask.sum(1)
    solver = torch.tensor([r == "solver" for r in roles_N])
    judge_rewards = batch.rewards[~solver]
    torch.testing.assert_close(adv_N[~solver], judge_rewards.float())  # reinforce: advantage = reward (float32 tokens)
    solver_groups = batch.group_index[solver]
    expected, _ = compute_advantages(GroupedRewards.from_labels(batch.rewards[solver], solver_groups), "grpo")
    torch.testing.assert_close(adv_N[solver], expected.float())  # the default estimator
    assert bool((batch.advantages[batch.response_mask == 0] == 0).all())  # prompt and padding tokens get 0


def test_an_unknown_estimator_fails_before_the_backend_is_built(tmp_path):
    with pytest.raises(UnknownEstimatorError, match="registered"):
        trainer_for(tmp_path, "rllm.algorithm.adv_estimator=gpro")
    with pytest.raises(UnknownEstimatorError):
        trainer_for(tmp_path, estimator_map={"judge": "nope"})


def test_rejection_sampling_multiplier_without_enable_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="multiplier"):
        trainer_for(tmp_path, "rllm.rejection_sample.multiplier=2")


def test_a_flaky_workflow_is_retried_and_training_goes_on(tmp_path):
    TwoRoleWorkflow.attempts.clear()
    config = make_config(
        tmp_path,
        "data.train_batch_size=2",
        "rllm.rollout.n=2",
        "rllm.trainer.total_batches=1",
        "rllm.trainer.val_before_train=false",
        "rllm.workflow.retry_limit=3",
    )
    trainer = UnifiedTrainer(RecordingBackend, config, TwoRoleWorkflow, [{"prompt": "x", "fail": 2}] * 2, None)
    trainer.fit()
    assert "update_policy" in trainer.backend.calls
    assert max(TwoRoleWorkflow.attempts.values()) == 3


def test_a_workflow_that_keeps_failing_raises_a_workflow_error_when_configured(tmp_path):
    TwoRoleWorkflow.attempts.clear()
    config = make_config(
        tmp_path,
        "data.train_batch_size=2",
        "rllm.rollout.n=2",
        "rllm.trainer.total_batches=1",
        "rllm.trainer.val_before_train=false",
        "rllm.workflow.retry_limit=2",
    )
    trainer = UnifiedTrainer(RecordingBackend, config, TwoRoleWorkflow, [{"prompt": "x", "fail": 5}] * 2, None)
    with pytest.raises(WorkflowError, match="failed 2 time"):
        trainer.fit()


def test_a_workflow_that_keeps_failing_is_counted_as_an_error_when_not_raising(tmp_path):
    TwoRoleWorkflow.attempts.clear()
    config = make_config(
        tmp_path,
        "data.train_batch_size=2",
        "rllm.rollout.n=2",
        "rllm.trainer.total_batches=1",
        "rllm.trainer.val_before_train=false",
        "rllm.workflow.retry_limit=2",
        "rllm.workflow.raise_on_error=false",
    )
    rows = [{"prompt": "x", "fail": 5}, {"prompt": "y"}]
    trainer = UnifiedTrainer(RecordingBackend, config, TwoRoleWorkflow, rows, None)
    trainer.fit()
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert row["batch/termination_reason/error"] == 0.5
    assert "update_policy" in trainer.backend.calls


def test_the_trainers_estimator_and_loss_pairs_reach_the_checks_and_the_backend(tmp_path):
    pairs = {"judge": ("reinforce", "cross_entropy")}
    trainer = trainer_for(tmp_path, "rllm.trainer.total_batches=1", estimator_map=pairs)
    assert trainer.algorithm_config.estimator_for("judge") == "reinforce"
    assert trainer.algorithm_config.loss_fn_for("judge") == "cross_entropy"
    assert trainer.backend.kwargs["algorithm_config"] is trainer.algorithm_config  # the one checked object
    with pytest.raises(ConfigError, match=r"clip_ratio_c=3.0 is a ratio cap .*loss_fn_map\['judge'\]"):
        trainer_for(tmp_path, "backend.clip_ratio_c=3", estimator_map=pairs)
