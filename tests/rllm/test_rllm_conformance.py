"""rLLM's own calls give rLLM's numbers. Every expected value below is what rLLM's code gives for
the same call (rLLM main at 9beb6e0f, 2026-08-15: ``rllm/trainer/algorithms/*``, ``rllm/types.py``),
with the arithmetic in a comment; where rllm_torch differs on purpose, ``compat="rllm"`` gives
rLLM's value and the default is pinned beside it."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rllm_torch import (
    RLLM_ADV_ESTIMATOR_REGISTRY,
    AlgorithmConfig,
    Episode,
    GroupedRewards,
    RolloutCorrectionConfig,
    Step,
    Trajectory,
    TrajectoryGroup,
    calculate_echo_advantages,
    calculate_grpo_advantages,
    calculate_reinforce_advantages,
    calculate_reinforce_plus_plus_baseline_advantages,
    calculate_rloo_advantages,
    collect_reward_and_advantage_from_trajectory_groups,
    compute_advantages,
    get_rllm_adv_estimator,
    register_adv_estimator,
)
from rllm_torch.core.errors import ConfigError, InvalidRewardsError
from rllm_torch.trainer import (
    RejectionSamplingConfig,
    RejectionSamplingState,
    apply_rejection_sampling_and_filtering,
    transform_episodes_to_trajectory_groups,
)
from rllm_torch.trainer.logs.step_metrics import workflow_metrics

EPS = 1e-6


def _traj(name: str, reward: float, tokens: int = 2) -> Trajectory:
    return Trajectory(name=name, reward=reward, steps=[Step(response_ids=list(range(1, tokens + 1)))])


def _step_advantages(group: TrajectoryGroup) -> list:
    return [s.advantage for t in group.trajectories for s in t.steps]


# 1. both of rLLM's signatures, nothing swallowed ----------------------------------------------


def test_grpo_called_with_rllm_algorithm_config_honours_it_by_keyword_and_positionally():
    rewards, config = [np.array([1.0, 0.0, 0.0, 0.0])], AlgorithmConfig(norm_adv_by_std_in_grpo=False)
    # rLLM: mean .25, no std division -> [.75, -.25, -.25, -.25]
    for adv, _ in (
        get_rllm_adv_estimator("grpo")(rewards=rewards, algorithm_config=config),
        get_rllm_adv_estimator("grpo")(rewards, config),
        calculate_grpo_advantages(rewards, algorithm_config=config, traj_groups=[None]),
    ):
        np.testing.assert_allclose(adv[0], [0.75, -0.25, -0.25, -0.25], rtol=0, atol=1e-15)


def test_the_seed_signature_of_grpo_still_binds_its_positional_options():
    rewards = [np.array([1.0, 0.0, 0.0, 0.0])]
    np.testing.assert_allclose(calculate_grpo_advantages(rewards, False)[0][0], [0.75, -0.25, -0.25, -0.25])
    np.testing.assert_allclose(
        calculate_grpo_advantages(rewards, norm_adv_by_std_in_grpo=False)[0][0], [0.75, -0.25, -0.25, -0.25]
    )
    with pytest.warns(DeprecationWarning, match="episilon"):
        adv, _ = calculate_grpo_advantages(rewards, True, 0.5)  # std .433: .75 / (.433 + .5)
    np.testing.assert_allclose(adv[0][0], 0.75 / (np.sqrt(3) / 4 + 0.5))


def test_rllm_default_config_gives_rllm_grpo_values_groups_of_one_included():
    # rLLM: std of [1,0,0,0] = sqrt(3)/4 -> .75 / (.4330127 + 1e-6) = 1.73204681; a group of one: mean 0, std 1
    adv, _ = calculate_grpo_advantages([np.array([1.0, 0.0, 0.0, 0.0]), np.array([2.0])], AlgorithmConfig())
    np.testing.assert_allclose(adv[0], [1.73204681, -0.57734894, -0.57734894, -0.57734894], rtol=1e-7)
    np.testing.assert_allclose(adv[1], [1.999998], rtol=1e-7)


def test_an_option_given_as_keyword_and_in_the_config_with_two_values_takes_the_configs_with_a_warning():
    # rLLM's calculate_grpo_advantages reads algorithm_config.norm_adv_by_std_in_grpo and drops the keyword
    config = AlgorithmConfig(norm_adv_by_std_in_grpo=True)
    with pytest.warns(UserWarning, match="norm_adv_by_std_in_grpo=False as a keyword and algorithm_config.norm_adv"):
        adv, _ = calculate_grpo_advantages([np.array([1.0, 0.0])], config, norm_adv_by_std_in_grpo=False)
    np.testing.assert_allclose(adv[0], [0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS)])  # divided by the std, as the config
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        agree, _ = calculate_grpo_advantages([np.array([1.0, 0.0])], config, norm_adv_by_std_in_grpo=True)
    np.testing.assert_allclose(agree[0], [1 / (0.5 + EPS) * 0.5, -1 / (0.5 + EPS) * 0.5])
    batch = GroupedRewards.from_groups([[1.0, 0.0]])
    config = AlgorithmConfig(estimator_options={"pass_at_k": {"k": 2}})
    with pytest.warns(UserWarning, match=r"k=1 as a keyword and .*\['pass_at_k'\]\['k'\]=2 differ"):
        by_config, _ = compute_advantages(batch, "pass_at_k", algorithm_config=config, k=1)
    torch.testing.assert_close(by_config, compute_advantages(batch, "pass_at_k", k=2)[0])


def test_epsilon_given_as_a_keyword_is_used_where_the_config_leaves_it_at_its_default_as_rllm_reads_it():
    # rLLM's AlgorithmConfig has no epsilon: calculate_reinforce_plus_plus_baseline_advantages(rewards, config,
    # epsilon=1e-3) reads the keyword. [1, 0, 0, 0]: centred [.75, -.25, -.25, -.25], std sqrt(3)/4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        adv, _ = calculate_reinforce_plus_plus_baseline_advantages(
            [np.array([1.0, 0.0, 0.0, 0.0])], AlgorithmConfig(), epsilon=1e-3
        )
    np.testing.assert_allclose(adv[0], np.array([0.75, -0.25, -0.25, -0.25]) / (np.sqrt(3) / 4 + 1e-3), rtol=1e-12)


@pytest.mark.parametrize(
    ("fn", "keywords"),
    [
        (calculate_grpo_advantages, {"epsilon": 0.5}),
        (calculate_grpo_advantages, {"episilon": 0.5}),  # rLLM's spelling, dropped alike
        (calculate_grpo_advantages, {"std_correction": 1}),
        (calculate_rloo_advantages, {"epsilon": 0.5}),
        (calculate_reinforce_advantages, {"gamma": 0.5}),
        (calculate_echo_advantages, {"epsilon": 0.5}),  # rLLM terminal-rl's: GRPO's, dropping every keyword
    ],
)
def test_a_keyword_rllms_function_drops_is_dropped_here_with_one_line_and_rllms_numbers(fn, keywords):
    # rLLM main's calculate_grpo_advantages(rewards, algorithm_config, **kwargs) takes nothing from kwargs: its
    # epsilon is 1e-6 whatever is passed. [1, 0, 0, 0]: 0.75 / (sqrt(3) / 4 + 1e-6) and -0.25 / (...)
    rewards = [np.array([1.0, 0.0, 0.0, 0.0])]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plain, _ = fn(rewards, AlgorithmConfig())
    option = next(iter(keywords)).replace("episilon", "epsilon")
    with pytest.warns(
        UserWarning, match=rf"{option}=\S+ as a keyword is dropped, as rLLM's calculate_\w+ drops every keyword"
    ):
        dropped, _ = fn(rewards, AlgorithmConfig(), **keywords)
    np.testing.assert_array_equal(dropped[0], plain[0])
    if fn in (calculate_grpo_advantages, calculate_echo_advantages):
        np.testing.assert_allclose(
            plain[0], np.array([0.75, -0.25, -0.25, -0.25]) / (np.sqrt(3) / 4 + 1e-6), rtol=1e-12
        )
    # the seed's form, (rewards, norm_adv_by_std_in_grpo, episilon), still reads its epsilon
    if keywords == {"episilon": 0.5}:
        with pytest.warns(DeprecationWarning):
            seed, _ = fn(rewards, True, 0.5)
        np.testing.assert_allclose(seed[0], np.array([0.75, -0.25, -0.25, -0.25]) / (np.sqrt(3) / 4 + 0.5), rtol=1e-12)


def test_nothing_that_carries_an_option_is_swallowed_by_kwargs():
    with pytest.raises(ConfigError, match="takes no option 'not_an_option'"):
        get_rllm_adv_estimator("rloo")([np.array([1.0, 0.0])], AlgorithmConfig(), not_an_option=1)
    with pytest.raises(ConfigError, match="must be an AlgorithmConfig"):
        get_rllm_adv_estimator("grpo")([np.array([1.0, 0.0])], {"norm_adv_by_std_in_grpo": False})
    with pytest.raises(ConfigError, match="must be an AlgorithmConfig"):
        compute_advantages(GroupedRewards.from_groups([[1.0, 0.0]]), "grpo", algorithm_config={"x": 1})


# 2. the role of a group comes from its group id ----------------------------------------------


def test_the_role_comes_from_the_group_id_and_picks_the_estimator_of_estimator_map():
    group = TrajectoryGroup([_traj("judge_0", 1.0), _traj("judge_1", 0.0)], group_id="t0:judge")
    metrics = collect_reward_and_advantage_from_trajectory_groups(
        [group], AlgorithmConfig(estimator_map={"judge": "reinforce"})
    )
    assert _step_advantages(group) == [1.0, 0.0]  # rLLM: REINFORCE, the rewards themselves
    # rLLM's keys for this call, exactly (ours adds none: no untrained trajectory)
    assert sorted(metrics) == sorted(
        [f"{kind}/judge/{stat}" for kind in ("advantage", "reward") for stat in ("max", "mean", "min", "std")]
        + ["advantage/judge/fraction_zero", "batch/judge/total", "batch/judge/informative"]
        + [f"batch/judge/fractions/{k}" for k in ("effective", "too_easy", "too_hard")]
        + [f"batch/judge/group_reward_{s}/p{p}" for s in ("mean", "std") for p in (10, 50, 90)]
    )


# 3. from_config on rLLM's section ---------------------------------------------------------


def test_from_config_reads_rllm_algorithm_section_and_rllm_keywords():
    section = OmegaConf.create({"adv_estimator": "rloo", "norm_adv_by_std_in_grpo": False})
    config = AlgorithmConfig.from_config(section)
    assert (config.estimator.value, config.norm_adv_by_std_in_grpo) == ("rloo", False)  # rLLM: rloo / False
    config = AlgorithmConfig.from_config(
        OmegaConf.create({"adv_estimator": "grpo", "eps_clip": 0.3, "rollout_correction": {"tis_mode": "token"}}),
        stepwise_advantage_mode="per_step",  # rLLM: deprecated, becomes broadcast
        estimator_map={"solver": ("grpo", "gspo")},
    )
    assert config.eps_clip == 0.3 and config.rollout_correction.tis_mode == "token"
    assert config.stepwise_advantage_mode == "broadcast"
    assert config.estimator_map == {"solver": "grpo"} and config.loss_fn_map == {"solver": "gspo"}
    whole = OmegaConf.create(
        {"rllm": {"algorithm": {"adv_estimator": "rloo"}, "stepwise_advantage": {"mode": "turn_level"}}}
    )
    assert AlgorithmConfig.from_config(whole).stepwise_advantage_mode == "turn_level"
    with pytest.raises(ConfigError, match="'adv_estimatr' is not a key of the rllm.algorithm section"):
        AlgorithmConfig.from_config(OmegaConf.create({"adv_estimatr": "rloo"}))
    with pytest.raises(ConfigError, match="differ"):
        AlgorithmConfig.from_config(whole, stepwise_advantage_mode="broadcast")


# 4. a custom estimator with rLLM's documented signature sees traj_groups ------------------------


@register_adv_estimator("conformance_length_weighted")
def _length_weighted(rewards, algorithm_config, **kwargs):
    """rLLM docs' OPO example: the baseline is the length-weighted mean reward of the group."""
    out = []
    for r, group in zip(rewards, kwargs["traj_groups"], strict=True):
        lengths = np.array([sum(len(s.response_ids) for s in t.steps) for t in group.trajectories], dtype=float)
        out.append(r - (lengths * r).sum() / lengths.sum())
    _length_weighted.config = algorithm_config
    return out, out


