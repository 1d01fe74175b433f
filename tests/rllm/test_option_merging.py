"""Where an estimator's options come from, merged (issue 50): an estimator that takes ``**kwargs``
gets every option (the run-wide ones and its own), the user's own ``estimator_options`` win over
``compat="rllm"``, the trainer's ``traj_group_adv_estimator_map`` and the config's
``estimator_map`` may not name one role two ways (nor an ``estimator_map`` pair and
``loss_fn_map`` one role's loss), an option given in the config and as a keyword with two
values (``1`` is not ``True``) takes the config's with a warning naming both (rLLM uses the config), ``rllm.rejection_sample.min_trajs_per_group`` survives ``from_config``, and an
explicit ``Episode.rollout_idx`` wins over the id's. Expected values are worked by hand or in
float64 here, not read from the code under test."""

from __future__ import annotations

import math

import numpy as np
import pytest
from omegaconf import OmegaConf
from trainer_fakes import make_config

from rllm_torch import Episode, GroupedRewards, compute_advantages
from rllm_torch.core.errors import ConfigError, InvalidRewardsError
from rllm_torch.rllm.collect import collect_reward_and_advantage_from_trajectory_groups
from rllm_torch.rllm.config import AlgorithmConfig
from rllm_torch.rllm.registry import register_rllm_adv_estimator
from rllm_torch.rllm.types import Step, Trajectory, TrajectoryGroup
from rllm_torch.trainer.config_checks import check_run_config
from rllm_torch.trainer.pipeline.rejection_sampling import (
    RejectionSamplingConfig,
    RejectionSamplingState,
    apply_rejection_sampling_and_filtering,
)

SEEN: dict[str, dict] = {}


@register_rllm_adv_estimator("merging_scaled_centre")
def scaled_centre(rewards: list[np.ndarray], **kwargs):
    """rLLM's arrays form taking everything through ``**kwargs``: ``A = scale * (r - mean_g)``."""
    SEEN["arrays"] = dict(kwargs)
    scale = kwargs.get("scale", 1.0)
    adv = [scale * (g - g.mean()) for g in rewards]
    return adv, adv


@register_rllm_adv_estimator("merging_tensor_kwargs", form="tensors")
def tensor_kwargs(batch: GroupedRewards, **kwargs):
    SEEN["tensors"] = dict(kwargs)
    adv = batch.rewards.double() * kwargs.get("scale", 1.0)
    return adv, adv


RUN_WIDE = {"norm_adv_by_std_in_grpo": False, "epsilon": 0.25, "std_correction": 1, "gamma": 0.5, "lam": 0.75}


@pytest.mark.parametrize("name, key", [("merging_scaled_centre", "arrays"), ("merging_tensor_kwargs", "tensors")])
def test_an_estimator_taking_kwargs_gets_the_run_wide_options_and_its_own_from_the_config(name, key):
    config = AlgorithmConfig(estimator=name, **RUN_WIDE, estimator_options={name: {"scale": 3.0}})
    batch = GroupedRewards.from_groups([[1.0, 0.0, 0.5], [2.0, 4.0]])
    adv, _ = compute_advantages(batch, name, algorithm_config=config)
    got = SEEN[key]
    assert {k: got[k] for k in RUN_WIDE} == RUN_WIDE
    assert got["scale"] == 3.0 and got["algorithm_config"] is config
    if key == "arrays":  # 3 * (r - mean): means 0.5 and 3.0
        assert adv.tolist() == pytest.approx([1.5, -1.5, 0.0, -3.0, 3.0])


def test_an_option_given_as_a_keyword_reaches_a_kwargs_estimator_and_a_second_value_warns_and_loses():
    batch = GroupedRewards.from_groups([[1.0, 0.0]])
    adv, _ = compute_advantages(batch, "merging_scaled_centre", scale=-2.0, epsilon=0.5)
    assert adv.tolist() == pytest.approx([-1.0, 1.0]) and SEEN["arrays"]["epsilon"] == 0.5
    config = AlgorithmConfig(estimator_options={"merging_scaled_centre": {"scale": 3.0}})
    with pytest.warns(UserWarning, match=r"scale=2.0 as a keyword and .*\['scale'\]=3.0 differ; the config's"):
        adv, _ = compute_advantages(batch, "merging_scaled_centre", algorithm_config=config, scale=2.0)
    assert adv.tolist() == pytest.approx([1.5, -1.5])  # the config's 3 * (r - 0.5)


