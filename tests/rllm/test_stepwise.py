"""rLLM's ``rllm.stepwise_advantage`` modes through the collector and the trainer's token batch:
the turn-reward rule, one advantage per step, the two callers agreeing, 2 gloo ranks against one
process, and the settings' errors."""

from __future__ import annotations

import pytest
import rank_tasks
import torch
from omegaconf import OmegaConf
from rank_pool import RankPool

from rllm_torch import (
    ONE_PROCESS,
    AlgorithmConfig,
    Step,
    Trajectory,
    TrajectoryGroup,
    collect_reward_and_advantage_from_trajectory_groups,
)
from rllm_torch.core.errors import ConfigError, InvalidRewardsError, InvalidTrajectoryError
from rllm_torch.rllm.stepwise import turn_rewards
from rllm_torch.trainer import compute_token_advantages
from rllm_torch.trainer.pipeline.token_batch import build_token_batch

MODES = ("broadcast", "turn_level", "mt_grpo", "gigpo")


def trajectory(step_rewards, reward, observations=None, mask=None):
    observations = observations or [f"s{t}" for t in range(len(step_rewards))]
    steps = [
        Step(prompt_ids=[1, 2], response_ids=[3, 4, 5], reward=r, observation=o, response_mask=mask)
        for r, o in zip(step_rewards, observations, strict=True)
    ]
    return Trajectory(name="solver", steps=steps, reward=reward)


def groups():
    return [
        TrajectoryGroup(
            [trajectory([0.5, 0.0], 1.0), trajectory([0.0], 0.0), trajectory([0.5, 0.5, 0.0], 1.5, ["s0", "s0", "s2"])],
            group_id="a:solver",
            group_role="solver",
            task_id="a",
        ),
        TrajectoryGroup(
            [trajectory([-0.25, 0.0], 0.75), trajectory([-0.25, -0.25, 0.0], -0.5)],
            group_id="b:solver",
            group_role="solver",
            task_id="b",
        ),
    ]


def test_turn_rewards_add_up_to_the_trajectory_reward():
    assert turn_rewards(trajectory([0.5, 0.25, 9.0], 1.0), "t", "turn_level") == [0.5, 0.25, 0.25]
    assert turn_rewards(trajectory([0.0, 0.0], 1.0), "t", "turn_level") == [0.0, 1.0]  # outcome at the last turn
    assert turn_rewards(trajectory([0.25, 0.75], None), "t", "turn_level") == [0.25, 0.5]  # no reward: its last step's


def test_a_step_without_a_reward_names_the_step_and_the_setting():
    traj = trajectory([0.5, 0.0], 1.0)
    traj.steps[0].reward = None
    with pytest.raises(InvalidRewardsError, match=r"step 0: no reward.*rllm\.stepwise_advantage\.mode='turn_level'"):
        turn_rewards(traj, "t", "turn_level")
    traj.steps[0].reward = float("inf")
    with pytest.raises(InvalidRewardsError, match="not all finite"):
        turn_rewards(traj, "t", "turn_level")


def test_the_collector_writes_one_advantage_per_step():
    gs = groups()
    metrics = collect_reward_and_advantage_from_trajectory_groups(
        gs, AlgorithmConfig(estimator="rloo", stepwise_advantage_mode="turn_level")
    )
    # group a: returns (1, .5) / (0) / (1.5, 1, .5): rloo per turn among the members still running;
    # turn 2, which member 3 reached alone: its episode advantage, 1.5 - (1 + 0) / 2
    assert [[s.advantage for s in t.steps] for t in gs[0].trajectories] == [[0.25, -0.5], [-1.25], [1.0, 0.5, 1.0]]
    # group b: turn rewards (-.25, 1) / (-.25, -.25, 0); returns (.75, 1) / (-.5, -.25, 0); turn 2 alone: -.5 - .75
    assert [[s.advantage for s in t.steps] for t in gs[1].trajectories] == [[1.25, 1.25], [-1.25, -1.25, -1.25]]
    assert metrics["turns/solver/mean"] == 2.2
    assert metrics["advantage/solver/max"] == 1.25


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("estimator", ["rloo", "grpo", "opo"])
def test_the_trainer_and_the_collector_agree(mode, estimator):
    gs = groups()
    gs[1].trajectories[1].steps[1].response_mask = [1, 0, 0]  # a turn with fewer trained tokens (opo's weight)
    config = AlgorithmConfig(estimator=estimator, stepwise_advantage_mode=mode)
    batch = build_token_batch(gs, pad_token_id=0, stepwise_mode=mode)
    compute_token_advantages(batch, config)
    collect_reward_and_advantage_from_trajectory_groups(gs, config)
    want = torch.stack([s.token_advantages() for g in gs for t in g.trajectories for s in t.steps])
    torch.testing.assert_close(batch.advantages[:, 2:], want.float(), rtol=1e-6, atol=1e-6)