def test_a_custom_estimator_with_rllm_signature_gets_the_config_and_the_groups():
    group = TrajectoryGroup([_traj("s", 1.0, tokens=3), _traj("s", 0.0, tokens=1)], group_id="t1:s")
    config = AlgorithmConfig(estimator_map={"s": "conformance_length_weighted"})
    collect_reward_and_advantage_from_trajectory_groups([group], config)
    assert _step_advantages(group) == [0.25, -0.75]  # rLLM: baseline (3*1 + 1*0) / 4 = .75
    assert _length_weighted.config is config
    assert "conformance_length_weighted" in RLLM_ADV_ESTIMATOR_REGISTRY


def test_traj_groups_hold_exactly_the_trajectories_whose_rewards_the_estimator_gets():
    untrained = Trajectory(name="s", reward=5.0, steps=[Step(response_ids=[1, 2], response_mask=[0, 0])])
    group = TrajectoryGroup([_traj("s", 1.0, tokens=3), untrained, _traj("s", 0.0, tokens=1)], group_id="t1:s")
    collect_reward_and_advantage_from_trajectory_groups(
        [group], AlgorithmConfig(estimator_map={"s": "conformance_length_weighted"})
    )
    assert _step_advantages(group) == [0.25, 0.0, -0.75]  # the untrained one takes no part (and gets 0)


