"""The optional reasoning-gym task source: a small dataset, its scorer, and one real training step."""

from __future__ import annotations

import pytest
from trainer_fakes import make_config

from rllm_torch.core.errors import ConfigError
from rllm_torch.rollouts import build_task

reasoning_gym = pytest.importorskip("reasoning_gym")

from rllm_torch.rollouts.reasoning_gym import ReasoningGymScorer, reasoning_gym_rows  # noqa: E402


def test_a_small_dataset_becomes_task_rows_that_the_datasets_scorer_grades():
    rows = reasoning_gym_rows("leg_counting", size=3, seed=0)
    assert len(rows) == 3 and rows == reasoning_gym_rows("leg_counting", size=3, seed=0)
    assert all(r["prompt"] == r["question"] and r["data_source"] == "reasoning_gym/leg_counting" for r in rows)
    score = ReasoningGymScorer("leg_counting")
    right = rows[0]["answer"]
    assert score(rows[0], f" {right}\n") == 1.0 and score(rows[0], "no idea") == 0.0
    # the library's partial credit: the answer inside a longer response scores len(answer) / len(response)
    assert score(rows[0], f"{right}!!") == pytest.approx(len(right) / (len(right) + 2))


def test_an_unknown_dataset_name_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match="task.dataset='leg_countin'"):
        reasoning_gym_rows("leg_countin", size=1, seed=0)


def test_task_reasoning_gym_trains_a_step_with_the_datasets_scorer(tmp_path):
    from rllm_torch.cli.train_command import run

    config = make_config(
        tmp_path,
        "task.name=reasoning_gym",
        "task.dataset=basic_arithmetic",
        "task.train_size=4",
        "task.val_size=2",
        "model.num_layers=1",
        "model.hidden_size=32",
        "model.num_heads=2",
        "model.max_positions=256",
        "data.train_batch_size=4",
        "rllm.rollout.n=2",
        "rllm.rollout.n_val=1",
        "rllm.trainer.total_batches=1",
    )
    assert build_task(config.task).name == "reasoning_gym/basic_arithmetic"
    trainer = run(config)
    assert "val/reasoning_gym/basic_arithmetic/pass@1" in trainer.val_history[-1][1]