def test_a_kwargs_estimator_run_by_the_collector_gets_its_options_and_traj_groups():
    groups = [
        TrajectoryGroup(
            [Trajectory(name=n, reward=r, steps=[Step(response_ids=[7, 7])]) for n, r in (("a", 1.0), ("b", 0.0))],
            group_id="t0:solver",
        )
    ]
    SEEN.clear()
    config = AlgorithmConfig(
        estimator="merging_scaled_centre", estimator_options={"merging_scaled_centre": {"scale": 4.0}}
    )
    collect_reward_and_advantage_from_trajectory_groups(groups, config)
    assert [s.advantage for t in groups[0].trajectories for s in t.steps] == pytest.approx([2.0, -2.0])  # 4 * (r - 0.5)
    assert SEEN["arrays"]["scale"] == 4.0
    assert [t.name for t in SEEN["arrays"]["traj_groups"][0].trajectories] == ["a", "b"]


def _rpp_by_hand(rewards_by_group: list[list[float]], singleton_zero: bool, epsilon: float = 1e-6) -> list[float]:
    """REINFORCE++ baseline in float64: c = r - mean_g (a group of one: c = r with baseline 0, else
    0), then c / (population std of all c + epsilon)."""
    c = []
    for g in rewards_by_group:
        mean = sum(g) / len(g) if len(g) > 1 else (0.0 if singleton_zero else g[0])
        c += [r - mean for r in g]
    mu = sum(c) / len(c)
    std = math.sqrt(sum((x - mu) ** 2 for x in c) / len(c))
    return [x / (std + epsilon) for x in c]


def test_compat_rllm_gives_rllms_singleton_rule_but_the_users_own_option_wins():
    groups = [[1.0], [1.0, 0.0]]
    batch = GroupedRewards.from_groups(groups)
    name = "reinforce_plus_plus_baseline"
    rllm, _ = compute_advantages(batch, name, algorithm_config=AlgorithmConfig(compat="rllm"))
    assert rllm.tolist() == pytest.approx(_rpp_by_hand(groups, singleton_zero=False), rel=1e-9)
    own = AlgorithmConfig(compat="rllm", estimator_options={name: {"singleton_baseline": "zero"}})
    mine, _ = compute_advantages(batch, name, algorithm_config=own)
    assert mine.tolist() == pytest.approx(_rpp_by_hand(groups, singleton_zero=True), rel=1e-9)
    assert mine[0].item() != pytest.approx(0.0)  # the two rules really differ here


def test_compat_rllm_in_a_run_config_gives_rllms_rule_unless_the_run_sets_the_option(tmp_path):
    """The run config's schema lists every built-in's options; the one compat sets must not count
    as the user's own (it did: compat=rllm changed nothing in a run)."""
    name, groups = "reinforce_plus_plus_baseline", [[1.0], [1.0, 0.0]]
    batch = GroupedRewards.from_groups(groups)
    option = f"rllm.algorithm.estimator_options.{name}.singleton_baseline"
    cases = [
        (("rllm.algorithm.compat=rllm",), False),  # rLLM's code: the singleton centred on itself
        (("rllm.algorithm.compat=rllm", f"{option}=zero"), True),  # the run's own option wins
        ((), True),  # ours
        ((f"{option}=mean",), False),
    ]
    for overrides, singleton_zero in cases:
        settings = check_run_config(make_config(tmp_path, f"rllm.algorithm.adv_estimator={name}", *overrides))
        adv, _ = compute_advantages(batch, name, algorithm_config=settings.algorithm_config)
        assert adv.tolist() == pytest.approx(_rpp_by_hand(groups, singleton_zero), rel=1e-9), overrides