@register_adv_estimator("conformance_names_seen")
def _names_seen(rewards, algorithm_config, **kwargs):
    """Records which trajectories each group's view holds; advantages: the length-weighted ones."""
    _names_seen.groups = [[t.name for t in g.trajectories] for g in kwargs["traj_groups"]]
    return _length_weighted(rewards, algorithm_config, **kwargs)


def test_a_later_groups_traj_groups_view_holds_its_own_trained_trajectories_found_by_their_rows_in_the_batch():
    """Two groups of three, one untrained trajectory in each, at different places: the second
    group's members are the flat rows 3, 4, 5, so its trained ones are found by flat row, not by
    the position in the group (which would take y0 and the untrained y2 instead of y0 and y1)."""

    def untrained(name):
        return Trajectory(name=name, reward=5.0, steps=[Step(response_ids=[1, 2], response_mask=[0, 0])])

    first = TrajectoryGroup([_traj("x0", 1.0, 3), untrained("x1"), _traj("x2", 0.0, 1)], group_id="t1:s")
    second = TrajectoryGroup([_traj("y0", 1.0, 1), _traj("y1", 0.0, 3), untrained("y2")], group_id="t2:s")
    collect_reward_and_advantage_from_trajectory_groups(
        [first, second], AlgorithmConfig(estimator_map={"s": "conformance_names_seen"})
    )
    assert _names_seen.groups == [["x0", "x2"], ["y0", "y1"]]
    assert _step_advantages(first) == [0.25, 0.0, -0.75]  # baseline (3*1 + 1*0) / 4 = .75
    assert _step_advantages(second) == [0.75, -0.25, 0.0]  # baseline (1*1 + 3*0) / 4 = .25