def test_normalize_by_steps_divides_by_the_trajectorys_steps():
    gs = groups()
    plain = build_token_batch(gs, pad_token_id=0)
    compute_token_advantages(plain, AlgorithmConfig(estimator="rloo"))
    divided = build_token_batch(gs, pad_token_id=0)
    compute_token_advantages(divided, AlgorithmConfig(estimator="rloo", normalize_by_steps=True))
    steps = torch.tensor([2, 2, 1, 3, 3, 3, 2, 2, 3, 3, 3], dtype=torch.float32)
    torch.testing.assert_close(divided.advantages, plain.advantages / steps[:, None])
    collect_reward_and_advantage_from_trajectory_groups(gs, AlgorithmConfig(estimator="rloo", normalize_by_steps=True))
    assert gs[0].trajectories[0].steps[0].advantage == pytest.approx(0.125)


def test_gigpo_needs_observations():
    gs = groups()
    gs[0].trajectories[1].steps[0].observation = None
    with pytest.raises(InvalidTrajectoryError, match=r"step 0: no observation.*'gigpo'"):
        build_token_batch(gs, pad_token_id=0, stepwise_mode="gigpo")
    with pytest.raises(InvalidTrajectoryError, match="no observation"):
        collect_reward_and_advantage_from_trajectory_groups(gs, AlgorithmConfig(stepwise_advantage_mode="gigpo"))


def test_observations_compare_by_content():
    gs = groups()
    for t, obs in zip(gs[0].trajectories, [{"a": [1, 2], "b": 0}, {"b": 0, "a": [1, 2]}, {"a": [1, 3]}], strict=True):
        t.steps[0].observation = obs
    batch = build_token_batch(gs, pad_token_id=0, stepwise_mode="gigpo")
    first = batch.observation_index[[0, 2, 3]].tolist()
    assert first[0] == first[1] != first[2]


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("mode", "per_turn", r"rllm\.stepwise_advantage\.mode='per_turn' is not one of \('broadcast', 'turn_level'"),
        ("gamma", 1.5, r"rllm\.stepwise_advantage\.gamma=1.5 is out of range; it must be in \[0, 1\]"),
        ("gamma", -0.1, r"rllm\.stepwise_advantage\.gamma"),
        ("step_advantage_w", float("nan"), r"rllm\.stepwise_advantage\.step_advantage_w"),
    ],
)
def test_bad_settings_name_the_key(key, value, match):
    with pytest.raises(ConfigError, match=match):
        AlgorithmConfig.from_config(OmegaConf.create({"rllm": {"stepwise_advantage": {key: value}}}))


def test_settings_that_cannot_work_together_are_refused():
    with pytest.raises(ConfigError, match="normalize_by_steps.*broadcast only"):
        AlgorithmConfig(stepwise_advantage_mode="turn_level", normalize_by_steps=True)
    with pytest.raises(ConfigError, match="estimator 'gdpo' cannot be run that way"):
        collect_reward_and_advantage_from_trajectory_groups(
            groups(), AlgorithmConfig(estimator="gdpo", stepwise_advantage_mode="turn_level")
        )
    batch = build_token_batch(groups(), pad_token_id=0, stepwise_mode="mt_grpo")
    with pytest.raises(ConfigError, match="estimator 'gae' cannot be run that way .it is token-level"):
        compute_token_advantages(batch, AlgorithmConfig(estimator="gae", stepwise_advantage_mode="mt_grpo"))
    with pytest.raises(ConfigError, match=r"build_token_batch\(\.\.\., stepwise_mode"):
        compute_token_advantages(
            build_token_batch(groups(), pad_token_id=0), AlgorithmConfig(stepwise_advantage_mode="gigpo")
        )
    with pytest.warns(DeprecationWarning, match="per_step"):
        assert AlgorithmConfig(stepwise_advantage_mode="per_step").stepwise_advantage_mode == "broadcast"


