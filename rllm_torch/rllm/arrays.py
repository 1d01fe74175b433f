"""rLLM's list-of-arrays estimator functions, computed through the tensor estimators.

Packing and unpacking happen on the numpy side: the groups are concatenated once (equal groups
become one ``[G, K]`` array, the dense layout) and the results come back as views of one array.

Same names, arguments and results as ``rllm.experimental.common.advantage`` and
``rllm.experimental.common.rl_algo``: a list of per-group 1-D numpy arrays in, a pair of
per-group lists of numpy arrays out (float64 for float64 or Python-float rewards, float32
otherwise). Differences, on purpose (docs/design.md §3): ``epsilon`` is configurable (the misspelled
``episilon`` keyword still works, with a ``DeprecationWarning``); RLOO on a group of one returns
a pair; REINFORCE returns new float arrays, never the caller's objects; REINFORCE++ baseline
gives a group of one baseline 0. Extra keyword arguments are accepted and ignored, as in rLLM.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from rllm_torch.core.estimators.grpo import grpo
from rllm_torch.core.estimators.prpo import prpo
from rllm_torch.core.estimators.reinforce import reinforce, reinforce_plus_plus_baseline
from rllm_torch.core.estimators.rloo import rloo
from rllm_torch.core.packing import GroupedRewards

__all__ = [
    "calculate_grpo_advantages",
    "calculate_reinforce_advantages",
    "calculate_reinforce_plus_plus_baseline_advantages",
    "calculate_rloo_advantages",
    "calculate_prpo_advantages",
    "calculate_grpo_advantages_per_group",
    "calculate_rloo_advantages_per_group",
    "by_group",
]

ArrayGroups = Sequence[np.ndarray]


def _pack(rewards: ArrayGroups) -> tuple[GroupedRewards, np.ndarray] | None:
    """Per-group numpy arrays (or lists) packed on the numpy side: one concatenation, and equal
    groups as one ``[G, K]`` array (the dense layout); ``(batch, sizes)``. None when the input is
    not plain numeric 1-D groups (tensors, ragged nesting, non-numbers): the caller then takes
    :meth:`GroupedRewards.from_groups`, which names what is wrong."""
    if isinstance(rewards, (np.ndarray, str, bytes)) or not isinstance(rewards, Sequence) or not rewards:
        return None
    if any(isinstance(g, Tensor) for g in rewards):
        return None
    try:
        sizes = np.fromiter(map(len, rewards), dtype=np.int64, count=len(rewards))
        flat = np.concatenate(rewards)
    except (TypeError, ValueError):
        return None
    if flat.ndim != 1 or flat.shape[0] != sizes.sum() or flat.dtype.kind not in "biuf":
        return None
    rewards_N = torch.from_numpy(np.ascontiguousarray(flat))
    if sizes[0] > 0 and (sizes == sizes[0]).all():
        return GroupedRewards.from_padded(rewards_N.view(len(sizes), int(sizes[0]))), sizes
    index_N = torch.from_numpy(np.repeat(np.arange(len(sizes)), sizes))
    batch = GroupedRewards(rewards_N, index_N, len(sizes), None, group_major=True)
    batch.__dict__["counts"] = torch.from_numpy(sizes)
    return batch, sizes


def _unpack(values_N: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    """Flat values back to one view per group (rows of one ``[G, K]`` array for equal groups)."""
    if len(sizes) and sizes[0] > 0 and (sizes == sizes[0]).all():
        return list(values_N.reshape(len(sizes), int(sizes[0])))
    return np.split(values_N, np.cumsum(sizes)[:-1])


def by_group(estimator: Callable, rewards: ArrayGroups, **options) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``estimator(batch, **options)`` (a tensor estimator) on rLLM's per-group arrays, its
    advantages back as per-group arrays, returned twice (as rLLM returns the same lists)."""
    return _by_group(estimator, rewards, **options)


def _by_group(estimator: Callable, rewards: ArrayGroups, **options) -> tuple[list[np.ndarray], list[np.ndarray]]:
    packed = _pack(rewards)
    if packed is None:  # the general path: any sequences or tensors, with checks that name the group
        batch = GroupedRewards.from_groups(rewards)
        advantages, _ = estimator(batch, **options)
        by_group = [values.cpu().numpy() for values in batch.split(advantages)]
        return by_group, by_group
    batch, sizes = packed
    advantages, _ = estimator(batch, **options)
    by_group = _unpack(advantages.numpy(), sizes)
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
    """GRPO per group (rLLM API); see :func:`rllm_torch.core.estimators.grpo` for the formula."""
    return _by_group(
        grpo,
        rewards,
        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        epsilon=_epsilon(epsilon, episilon),
        std_correction=std_correction,
    )


def calculate_reinforce_advantages(rewards: ArrayGroups, **kwargs) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """REINFORCE: advantage = reward (rLLM API); see :func:`rllm_torch.core.estimators.reinforce`."""
    return _by_group(reinforce, rewards)


def calculate_reinforce_plus_plus_baseline_advantages(
    rewards: ArrayGroups, epsilon: float = 1e-6, **kwargs
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """REINFORCE++ baseline (rLLM API); see :func:`rllm_torch.core.estimators.reinforce_plus_plus_baseline`."""
    return _by_group(reinforce_plus_plus_baseline, rewards, epsilon=epsilon)


def calculate_rloo_advantages(rewards: ArrayGroups, **kwargs) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Reinforce Leave-one-out (rLLM API), arXiv:2402.14740; see :func:`rllm_torch.core.estimators.rloo`."""
    return _by_group(rloo, rewards)


def calculate_prpo_advantages(
    rewards: ArrayGroups, epsilon: float = 1e-6, **kwargs
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """PRPO, batch-level whitening (rLLM API); see :func:`rllm_torch.core.estimators.prpo`."""
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