# 5. rLLM's AlgorithmConfig fields and names ---------------------------------------------------


def test_algorithm_config_has_rllm_fields_and_names():
    config = AlgorithmConfig(
        warmup_steps=10,
        eps_clip=0.28,
        eps_clip_high=0.3,
        loss_agg_mode="seq-mean-token-mean",
        rollout_correction=RolloutCorrectionConfig(tis_mode="token", tis_cap=5.0),
        router_replay="disabled",
        estimator_map={"solver": ("grpo", "gspo")},
    )
    assert (config.warmup_steps, config.eps_clip, config.eps_clip_high, config.kl_beta) == (10, 0.28, 0.3, 0.0)
    assert config.loss_fn_for("solver") == "gspo" and config.rollout_correction.tis_cap == 5.0
    with pytest.raises(ConfigError, match="router_replay='R3' is not one of"):
        AlgorithmConfig(router_replay="R3")
    with pytest.raises(ConfigError, match="no field 'tis'"):
        AlgorithmConfig(rollout_correction={"tis": "token"})


# 6. the task id from the episode id ----------------------------------------------------------


def test_episodes_with_ids_only_are_grouped_by_task_as_in_rllm():
    assert Episode(id="t0:0").task_id == "t0"
    episodes = [Episode(id=f"t{i // 2}:{i % 2}", trajectories=[_traj("s", float(i))]) for i in range(4)]
    groups, _ = transform_episodes_to_trajectory_groups(episodes)
    assert [(g.group_id, g.group_role, len(g.trajectories)) for g in groups] == [("t0:s", "s", 2), ("t1:s", "s", 2)]


