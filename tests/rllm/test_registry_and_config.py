"""The rLLM public surface: registry, custom estimators, rLLMAdvantageEstimator, AlgorithmConfig."""

import inspect
import warnings

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import rllm_torch
from rllm_torch import (
    AlgorithmConfig,
    ConfigError,
    EstimatorOutputError,
    GroupedRewards,
    calculate_grpo_advantages,
    calculate_grpo_advantages_per_group,
    calculate_rloo_advantages_per_group,
    compute_advantages,
    get_rllm_adv_estimator,
    register_rllm_adv_estimator,
    rLLMAdvantageEstimator,
)
from rllm_torch.rllm.types import Trajectory, TrajectoryGroup


def test_an_rllm_style_custom_estimator_registers_and_runs_unchanged():
    @register_rllm_adv_estimator("test_max_baseline")
    def max_baseline(rewards: list[np.ndarray], **kwargs):
        advantages = [r - r.max() for r in rewards]
        return advantages, advantages

    assert get_rllm_adv_estimator("test_max_baseline") is max_baseline
    batch = GroupedRewards.from_flat(torch.tensor([1.0, 5.0, 2.0, 3.0]), torch.tensor([1, 0, 1, 0]))
    adv, ret = compute_advantages(batch, "test_max_baseline")
    # group 0 = [5, 3] -> [0, -2]; group 1 = [1, 2] -> [-1, 0]; back in flat order
    assert adv.tolist() == [-1.0, 0.0, 0.0, -2.0] and ret.tolist() == adv.tolist()


def test_a_tensor_custom_estimator_gets_only_the_options_it_declares():
    seen = {}

    @register_rllm_adv_estimator("test_scaled", form="tensors")
    def scaled(batch, *, epsilon):
        seen["epsilon"] = epsilon
        adv = batch.rewards.double() * 2
        return adv, adv

    adv, _ = compute_advantages(GroupedRewards.from_groups([[1.0, 2.0]]), "test_scaled", epsilon=0.25)
    assert adv.tolist() == [2.0, 4.0] and seen == {"epsilon": 0.25}


def test_a_custom_estimator_returning_the_wrong_shape_is_reported():
    @register_rllm_adv_estimator("test_broken", form="tensors")
    def broken(batch):
        return batch.rewards[:1], batch.rewards[:1]

    with pytest.raises(
        EstimatorOutputError, match="'test_broken' returned advantages of shape \\(1,\\); expected \\(3,\\)"
    ):
        compute_advantages(GroupedRewards.from_groups([[1.0, 2.0, 3.0]]), "test_broken")

    @register_rllm_adv_estimator("test_broken_groups")
    def broken_groups(rewards, **kwargs):
        return rewards[:1], rewards[:1]

    with pytest.raises(EstimatorOutputError, match="for 1 groups; the batch has 2"):
        compute_advantages(GroupedRewards.from_groups([[1.0], [2.0]]), "test_broken_groups")


def test_traj_groups_with_a_default_may_be_left_out_and_without_one_must_be_given():
    """rLLM passes ``traj_groups`` when it has them: a parameter with a default is optional (a call
    without groups runs, the default stays), one without a default is required (such a call is a
    ConfigError naming the way to give them, not a TypeError from inside the call)."""
    seen = {}

    @register_rllm_adv_estimator("test_groups_optional")
    def optional(rewards, algorithm_config, traj_groups=None):
        seen["optional"] = traj_groups
        return [r - r.mean() for r in rewards], rewards

    @register_rllm_adv_estimator("test_groups_required")
    def required(rewards, algorithm_config, traj_groups):
        seen["required"] = traj_groups
        return [r - r.mean() for r in rewards], rewards

    batch = GroupedRewards.from_groups([[1.0, 0.0], [3.0]])
    groups = [
        TrajectoryGroup([Trajectory(name="a"), Trajectory(name="b")], group_id="t0:s"),
        TrajectoryGroup([Trajectory(name="c")], group_id="t1:s"),
    ]
    # means 0.5 and 3: [1 - .5, 0 - .5, 3 - 3]
    adv, _ = compute_advantages(batch, "test_groups_optional")
    assert adv.tolist() == [0.5, -0.5, 0.0] and seen["optional"] is None
    adv, _ = compute_advantages(batch, "test_groups_optional", traj_groups=groups)
    assert adv.tolist() == [0.5, -0.5, 0.0] and seen["optional"] == groups
    with pytest.raises(ConfigError, match="estimator 'test_groups_required' takes traj_groups .* pass traj_groups="):
        compute_advantages(batch, "test_groups_required")
    assert "required" not in seen
    adv, _ = compute_advantages(batch, "test_groups_required", traj_groups=groups)
    assert adv.tolist() == [0.5, -0.5, 0.0] and seen["required"] == groups


