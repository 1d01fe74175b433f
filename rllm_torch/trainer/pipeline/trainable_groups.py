"""Settings under which no group can ever train, refused at start-up (:func:`check_groups_can_train`).

With a workflow that writes one trajectory per episode (the single-turn tasks), each group is
the ``rllm.rollout.n`` rollouts of one prompt, so the filters' rules decide before any sampling
whether a group can ever pass:

=====================================================  ===========================================
settings                                               what happens to every group
=====================================================  ===========================================
``rllm.rollout.n < min_trajs_per_group``               dropped by rejection sampling (rLLM's rule,
                                                       with or without ``enable``)
``rllm.rollout.n=1``, ``filter_groups.enable=true``    never has signal: dynamic sampling keeps
                                                       groups of two or more only
``rllm.rollout.n=1``, ``rejection_sample.enable``,     never released: a task of one rollout is
``min_partial_solve_tasks >= 1``                       never partially solved
``rllm.rollout.n=1``, an estimator whose advantage     trained at advantage 0 (e.g. rloo, maxrl,
of a group of one is always 0                          reinforce_plus_plus_baseline): no gradient
=====================================================  ===========================================

The last is asked of the estimator itself (two groups of one, rewards 1 and 0), not of its name.
A workflow of several trajectories per episode (the multi-turn tasks, a user's own) may fill a
group from one rollout; it is not checked here (the start-up summary warns instead).
"""

from __future__ import annotations

from typing import Any

import torch

from rllm_torch.core.errors import ConfigError, RLLMTorchError
from rllm_torch.core.packing import GroupedRewards
from rllm_torch.rllm.dispatch import compute_advantages
from rllm_torch.rllm.plan import AdvantagePlan
from rllm_torch.rllm.registry import is_token_level, registered_name, registration

__all__ = ["zero_on_groups_of_one", "check_groups_can_train"]

#: An estimator suggested for one rollout a prompt (its advantage is the reward itself).
ONE_ROLLOUT_ESTIMATOR = "reinforce"


def zero_on_groups_of_one(name: str, algorithm_config: Any) -> bool:
    """Whether estimator ``name``, with the run's options, gives advantage 0 to every group of
    one (asked on two groups of one, rewards 1 and 0). Estimators of tokens, of greedy baselines
    or of several rewards are not asked (False)."""
    if is_token_level(name) or registration(name).needs & {"baselines", "reward_components"}:
        return False
    batch = GroupedRewards.from_flat(torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor([0, 1]), num_groups=2)
    try:
        advantages, _ = compute_advantages(batch, name, algorithm_config=algorithm_config)
    except (RLLMTorchError, ValueError, TypeError):  # its own start-up check says why
        return False
    return bool(torch.all(torch.as_tensor(advantages) == 0))


def _zero_estimators(plan: AdvantagePlan) -> dict[str, str]:
    """``{setting: estimator}`` for each estimator of ``plan`` that trains nothing on groups of one."""
    algorithm_config = plan.algorithm_config
    named = {"rllm.algorithm.adv_estimator": algorithm_config.estimator}
    named |= {
        f"rllm.algorithm.estimator_map.{role}": name for role, name in sorted(algorithm_config.estimator_map.items())
    }
    return {
        key: registered_name(name)
        for key, name in named.items()
        if zero_on_groups_of_one(registered_name(name), algorithm_config)
    }


def check_groups_can_train(config: Any, plan: AdvantagePlan, *, one_trajectory_per_episode: bool) -> None:
    """Refuse settings under which every group is dropped, never released or trained at
    advantage 0, by design (the module's table).

    Args:
        config: the checked run config.
        plan: the run's advantage plan.
        one_trajectory_per_episode: the task's workflow writes one trajectory per episode (a
            group is then ``rllm.rollout.n`` trajectories); False: nothing is checked.

    Raises:
        ConfigError: one line naming why, and every setting to change together (joined by AND),
            or ``rllm.rollout.n`` to raise instead.
    """
    if not one_trajectory_per_episode:
        return
    rllm = config.rllm
    n, rs = rllm.rollout.n, rllm.rejection_sample
    why, fixes = [], []
    if n < rs.min_trajs_per_group:
        why.append(
            f"rejection sampling drops every group of fewer than rllm.rejection_sample.min_trajs_per_group="
            f"{rs.min_trajs_per_group} trajectories"
        )
        fixes.append(f"rllm.rejection_sample.min_trajs_per_group={n}")
    if n == 1 and rllm.algorithm.filter_groups.enable:
        why.append("dynamic sampling (rllm.algorithm.filter_groups.enable=true) keeps only groups of two or more")
        fixes.append("rllm.algorithm.filter_groups.enable=false")
    if n == 1 and rs.enable and rs.min_partial_solve_tasks >= 1:
        why.append(
            "rllm.rejection_sample.enable=true waits for partially solved tasks, and a task of one rollout never is"
        )
        fixes.append("rllm.rejection_sample.enable=false")
    if n == 1 and (zero := _zero_estimators(plan)):
        why.append(f"{', '.join(sorted(set(zero.values())))} gives a group of one the advantage 0")
        fixes.extend(f"{key}={ONE_ROLLOUT_ESTIMATOR}" for key in zero)
    if not why:
        return
    needed = max(2, rs.min_trajs_per_group)
    raise ConfigError(
        f"rllm.rollout.n={n} cannot train anything: each prompt's group is its {n} rollout{'' if n == 1 else 's'}, and "
        f"{'; '.join(why)}. "
        f"Set {' AND '.join(fixes)}, or rllm.rollout.n>={needed}."
    )