def test_an_unnamed_trajectory_gets_rllm_imputed_name_and_role():
    episode = Episode(id="q:0", trajectories=[Trajectory(reward=1.0, steps=[Step(response_ids=[1])])])
    groups, _ = transform_episodes_to_trajectory_groups([episode])
    assert [(g.group_id, g.group_role) for g in groups] == [("q:default_traj_name_0", "default_traj_name_0")]


# 7. rejection sampling, difficulty metrics, termination counting --------------------------------


def test_rejection_sampling_mode_none_drops_a_group_of_one_and_counts_it_as_rllm():
    episodes = [
        Episode(id="t0:0", trajectories=[_traj("s", 1.0)], is_correct=True),
        Episode(id="t1:0", trajectories=[_traj("s", 1.0)], is_correct=True),
        Episode(id="t1:1", trajectories=[_traj("s", 0.0)]),
    ]
    groups, _ = transform_episodes_to_trajectory_groups(episodes)
    kept, _, metrics = apply_rejection_sampling_and_filtering(
        episodes, groups, RejectionSamplingConfig(mode="none"), RejectionSamplingState()
    )
    assert [g.group_id for g in kept] == ["t1:s"]
    rllm = {  # rLLM's dict for this call (t0's only trajectory was dropped: its task is not counted)
        "batch/num_tasks": 1,
        "batch/solve_none": 0.0,
        "batch/solve_all": 0.0,
        "batch/solve_partial": 1.0,
        "batch/groups_before_filter": 2,
        "batch/groups_after_filter": 1,
        "batch/groups_dropped_insufficient_trajs": 1,
    }
    assert {k: metrics[k] for k in rllm} == rllm


def test_difficulty_metrics_have_rllm_keys_and_values():
    rewards = [[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0], [0.5, 0.5]]
    groups = [TrajectoryGroup([_traj("s", r) for r in rr], group_id=f"t{i}:s") for i, rr in enumerate(rewards)]
    metrics = collect_reward_and_advantage_from_trajectory_groups(groups, AlgorithmConfig())
    rllm = {  # rLLM's values for the same groups
        "batch/s/total": 5,
        "batch/s/informative": 1,
        "batch/s/fractions/effective": 0.2,
        "batch/s/fractions/too_easy": 0.2,
        "batch/s/fractions/too_hard": 0.4,
        "batch/s/group_reward_mean/p10": 0.0,
        "batch/s/group_reward_std/p10": 0.0,
        "batch/s/group_reward_mean/p50": 0.5,
        "batch/s/group_reward_std/p50": 0.0,
        "batch/s/group_reward_mean/p90": 0.8,
        "batch/s/group_reward_std/p90": 0.3,
    }
    assert {k: v for k, v in metrics.items() if k.startswith("batch/")} == pytest.approx(rllm, abs=1e-12)