@pytest.fixture(scope="module")
def pool():
    ranks = RankPool(2)
    yield ranks
    ranks.close()


@pytest.mark.parametrize("mode", ["turn_level", "mt_grpo", "gigpo"])
def test_two_ranks_equal_one_process(pool, mode):
    spec = [
        dict(
            task_id=f"t{g}",
            role="solver",
            rewards=[float(g % 3), 0.5, 1.0, 0.0][: 2 + g % 3],
            steps=1 + g % 3,
            vary_steps=True,
        )
        for g in range(6)
    ]
    config = dict(estimator="grpo", stepwise_advantage_mode=mode, stepwise_gamma=0.9)
    one, one_metrics = rank_tasks.collect(spec, config, process_group=ONE_PROCESS)
    parts = pool.run_ok(rank_tasks.collect_turns, [(spec[r::2], config) for r in range(2)])
    assert parts[0][0] == one[0::2] and parts[1][0] == one[1::2]
    assert parts[0][1] == parts[1][1]
    for key in ("advantage/solver/mean", "advantage/solver/std", "turns/solver/mean", "reward/solver/mean"):
        assert parts[0][1][key] == pytest.approx(one_metrics[key], rel=1e-12, abs=1e-12)


def test_the_kl_penalty_in_the_reward_comes_off_each_turns_reward():
    from rllm_torch.core.estimators import rloo, turn_level_advantages
    from rllm_torch.core.turns import GroupedTurns

    batch = build_token_batch(groups(), pad_token_id=0, stepwise_mode="turn_level")
    penalty_RT = torch.rand(batch.response_mask.shape, generator=torch.Generator().manual_seed(0)) * batch.response_mask
    batch.reward_penalty = penalty_RT
    compute_token_advantages(batch, AlgorithmConfig(estimator="rloo", stepwise_advantage_mode="turn_level"))
    rewards_R = batch.turn_rewards - penalty_RT.sum(-1).double()
    turns = GroupedTurns.from_flat(rewards_R, batch.row_index, batch.group_index, num_groups=2)
    want_R, _ = turn_level_advantages(turns, rloo)
    torch.testing.assert_close(batch.advantages, (want_R[:, None] * batch.response_mask).float())


def test_estimators_whose_k_exceeds_the_running_members_are_refused_in_turn_modes():
    for estimator in ("pass_at_k", "grpo_passk"):
        with pytest.raises(ConfigError, match=f"estimator '{estimator}' cannot be run that way .its k"):
            collect_reward_and_advantage_from_trajectory_groups(
                groups(), AlgorithmConfig(estimator=estimator, stepwise_advantage_mode="turn_level")
            )


def test_observations_of_different_kinds_never_share_a_step_group():
    from rllm_torch.rllm.stepwise import ObservationIds

    ids = ObservationIds()
    kinds = [{"a": 1}, [("'a'", 1)], torch.tensor([1, 2]), ((2,), (1, 2)), (1, 2), [1, 2]]
    assert [ids(k, "t") for k in kinds] == [0, 1, 2, 3, 4, 4]  # a list and a tuple of equal items meet


def test_a_bad_stepwise_mode_for_the_batch_is_refused():
    with pytest.raises(ConfigError, match="stepwise_mode must be one of"):
        build_token_batch(groups(), pad_token_id=0, stepwise_mode="bogus")
    batch = build_token_batch(groups(), pad_token_id=0, stepwise_mode="turn_level")
    with pytest.raises(ConfigError, match="and gigpo its observation"):
        compute_token_advantages(batch, AlgorithmConfig(stepwise_advantage_mode="gigpo"))
