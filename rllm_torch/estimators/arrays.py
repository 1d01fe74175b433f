"""rLLM's list-of-arrays estimator functions, computed through the tensor estimators.

Same names, arguments and results as ``rllm.experimental.common.advantage`` and
``rllm.experimental.common.rl_algo``: a list of per-group 1-D numpy arrays in, a pair of
per-group lists of numpy arrays out (float64 for float64 or Python-float rewards, float32
otherwise). Differences, on purpose (DESIGN.md §3): ``epsilon`` is configurable (the misspelled
``episilon`` keyword still works, with a ``DeprecationWarning``); RLOO on a group of one returns
a pair; REINFORCE returns new float arrays, never the caller's objects; REINFORCE++ baseline
gives a group of one baseline 0. Extra keyword arguments are accepted and ignored, as in rLLM.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import numpy as np

from rllm_torch.estimators.grpo import grpo
from rllm_torch.estimators.prpo import prpo
from rllm_torch.estimators.reinforce import reinforce, reinforce_plus_plus_baseline
from rllm_torch.estimators.rloo import rloo
from rllm_torch.packing import GroupedRewards

__all__ = [
    "calculate_grpo_advantages",
    "calculate_reinforce_advantages",
    "calculate_reinforce_plus_plus_baseline_advantages",
    "calculate_rloo_advantages",
    "calculate_prpo_advantages",
    "calculate_grpo_advantages_per_group",
    "calculate_rloo_advantages_per_group",
]

ArrayGroups = Sequence[np.ndarray]


def _by_group(estimator: Callable, rewards: ArrayGroups, **options) -> tuple[list[np.ndarray], list[np.ndarray]]:
    batch = GroupedRewards.from_groups(rewards)
    advantages, _ = estimator(batch, **options)
    by_group = [values.cpu().numpy() for values in batch.split(advantages)]
    return by_group, by_group


def _epsilon(epsilon: float | None, episilon: float | None) -> float:
    if episilon is not None:
        warnings.warn("`episilon` is deprecated; use `epsilon`.", DeprecationWarning, stacklevel=3)
        if epsilon is not None and epsilon != episilon:
            raise ValueError(f"got epsilon={epsilon!r} and the deprecated episilon={episilon!r}; pass only epsilon.")
        return episilon
    return 1e-6 if epsilon is None else epsilon


def calculate_grpo_advantages(
    rewards: ArrayGroups,
    norm_adv_by_std_in_grpo: bool = True,
    episilon: float | None = None,
    *,
    epsilon: float | None = None,
    std_correction: int = 0,
    **kwargs,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """GRPO per group (rLLM API); see :func:`rllm_torch.estimators.grpo` for the formula."""
    return _by_group(
        grpo,
        rewards,
        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        epsilon=_epsilon(epsilon, episilon),
        std_correction=std_correction,
    )


def calculate_reinforce_advantages(rewards: ArrayGroups, **kwargs) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """REINFORCE: advantage = reward (rLLM API); see :func:`rllm_torch.estimators.reinforce`."""
    return _by_group(reinforce, rewards)


def calculate_reinforce_plus_plus_baseline_advantages(
    rewards: ArrayGroups, epsilon: float = 1e-6, **kwargs
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """REINFORCE++ baseline (rLLM API); see :func:`rllm_torch.estimators.reinforce_plus_plus_baseline`."""
    return _by_group(reinforce_plus_plus_baseline, rewards, epsilon=epsilon)


def calculate_rloo_advantages(rewards: ArrayGroups, **kwargs) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Reinforce Leave-one-out (rLLM API), arXiv:2402.14740; see :func:`rllm_torch.estimators.rloo`."""
    return _by_group(rloo, rewards)


def calculate_prpo_advantages(
    rewards: ArrayGroups, epsilon: float = 1e-6, **kwargs
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """PRPO, batch-level whitening (rLLM API); see :func:`rllm_torch.estimators.prpo`."""
    return _by_group(prpo, rewards, epsilon=epsilon)


def calculate_grpo_advantages_per_group(
    rewards: np.ndarray,
    norm_adv_by_std_in_grpo: bool = True,
    episilon: float | None = None,
    *,
    epsilon: float | None = None,
    std_correction: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """GRPO for one group's ``[n]`` rewards (rLLM ``rl_algo`` API): ``(advantages, returns)``."""
    advantages, returns = calculate_grpo_advantages(
        [rewards], norm_adv_by_std_in_grpo, epsilon=_epsilon(epsilon, episilon), std_correction=std_correction
    )
    return advantages[0], returns[0]


def calculate_rloo_advantages_per_group(rewards: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """RLOO for one group's ``[n]`` rewards (rLLM ``rl_algo`` API); a pair also for ``n == 1``."""
    advantages, returns = calculate_rloo_advantages([rewards])
    return advantages[0], returns[0]
