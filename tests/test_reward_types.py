"""Trajectory rewards on every path that reads them (the collector, the trainer's backend batch,
the uniform-group filter): real numbers and bools are read as numbers, anything else is a typed
error naming the task and trajectory; float64 rewards keep their precision into the trainer's
statistics."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

from rllm_torch import (
    AlgorithmConfig,
    GroupedRewards,
    InvalidRewardsError,
    InvalidRewardTypeError,
    Step,
    Trajectory,
    TrajectoryGroup,
    collect_reward_and_advantage_from_trajectory_groups,
    compute_advantages,
)
from rllm_torch.trainer import (
    RejectionSamplingConfig,
    RejectionSamplingState,
    apply_rejection_sampling_and_filtering,
    compute_token_advantages,
)
from rllm_torch.trainer.pipeline.token_batch import build_token_batch


def _group(rewards, task="task-9"):
    trajs = [
        Trajectory(name="solver", reward=r, steps=[Step(prompt_ids=[1], response_ids=[2, 3], response_mask=[1, 1])])
        for r in rewards
    ]
    return TrajectoryGroup(trajectories=trajs, group_id=f"{task}:solver", task_id=task)


def _collect(groups):
    return collect_reward_and_advantage_from_trajectory_groups(groups, AlgorithmConfig(estimator="grpo"))


def _token_batch(groups):
    batch = build_token_batch(groups, pad_token_id=0)
    compute_token_advantages(batch, AlgorithmConfig(estimator="grpo"))
    return batch


def _uniform_filter(groups):
    config = RejectionSamplingConfig(mode="episode", filter_uniform_groups=True, min_partial_solve_tasks=0)
    return apply_rejection_sampling_and_filtering([], groups, config, RejectionSamplingState())


PATHS = {"collector": _collect, "backend batch": _token_batch, "uniform filter": _uniform_filter}
NOT_NUMBERS = {
    "one-element list": [1.0],
    "list": [1.0, 0.0],
    "numpy array": np.array([1.0]),
    "0-d numpy array": np.array(1.0),
    "tensor": torch.tensor(1.0),
    "string": "1.0",
    "complex": 1 + 2j,
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("bad", NOT_NUMBERS.values(), ids=NOT_NUMBERS.keys())
def test_a_reward_that_is_not_a_real_number_is_a_typed_error_naming_the_trajectory(path, bad):
    groups = [_group([1.0, 0.0, 0.5]), _group([0.0, bad], task="task-7")]
    with pytest.raises(InvalidRewardTypeError, match=r"task 'task-7'.*trajectory 'solver'.*not a real number"):
        PATHS[path](groups)


@pytest.mark.parametrize("path", ["collector", "backend batch"])
def test_a_missing_reward_is_a_value_error_naming_the_trajectory(path):
    with pytest.raises(InvalidRewardsError, match=r"task 'task-7'.*reward is None"):
        PATHS[path]([_group([1.0, 0.0]), _group([None, None], task="task-7")])


NUMBERS = {
    "bool": (True, False, True),
    "numpy bool": (np.bool_(True), np.bool_(False), np.bool_(True)),
    "numpy float32": (np.float32(1.0), np.float32(0.0), np.float32(1.0)),
    "numpy int": (np.int64(1), np.int64(0), np.int64(1)),
    "fraction": (Fraction(1), Fraction(0), Fraction(1)),
}


@pytest.mark.parametrize("values", NUMBERS.values(), ids=NUMBERS.keys())
def test_bools_and_numpy_scalars_are_read_as_numbers_on_every_path(values):
    want = compute_advantages(GroupedRewards.from_groups([[1.0, 0.0, 1.0]]), "grpo")[0]
    groups = [_group(values)]
    _collect(groups)
    got = torch.tensor([t.steps[0].advantage for t in groups[0].trajectories], dtype=torch.float64)
    torch.testing.assert_close(got, want)
    batch = _token_batch([_group(values)])
    torch.testing.assert_close(batch.advantages[:, -1], want.float())
    kept, _, metrics = _uniform_filter([_group(values)])
    assert len(kept) == 1 and metrics["batch/fraction_groups_dropped_uniform"] == 0.0


def test_float64_rewards_keep_their_precision_into_the_trainers_statistics():
    """A group at 1e4 with a spread of 0.01: float32 rewards would be ~1.6% off."""
    rewards = [1e4 + 0.01 * k for k in range(8)]
    want = compute_advantages(GroupedRewards.from_groups([rewards]), "grpo")[0]  # float64 all the way
    groups = [_group(rewards)]
    batch = _token_batch(groups)
    assert batch.rewards.dtype == torch.float64
    torch.testing.assert_close(batch.advantages[:, -1].double(), want, rtol=1e-6, atol=1e-6)
    _collect(groups)
    collected = torch.tensor([t.steps[0].advantage for t in groups[0].trajectories], dtype=torch.float64)
    torch.testing.assert_close(collected, want, rtol=1e-12, atol=1e-12)