def test_registering_a_name_again_warns_and_replaces():
    register_rllm_adv_estimator("test_twice", form="tensors")(
        lambda batch: (batch.rewards.float(), batch.rewards.float())
    )
    with pytest.warns(UserWarning, match="'test_twice' is registered again"):
        register_rllm_adv_estimator("test_twice", form="tensors")(
            lambda batch: (-batch.rewards.float(), -batch.rewards.float())
        )
    assert compute_advantages(GroupedRewards.from_groups([[1.0]]), "test_twice")[0].tolist() == [-1.0]


def test_builtins_are_registered_under_the_enum_values():
    for member in ("grpo", "rloo", "reinforce", "reinforce_plus_plus_baseline", "prpo"):
        assert get_rllm_adv_estimator(member) is get_rllm_adv_estimator(rLLMAdvantageEstimator(member))
    assert get_rllm_adv_estimator(rLLMAdvantageEstimator.GRPO) is calculate_grpo_advantages


def test_the_enum_keeps_rllm_missing_fallback():
    assert rLLMAdvantageEstimator("prpo") is rLLMAdvantageEstimator.PRPO
    assert rLLMAdvantageEstimator("my_custom") is rLLMAdvantageEstimator.OTHER


def test_custom_names_in_a_config_stay_custom():
    config = OmegaConf.create(
        {"rllm": {"algorithm": {"adv_estimator": "my_custom", "estimator_map": {"judge": "rloo"}}}}
    )
    algo = AlgorithmConfig.from_config(config)
    assert algo.estimator == "my_custom" and not isinstance(algo.estimator, rLLMAdvantageEstimator)
    assert algo.estimator_for("judge") is rLLMAdvantageEstimator.RLOO
    assert algo.estimator_for("solver") == "my_custom"


def test_from_config_reads_rllm_keys():
    config = OmegaConf.create(
        {
            "algorithm": {"adv_estimator": "rloo"},
            "rllm": {
                "stepwise_advantage": {"mode": "broadcast", "norm_adv_by_std_in_grpo": False},
                "algorithm": {
                    "use_precomputed_advantage": True,
                    "loss_fn": "ppo",
                    "lr_schedule": "cosine",
                    "warmup_steps_ratio": 0.1,
                    "epsilon": 1e-4,
                    "std_correction": 1,
                },
            },
        }
    )
    algo = AlgorithmConfig.from_config(config)
    assert (algo.estimator, algo.norm_adv_by_std_in_grpo, algo.use_precomputed_advantage) == (
        rLLMAdvantageEstimator.RLOO,
        False,
        True,
    )
    assert (algo.loss_fn, algo.lr_schedule, algo.warmup_steps_ratio, algo.epsilon, algo.std_correction) == (
        "ppo",
        "cosine",
        0.1,
        1e-4,
        1,
    )
    assert algo.estimator_kwargs == {
        "norm_adv_by_std_in_grpo": False,
        "epsilon": 1e-4,
        "std_correction": 1,
        "gamma": 1.0,
        "lam": 1.0,
    }


def test_from_config_rejects_conflicting_values():
    config = OmegaConf.create(
        {"algorithm": {"adv_estimator": "rloo"}, "rllm": {"algorithm": {"adv_estimator": "grpo"}}}
    )
    with pytest.raises(ValueError, match="conflicting values"):
        AlgorithmConfig.from_config(config)


def test_per_step_mode_is_deprecated_to_broadcast():
    with pytest.warns(DeprecationWarning, match="per_step"):
        algo = AlgorithmConfig(stepwise_advantage_mode="per_step")
    assert algo.stepwise_advantage_mode == "broadcast"


