"""The trainer's loop where rLLM's ``UnifiedTrainer`` decides (rLLM main 9beb6e0f,
rllm/trainer/unified_trainer.py): validation at the end only with ``test_freq > 0`` (lines 476, 489);
episode-mode rejection sampling emptied before every batch (``TrainerState.reset_batch``, line 109),
so a batch short of ``min_partial_solve_tasks`` is dropped."""

from __future__ import annotations

import pytest
from trainer_fakes import RecordingBackend, TwoRoleWorkflow, make_config

from rllm_torch import UnifiedTrainer

TRAIN = [{"prompt": f"p{i}"} for i in range(8)]
VAL = [{"prompt": "v0", "data_source": "a"}]


def trainer_for(tmp_path, *overrides):
    config = make_config(tmp_path, "data.train_batch_size=2", "rllm.rollout.n=4", "rllm.rollout.n_val=2", *overrides)
    return UnifiedTrainer(RecordingBackend, config, TwoRoleWorkflow, TRAIN, VAL)


@pytest.mark.parametrize("test_freq", [0, -1])
def test_test_freq_of_zero_or_less_validates_before_training_and_never_at_the_end(tmp_path, test_freq):
    trainer = trainer_for(tmp_path, f"rllm.trainer.test_freq={test_freq}", "rllm.trainer.total_batches=3")
    trainer.fit()
    assert [step for step, _ in trainer.val_history] == [0]
    assert [c for c in trainer.backend.calls if c.startswith("on_validation_start")] == ["on_validation_start@0"]


def test_test_freq_of_zero_without_validation_before_training_never_validates(tmp_path):
    trainer = trainer_for(tmp_path, "rllm.trainer.test_freq=0", "rllm.trainer.val_before_train=false")
    trainer.fit()
    assert trainer.val_history == [] and "generate_episodes:val" not in trainer.backend.calls


def test_a_finished_run_with_test_freq_zero_is_complete_without_a_final_validation(tmp_path):
    overrides = ("rllm.trainer.test_freq=0", "rllm.trainer.total_batches=2", "rllm.trainer.val_before_train=false")
    trainer_for(tmp_path, *overrides).fit()
    again = trainer_for(tmp_path, *overrides)
    again.fit()  # resumed at its last step: nothing left to do, so nothing is validated or written
    assert again.already_complete and again.val_history == []


def test_a_positive_test_freq_still_validates_at_the_end(tmp_path):
    trainer = trainer_for(tmp_path, "rllm.trainer.test_freq=2", "rllm.trainer.total_batches=3")
    trainer.fit()
    assert [step for step, _ in trainer.val_history] == [0, 2, 3]


# rejection sampling, episode mode: 2 tasks a step (train_batch_size=2), 2 rollouts each; TwoRoleWorkflow's
# rollout k scores k % 2, so every task is partially solved (rollout 0 wrong, rollout 1 right): 2 partial
# solves a batch, and 2 roles x 2 tasks = 4 groups a batch.
RS = ("rllm.rejection_sample.enable=true", "rllm.rollout.n=2", "rllm.trainer.total_batches=4")


def _trained_groups(tmp_path, *overrides):
    trainer = trainer_for(tmp_path, *RS, "rllm.trainer.val_before_train=false", "rllm.trainer.test_freq=0", *overrides)
    trainer.fit()
    return [batch.num_groups for batch in trainer.backend.batches]


def test_a_batch_short_of_partial_solves_is_dropped_and_not_carried_into_the_next_as_in_rllm(tmp_path):
    # 2 partial solves a batch < 3 needed: rLLM's trainer drops each batch (its state emptied before the next)
    assert _trained_groups(tmp_path, "rllm.rejection_sample.min_partial_solve_tasks=3") == []


def test_a_batch_with_enough_partial_solves_trains_its_own_groups_only(tmp_path):
    assert _trained_groups(tmp_path, "rllm.rejection_sample.min_partial_solve_tasks=2") == [4, 4, 4, 4]


def test_accumulate_true_carries_a_short_batch_into_the_next_steps(tmp_path):
    # 2 + 2 = 4 >= 3 partial solves after two batches: steps 2 and 4 train 8 groups each
    overrides = ("rllm.rejection_sample.min_partial_solve_tasks=3", "rllm.rejection_sample.accumulate=true")
    assert _trained_groups(tmp_path, *overrides) == [8, 8]