@pytest.mark.parametrize("given", ["section", "whole"])
def test_the_trainers_map_and_the_configs_map_naming_one_role_two_ways_stop_with_a_config_error(given):
    algorithm = {"adv_estimator": "grpo", "estimator_map": {"judge": "rloo", "solver": "grpo"}}
    config = algorithm if given == "section" else OmegaConf.create({"rllm": {"algorithm": algorithm}})
    with pytest.raises(ConfigError, match=r"estimator_map\['judge'\].*'rloo'.*'reinforce'.*give one"):
        AlgorithmConfig.from_config(config, estimator_map={"judge": "reinforce"})
    # the same value twice is one setting; another role merges in
    merged = AlgorithmConfig.from_config(config, estimator_map={"judge": "rloo", "critic": "reinforce"})
    assert {r: getattr(e, "value", e) for r, e in merged.estimator_map.items()} == {
        "judge": "rloo",
        "solver": "grpo",
        "critic": "reinforce",
    }


def test_the_trainer_refuses_a_role_its_map_and_the_run_config_name_two_ways(tmp_path):
    config = make_config(tmp_path, "rllm.algorithm.estimator_map.judge=rloo")
    with pytest.raises(ConfigError, match=r"estimator_map\['judge'\]"):
        check_run_config(config, estimator_map={"judge": "reinforce"})
    settings = check_run_config(config, estimator_map={"solver": "reinforce"})
    assert (
        settings.plan.role("judge").estimator.name == "rloo"
        and settings.plan.role("solver").estimator.name == "reinforce"
    )


@pytest.mark.parametrize("value", [1, 3, 5])
def test_min_trajs_per_group_survives_from_config_and_decides_which_groups_train(tmp_path, value):
    settings = check_run_config(make_config(tmp_path, f"rllm.rejection_sample.min_trajs_per_group={value}"))
    assert settings.rs_config.min_trajs_per_group == value
    assert RejectionSamplingConfig.from_config(settings.config.rllm.rejection_sample).min_trajs_per_group == value
    sizes = [1, 2, 3, 4, 5]  # groups of these many trajectories, one task each
    groups = [
        TrajectoryGroup(
            [Trajectory(name=f"t{k}", reward=float(k % 2)) for k in range(size)], group_id=f"task{size}:all"
        )
        for size in sizes
    ]
    episodes = [Episode(task_id=f"task{size}", rollout_idx=k) for size in sizes for k in range(size)]
    kept, _, _ = apply_rejection_sampling_and_filtering(episodes, groups, settings.rs_config, RejectionSamplingState())
    assert [len(g.trajectories) for g in kept] == [s for s in sizes if s >= value]


def test_an_explicit_rollout_idx_wins_over_the_one_in_the_episode_id():
    assert Episode(id="t0:3", rollout_idx=5).rollout_idx == 5
    assert Episode(id="t0:3").rollout_idx == 3  # not given: read from the id, as rLLM does
    assert Episode(id="t0:3", rollout_idx=5).task_id == "t0"
    assert Episode(id="t0:x").rollout_idx == 0  # not an integer: nothing to read
    assert Episode(task_id="t1", rollout_idx=7).id == "t1:7"


# a role's loss named twice: by an (estimator, loss) pair in estimator_map and by loss_fn_map -------


@pytest.mark.parametrize("pair", [("reinforce", "cispo"), ["reinforce", "cispo"]])
def test_a_pair_that_names_the_same_loss_as_loss_fn_map_is_one_setting_and_trains_with_it(pair):
    config = AlgorithmConfig(estimator_map={"judge": pair, "solver": "grpo"}, loss_fn_map={"judge": "cispo"})
    assert config.estimator_map == {"judge": "reinforce", "solver": "grpo"}  # str enum values compare equal
    assert config.loss_fn_map == {"judge": "cispo"}
    assert [config.loss_fn_for(role) for role in ("judge", "solver")] == ["cispo", "ppo"]


@pytest.mark.parametrize("pair", [("reinforce", "ppo"), ["reinforce", "cross_entropy"]])
def test_a_pair_that_names_another_loss_than_loss_fn_map_is_refused_not_silently_overridden(pair):
    with pytest.raises(
        ConfigError, match=rf"estimator_map\['judge'\] names loss '{pair[1]}' but loss_fn_map\['judge'\]='cispo'"
    ):
        AlgorithmConfig(estimator_map={"judge": pair}, loss_fn_map={"judge": "cispo"})