def test_episilon_spelling_still_works_with_a_warning():
    with pytest.warns(DeprecationWarning, match="use `epsilon`"):
        adv, _ = calculate_grpo_advantages([np.array([0.0, 1.0])], True, 0.5)
    np.testing.assert_allclose(adv[0], [-0.5, 0.5])
    with pytest.warns(DeprecationWarning, match="episilon"):
        algo = AlgorithmConfig.from_config(OmegaConf.create({"rllm": {"algorithm": {"episilon": 0.1}}}))
    assert algo.epsilon == 0.1


def test_compute_advantages_takes_the_episilon_spelling_too_with_a_warning():
    batch = GroupedRewards.from_padded(torch.tensor([[1.0, 0.0, 0.0]]))
    with pytest.warns(DeprecationWarning, match="`episilon` is deprecated; use `epsilon`"):
        adv, _ = compute_advantages(batch, "grpo", episilon=0.5)
    assert torch.equal(adv, compute_advantages(batch, "grpo", epsilon=0.5)[0])
    assert not torch.equal(adv, compute_advantages(batch, "grpo")[0])  # 0.5 was used, not the default
    with (
        pytest.warns(DeprecationWarning),
        pytest.raises(ConfigError, match="epsilon=0.2 and the deprecated episilon=0.5"),
    ):
        compute_advantages(batch, "grpo", epsilon=0.2, episilon=0.5)


def test_rloo_per_group_on_a_group_of_one_returns_a_pair():
    adv, ret = calculate_rloo_advantages_per_group(np.array([0.7]))
    np.testing.assert_allclose(adv, [0.7])
    np.testing.assert_allclose(ret, [0.7])
    adv, ret = calculate_grpo_advantages_per_group(np.array([1.0, 0.0]))
    np.testing.assert_allclose(adv, [1 / (0.5 + 1e-6) * 0.5, -1 / (0.5 + 1e-6) * 0.5])


def test_rllm_signatures_are_pinned():
    params = lambda fn: list(inspect.signature(fn).parameters)  # noqa: E731
    # rLLM's today (rewards, algorithm_config, ...); the seed's positional options still bind (test_rllm_conformance.py)
    assert params(rllm_torch.calculate_grpo_advantages)[:3] == ["rewards", "algorithm_config", "episilon"]
    assert params(rllm_torch.calculate_reinforce_plus_plus_baseline_advantages)[:3] == [
        "rewards",
        "algorithm_config",
        "epsilon",
    ]
    assert params(rllm_torch.calculate_prpo_advantages)[:3] == ["rewards", "algorithm_config", "epsilon"]
    assert params(rllm_torch.calculate_rloo_advantages)[:2] == ["rewards", "algorithm_config"]
    assert params(rllm_torch.calculate_reinforce_advantages)[:2] == ["rewards", "algorithm_config"]
    assert params(rllm_torch.calculate_grpo_advantages_per_group)[:3] == [
        "rewards",
        "norm_adv_by_std_in_grpo",
        "episilon",
    ]
    assert params(rllm_torch.calculate_rloo_advantages_per_group) == ["rewards"]
    assert params(rllm_torch.register_rllm_adv_estimator)[0] == "name"
    assert params(rllm_torch.get_rllm_adv_estimator) == ["name"]
    fields = list(inspect.signature(AlgorithmConfig).parameters)
    assert fields[:17] == [  # rLLM main at 9beb6e0f, its positional order
        "use_rllm",
        "estimator",
        "estimator_map",
        "loss_fn_map",
        "stepwise_advantage_mode",
        "norm_adv_by_std_in_grpo",
        "use_precomputed_advantage",
        "loss_fn",
        "lr_schedule",
        "warmup_steps",
        "warmup_steps_ratio",
        "kl_beta",
        "eps_clip",
        "eps_clip_high",
        "loss_agg_mode",
        "rollout_correction",
        "router_replay",
    ]
    assert [m.name for m in rLLMAdvantageEstimator] == [
        "GRPO",
        "REINFORCE",
        "REINFORCE_PLUS_PLUS_BASELINE",
        "RLOO",
        "PRPO",
        "OPO",
        "PASS_AT_K",
        "REINFORCE_PLUS_PLUS",
        "GAE",
        "GRPO_PASSK",
        "GPG",
        "GDPO",
        "MAXRL",
        "OPTIMAL_TOKEN_BASELINE",
        "REMAX",
        "ECHO",  # rLLM terminal-rl's
        "OTHER",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AlgorithmConfig()  # defaults raise no warning