def test_an_episode_without_termination_reason_counts_as_unknown():
    metrics = workflow_metrics([Episode(id="a:0"), Episode(id="a:1", termination_reason="env_done")], prefix="batch")
    assert metrics["batch/termination_reason/unknown"] == 0.5 and metrics["batch/termination_reason/env_done"] == 0.5


# 8. deliberate differences: one option away ---------------------------------------------------


def test_reinforce_plus_plus_baseline_group_of_one_differs_on_purpose_and_compat_gives_rllm():
    rewards = [np.array([1.0]), np.array([1.0, 0.0])]
    # ours (rLLM's docstring, verl): c = [1, .5, -.5], std(c) = sqrt(42/108) -> [1.60, .80, -.80]
    ours, _ = calculate_reinforce_plus_plus_baseline_advantages(rewards, AlgorithmConfig())
    np.testing.assert_allclose(np.concatenate(ours), [1.6035649, 0.8017824, -0.8017824], rtol=1e-6)
    # rLLM's code: c = [0, .5, -.5], std(c) = sqrt(1/6) -> [0, 1.2247, -1.2247]
    rllm, _ = calculate_reinforce_plus_plus_baseline_advantages(rewards, AlgorithmConfig(compat="rllm"))
    np.testing.assert_allclose(np.concatenate(rllm), [0.0, 1.22474187, -1.22474187], rtol=1e-7)


def test_a_precomputed_advantage_of_the_wrong_length_raises_and_compat_gives_rllm_zeros():
    def group():
        step = Step(response_ids=[1, 2, 3], advantage=[0.5, 0.5])
        return TrajectoryGroup([Trajectory(name="s", reward=1.0, steps=[step])], group_id="t:s")

    with pytest.raises(InvalidRewardsError, match="2 entries but the step has 3"):
        collect_reward_and_advantage_from_trajectory_groups([group()], AlgorithmConfig(use_precomputed_advantage=True))
    g = group()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = collect_reward_and_advantage_from_trajectory_groups(
            [g], AlgorithmConfig(use_precomputed_advantage=True, compat="rllm")
        )
    assert _step_advantages(g) == [[0.0, 0.0, 0.0]]  # rLLM: zeros, with a warning
    assert any("get zeros" in str(w.message) for w in caught)
    assert metrics["advantage/s/fraction_zero"] == 1.0 and metrics["advantage/s/max"] == 0.0


def test_the_compat_package_mirrors_rllm_paths_old_and_new_onto_the_one_implementation():
    from rllm_torch.compat.rllm import trainer as rllm_trainer
    from rllm_torch.compat.rllm.experimental.common import advantage as old_advantage
    from rllm_torch.compat.rllm.trainer.algorithms import advantage, config, loss, rl_algo
    from rllm_torch.compat.rllm.types import TrajectoryGroup as CompatGroup
    from rllm_torch.compat.rllm.workflows.workflow import TerminationEvent

    assert advantage.get_rllm_adv_estimator is get_rllm_adv_estimator is old_advantage.get_rllm_adv_estimator
    assert config.AlgorithmConfig is AlgorithmConfig and CompatGroup is TrajectoryGroup
    assert rl_algo.calculate_grpo_advantages_per_group(np.array([1.0, 0.0]))[0] == pytest.approx([1.0, -1.0], rel=1e-5)
    assert advantage.RLLM_ADV_ESTIMATOR_REGISTRY is RLLM_ADV_ESTIMATOR_REGISTRY
    assert loss.register_loss is not None and issubclass(TerminationEvent, Exception)
    assert rllm_trainer.AgentTrainer.__name__ == "AgentTrainer"
