"""rLLM's behaviours of issue 48 items 5 and 6, each pinned to the rLLM code it comes from (rLLM main
9beb6e0f): the defaults of its dataclasses, its deprecation warnings, the verl loss names of its
(estimator, loss) pairs and a config that disagrees with a keyword."""

from __future__ import annotations

import warnings

import pytest
from omegaconf import OmegaConf

from rllm_torch import (
    AlgorithmConfig,
    RolloutCorrectionConfig,
    Step,
    Trajectory,
    TrajectoryGroup,
    collect_reward_and_advantage_from_trajectory_groups,
)
from rllm_torch.core.errors import InvalidRewardsError
from rllm_torch.trainer.config_checks import typed_algorithm_config
from rllm_torch.trainer.schema import TrainConfig

# tis_cap: rllm/trainer/algorithms/config.py: the dataclass says 5.0 (line 238), from_config reads an
# absent key as 2.0 (line 322), and rllm/trainer/config/rllm/base.yaml (line 92) sets 2.0.


def test_rollout_correction_config_built_bare_caps_the_weight_at_five_as_rllms_dataclass_does():
    assert RolloutCorrectionConfig().tis_cap == 5.0
    assert AlgorithmConfig().rollout_correction.tis_cap == 5.0


def test_from_config_without_tis_cap_reads_two_as_rllms_from_config_does():
    section_without = AlgorithmConfig.from_config({"adv_estimator": "grpo"})
    section_mode_only = AlgorithmConfig.from_config(
        {"adv_estimator": "grpo", "rollout_correction": {"tis_mode": "token"}}
    )
    assert section_without.rollout_correction.tis_cap == 2.0
    assert section_mode_only.rollout_correction.tis_cap == 2.0
    assert section_mode_only.rollout_correction.tis_mode == "token"
    given = AlgorithmConfig.from_config({"adv_estimator": "grpo", "rollout_correction": {"tis_cap": 3.0}})
    assert given.rollout_correction.tis_cap == 3.0


def test_a_run_config_left_alone_caps_at_two_as_rllms_base_yaml_does():
    config = OmegaConf.structured(TrainConfig)
    assert config.rllm.algorithm.rollout_correction.tis_cap == 2.0
    assert typed_algorithm_config(config).rollout_correction.tis_cap == 2.0
    assert isinstance(OmegaConf.to_object(config).rllm.algorithm.rollout_correction, RolloutCorrectionConfig)


def test_a_whole_rllm_config_without_a_rollout_correction_section_reads_two():
    config = OmegaConf.create({"rllm": {"algorithm": {"adv_estimator": "rloo"}}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert AlgorithmConfig.from_config(config).rollout_correction.tis_cap == 2.0


# Steps of rewards only: rllm/trainer/algorithms/advantage.py,
# collect_reward_and_advantage_from_trajectory_groups (lines 209-236) reads traj.reward and writes
# each step's advantage, whatever tokens the steps carry.


def _reward_only_group(rewards, group_id="t0:solver"):
    return TrajectoryGroup(
        trajectories=[Trajectory(name="solver", reward=r, steps=[Step(reward=r), Step(reward=r)]) for r in rewards],
        group_id=group_id,
    )


def test_steps_of_rewards_only_get_grpos_advantages_and_reward_metrics_as_in_rllm():
    group = _reward_only_group([1.0, 0.0, 0.0, 1.0])
    metrics = collect_reward_and_advantage_from_trajectory_groups([group], AlgorithmConfig())
    # mean 0.5, population std 0.5: (1 - 0.5) / (0.5 + 1e-6) = 0.999998000004, (0 - 0.5) / ... = -0.999998000004
    a = 0.5 / (0.5 + 1e-6)
    assert [s.advantage for t in group.trajectories for s in t.steps] == pytest.approx(
        [a, a, -a, -a, -a, -a, a, a], abs=1e-12
    )
    assert metrics["reward/solver/mean"] == 0.5 and metrics["reward/solver/std"] == 0.5
    assert metrics["reward/solver/max"] == 1.0 and metrics["reward/solver/min"] == 0.0
    assert "advantage/solver/num_untrained" not in metrics


@pytest.mark.parametrize("compat", ["rllm_torch", "rllm"])
def test_steps_of_rewards_only_get_rloos_advantages_in_both_compat_modes(compat):
    group = _reward_only_group([3.0, 0.0, 0.0])
    collect_reward_and_advantage_from_trajectory_groups([group], AlgorithmConfig(estimator="rloo", compat=compat))
    # rLLM's rloo: r_i - mean of the others: 3 - 0 = 3, 0 - (3 + 0) / 2 = -1.5 (twice)
    assert [t.steps[0].advantage for t in group.trajectories] == pytest.approx([3.0, -1.5, -1.5], abs=1e-12)


def test_a_masked_trajectory_stays_out_while_one_of_rewards_only_counts():
    masked = Trajectory(name="solver", reward=7.0, steps=[Step(response_ids=[1, 2], response_mask=[0, 0])])
    group = _reward_only_group([1.0, 0.0])
    group.trajectories.append(masked)
    metrics = collect_reward_and_advantage_from_trajectory_groups([group], AlgorithmConfig(estimator="rloo"))
    # rloo over the two counted: 1 - 0 = 1, 0 - 1 = -1; the masked one gets 0 and its 7.0 is not read
    assert [t.steps[0].advantage for t in group.trajectories] == [1.0, -1.0, 0.0]
    assert metrics["advantage/solver/num_untrained"] == 1.0 and metrics["reward/solver/max"] == 1.0


def test_a_trajectory_of_rewards_only_without_its_own_reward_is_refused_naming_it():
    group = TrajectoryGroup(trajectories=[Trajectory(name="solver", steps=[Step(reward=1.0)])], group_id="t3:solver")
    with pytest.raises(InvalidRewardsError, match=r"task 't3'.*reward is None"):
        collect_reward_and_advantage_from_trajectory_groups([group], AlgorithmConfig())


# use_rllm: rllm/trainer/algorithms/config.py (lines 274, 309-316, 343-350): None by default, and any
# value but None (False included) warns that it is deprecated and ignored.


@pytest.mark.parametrize("value", [False, True])
def test_use_rllm_set_to_any_value_warns_that_it_is_ignored_as_rllm_does(value):
    with pytest.warns(DeprecationWarning, match=rf"use_rllm={value}` is deprecated and ignored"):
        AlgorithmConfig(use_rllm=value)
    with pytest.warns(DeprecationWarning, match="use_rllm"):
        AlgorithmConfig.from_config({"adv_estimator": "grpo", "use_rllm": value})


def test_use_rllm_left_out_is_none_and_warns_nothing_in_code_or_a_run_config():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert AlgorithmConfig().use_rllm is None
        assert AlgorithmConfig.from_config({"adv_estimator": "grpo"}).use_rllm is None
        assert typed_algorithm_config(OmegaConf.structured(TrainConfig)).use_rllm is None