def test_a_run_config_naming_a_roles_loss_in_both_maps_runs_when_they_agree_and_stops_when_they_differ(tmp_path):
    pair = "rllm.algorithm.estimator_map={judge:[reinforce,cispo]}"
    settings = check_run_config(make_config(tmp_path, pair, "rllm.algorithm.loss_fn_map={judge: cispo}"))
    assert settings.algorithm_config.loss_fn_for("judge") == "cispo"
    assert settings.plan.role("judge").estimator.name == "reinforce"
    with pytest.raises(
        ConfigError, match=r"estimator_map\['judge'\] names loss 'cispo' but loss_fn_map\['judge'\]='ppo'"
    ):
        check_run_config(make_config(tmp_path, pair, "rllm.algorithm.loss_fn_map={judge: ppo}"))


# an option given in the config and as a keyword: a bool is only the same bool (1 is not True); two values:
# the config's, with a warning ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "in_config, keyword, same",
    [
        # grpo of one group [1, 0]: deviations +-0.5; divided by std + 1e-6 unless norm_adv_by_std_in_grpo=False
        ({"std_correction": 1}, {"std_correction": True}, 0.5 / (0.5**0.5 + 1e-6)),  # std sqrt(0.5 / (2 - 1))
        ({"std_correction": 0}, {"std_correction": False}, 0.5 / (0.5 + 1e-6)),  # std sqrt(0.5 / 2)
        ({"norm_adv_by_std_in_grpo": True}, {"norm_adv_by_std_in_grpo": 1}, 0.5 / (0.5 + 1e-6)),
        ({"norm_adv_by_std_in_grpo": False}, {"norm_adv_by_std_in_grpo": 0}, 0.5),
    ],
)
def test_a_run_wide_option_given_as_a_number_one_way_and_a_bool_the_other_takes_the_configs(in_config, keyword, same):
    batch = GroupedRewards.from_groups([[1.0, 0.0]])
    config = AlgorithmConfig(**in_config)
    option = next(iter(keyword))
    if option == "std_correction" and in_config[option] == 0:
        # rLLM's config has no std_correction: left at its default it is not given, the keyword is, and a bool
        # is not a std correction
        with pytest.raises(InvalidRewardsError, match="std_correction must be a non-negative int.*got False"):
            compute_advantages(batch, "grpo", algorithm_config=config, **keyword)
        adv, _ = compute_advantages(batch, "grpo", algorithm_config=config, std_correction=0)
    else:
        with pytest.warns(UserWarning, match=rf"{option}={keyword[option]!r} as a keyword and .* differ"):
            adv, _ = compute_advantages(batch, "grpo", algorithm_config=config, **keyword)
    assert adv.tolist() == pytest.approx([same, -same], rel=1e-6)
    # the same value (the same bool, or the same int) both ways is one setting
    adv, _ = compute_advantages(batch, "grpo", algorithm_config=config, **in_config)
    assert adv.tolist() == pytest.approx([same, -same], rel=1e-6)


@pytest.mark.parametrize("in_config, keyword", [(1, True), (True, 1), (0, False), (False, 0), (1.0, True)])
def test_an_estimators_own_option_given_as_a_number_one_way_and_a_bool_the_other_takes_the_configs(in_config, keyword):
    batch = GroupedRewards.from_groups([[1.0, 0.0]])
    config = AlgorithmConfig(estimator_options={"merging_scaled_centre": {"scale": in_config}})
    with pytest.warns(UserWarning, match=r"scale=.* as a keyword and .* differ; the config's value is used"):
        adv, _ = compute_advantages(batch, "merging_scaled_centre", algorithm_config=config, scale=keyword)
    assert adv.tolist() == pytest.approx([0.5 * float(in_config), -0.5 * float(in_config)])
    assert type(SEEN["arrays"]["scale"]) is type(in_config)  # the config's value itself, not the keyword's
    # equal values of one type are one setting: scale * (r - mean), mean 0.5
    adv, _ = compute_advantages(batch, "merging_scaled_centre", algorithm_config=config, scale=in_config)
    assert adv.tolist() == pytest.approx([0.5 * float(in_config), -0.5 * float(in_config)])
