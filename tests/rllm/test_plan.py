"""The run's plan (:class:`~rllm_torch.rllm.plan.AdvantagePlan`): each role's estimator bound with
the run's options and its loss, resolved once, and what it refuses before any batch exists."""

from __future__ import annotations

import pytest
import torch

from rllm_torch import AlgorithmConfig, GroupedRewards, compute_advantages, register_adv_estimator, register_loss
from rllm_torch.core.errors import ConfigError, UnknownEstimatorError
from rllm_torch.rllm.plan import AdvantagePlan


@register_loss("plan_unit_loss", needs=("logp_ref",), agg_mode="seq-mean-token-sum")
def _loss(ctx):
    return ctx.aggregate(-ctx.advantages * ctx.logp_curr, ctx.action_mask), {}


def test_each_role_gets_its_mapped_estimator_and_loss_and_the_others_the_runs():
    config = AlgorithmConfig(
        estimator="grpo", estimator_map={"judge": ("remax", "plan_unit_loss")}, loss_fn="cispo", epsilon=0.5
    )
    plan = AdvantagePlan(config)
    judge, solver, other = plan.role("judge"), plan.role("solver"), plan.role("other")
    assert (judge.estimator.name, judge.loss.name, judge.loss.agg_mode) == (
        "remax",
        "plan_unit_loss",
        "seq-mean-token-sum",
    )
    assert (solver.estimator.name, solver.loss.name, solver.loss.agg_mode) == ("grpo", "cispo", None)
    assert other.estimator is solver.estimator  # one binding for every role of the default
    assert judge.needs == {"baselines", "logp_ref"} and solver.needs == frozenset()
    assert plan.needs == {"baselines", "logp_ref"} and plan.estimators_needing("baselines") == ["remax"]
    assert plan.loss.name == "cispo" and plan.losses == {"cispo", "plan_unit_loss"}
    assert judge.source == "role 'judge': estimator_map['judge']" and solver.source == "role 'solver': estimator"


def test_the_bound_estimator_gives_what_compute_advantages_gives_with_the_runs_options():
    config = AlgorithmConfig(estimator="grpo", epsilon=0.5, norm_adv_by_std_in_grpo=True)
    bound = AdvantagePlan(config).role("solver").estimator
    assert bound.options["epsilon"] == 0.5 and bound.options["norm_adv_by_std_in_grpo"] is True
    batch = GroupedRewards.from_groups([[1.0, 0.0], [0.5, 0.5, 2.0]])
    advantages, _ = bound(batch)
    # group 0: mean 0.5, population std 0.5: (1 - 0.5) / (0.5 + 0.5) = 0.5
    assert advantages[:2].tolist() == [0.5, -0.5]
    torch.testing.assert_close(advantages, compute_advantages(batch, "grpo", algorithm_config=config)[0])


def test_an_option_the_estimator_does_not_take_is_refused_when_the_plan_is_built():
    config = AlgorithmConfig(estimator="rloo", estimator_options={"rloo": {"k": 2}})
    with pytest.raises(ConfigError, match=r"estimator 'rloo' takes no option 'k'"):
        AdvantagePlan(config)


def test_an_unregistered_estimator_names_where_it_was_named():
    config = AlgorithmConfig(estimator="grpo", estimator_map={"judge": "no_such_estimator"})
    with pytest.raises(UnknownEstimatorError, match=r"role 'judge': estimator_map\['judge'\] = 'no_such_estimator'"):
        AdvantagePlan(config)


def test_the_collector_refuses_a_token_level_estimator_of_any_role_naming_it():
    AdvantagePlan(AlgorithmConfig(estimator="grpo")).check_outcome_level()  # an outcome estimator passes
    plan = AdvantagePlan(AlgorithmConfig(estimator="grpo", estimator_map={"critic_role": "gae"}))
    with pytest.raises(ConfigError, match=r"role 'critic_role': estimator_map\['critic_role'\]: estimator 'gae'"):
        plan.check_outcome_level()
    with pytest.raises(ConfigError, match=r"^estimator: estimator 'reinforce_plus_plus' is token-level"):
        AdvantagePlan(AlgorithmConfig(estimator="reinforce_plus_plus")).check_outcome_level()


def test_a_plan_keeps_the_function_it_bound_when_the_name_is_registered_again():
    @register_adv_estimator("plan_unit_rebound", form="tensors")
    def first(batch):
        return batch.rewards.float(), batch.rewards.float()

    plan = AdvantagePlan(AlgorithmConfig(estimator="plan_unit_rebound"))
    with pytest.warns(UserWarning, match="registered again"):

        @register_adv_estimator("plan_unit_rebound", form="tensors")
        def second(batch):
            return -batch.rewards.float(), batch.rewards.float()

    batch = GroupedRewards.from_groups([[1.0, 2.0]])
    assert plan.role("r").estimator(batch)[0].tolist() == [1.0, 2.0]  # the run goes on with what it started with
    assert AdvantagePlan(AlgorithmConfig(estimator="plan_unit_rebound")).role("r").estimator(batch)[0].tolist() == [
        -1.0,
        -2.0,
    ]
