"""REINFORCE (no baseline), REINFORCE++ with a group-mean baseline, and token-level REINFORCE++."""

from __future__ import annotations

from torch import Tensor

from rllm_torch.core.errors import ConfigError
from rllm_torch.core.estimators.scaling import (
    check_batch,
    check_correction,
    check_discount,
    check_epsilon,
    check_token_batch,
    shared_docstring,
    whiten,
    working_rewards,
)
from rllm_torch.core.packing import GroupedRewards
from rllm_torch.core.returns import discounted_returns, whiten_over
from rllm_torch.core.tokens import TokenRewards

__all__ = ["reinforce", "reinforce_plus_plus_baseline", "reinforce_plus_plus", "SINGLETON_BASELINES"]

#: ``reinforce_plus_plus_baseline``'s baseline for a group of one: 0, or the group's own mean (rLLM's code).
SINGLETON_BASELINES = ("zero", "mean")


@shared_docstring
def reinforce(batch: GroupedRewards) -> tuple[Tensor, Tensor]:
    """REINFORCE advantages: the reward itself, ``A_i = r_i`` (no baseline).

    Args:
        {args_batch}

    Returns:
        {returns}

    Raises:
        InvalidRewardTypeError: ``batch`` is not a GroupedRewards.

    {numerics}
    {ranks}
    Collectives per call: none (no statistic).

    References: Williams, "Simple statistical gradient-following algorithms for connectionist
    reinforcement learning", Machine Learning 8 (1992); rLLM ``calculate_reinforce_advantages``.

    Examples:
        >>> adv, _ = reinforce(GroupedRewards.from_groups([[True, False], [3]]))
        >>> adv
        tensor([1., 0., 3.])
    """
    check_batch(batch, "reinforce")
    x, layout = working_rewards(batch)
    adv = layout.flat(x).clone()
    return adv, adv


@shared_docstring
def reinforce_plus_plus_baseline(
    batch: GroupedRewards, *, epsilon: float = 1e-6, singleton_baseline: str = "zero"
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ with a group-mean baseline, whitened over the whole batch (role).

    ``c_i = r_i - mean_g`` for a group of two or more, ``c_i = r_i`` for a group of one
    (baseline 0; ``singleton_baseline="mean"``: its own mean, so ``c_i = 0``), then
    ``A_i = c_i / (std_B + epsilon)`` with ``std_B`` the population std of all ``c`` of the
    batch (centred on their mean).

    Args:
        {args_batch} Pass one role's groups per call: the whitening is batch-wide.
        epsilon: added to the batch std in the denominator.
        singleton_baseline: ``"zero"`` (verl's rule, and rLLM's docstring: one rollout per task
            still learns) or ``"mean"`` (rLLM's code: the group's own mean, so a group of one
            gets 0 and counts as 0 in ``std_B``; what ``AlgorithmConfig(compat="rllm")`` gives).

    Returns:
        {returns}

    Raises:
        InvalidRewardTypeError: ``batch`` is not a GroupedRewards.
        InvalidRewardsError: ``epsilon`` is negative.
        ConfigError: ``singleton_baseline`` is neither ``"zero"`` nor ``"mean"``.

    Edge cases: a group of one keeps baseline 0 by default, as rLLM's docstring says (rLLM's code
    subtracts the singleton's own reward and gets 0: ``singleton_baseline="mean"``); a group of
    two or more equal rewards gets exactly 0. A NaN reward
    makes the whole batch NaN, since ``std_B`` is batch-wide.
    {numerics}
    {ranks}
    Collectives per call: split groups 3 (the group mean: ``[G]`` max and ``[2G]`` sum; the
    batch std: an ``all_gather`` of 4 values per rank); rank-local groups: the batch std's 1.

    References: Hu, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language
    Models", arXiv:2501.03262; rLLM ``calculate_reinforce_plus_plus_baseline_advantages``.

    Examples:
        >>> adv, _ = reinforce_plus_plus_baseline(GroupedRewards.from_groups([[1.0, 0.0], [1.0]]))
        >>> adv  # c = [0.5, -0.5, 1.0], std(c) = sqrt(42/108)
        tensor([ 0.8018, -0.8018,  1.6036], dtype=torch.float64)
    """
    check_batch(batch, "reinforce_plus_plus_baseline")
    epsilon = check_epsilon(epsilon)
    if singleton_baseline not in SINGLETON_BASELINES:
        raise ConfigError(
            f"reinforce_plus_plus_baseline: singleton_baseline={singleton_baseline!r} is not one of {SINGLETON_BASELINES} "
            "('zero': a group of one keeps its reward; 'mean': rLLM's code, it gets 0)."
        )
    x, layout = working_rewards(batch)
    centered = layout.center(x, singleton_baseline=0.0 if singleton_baseline == "zero" else None).values
    adv = whiten(layout.flat(centered), layout, epsilon)
    return adv, adv


@shared_docstring
def reinforce_plus_plus(
    batch: TokenRewards, *, gamma: float = 1.0, epsilon: float = 1e-6, std_correction: int = 0
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (token level): discounted returns, whitened over every trained token of the batch.

    ``G_t = sum_{{s >= t}} gamma^d(t, s) r_s`` over each response's trained tokens (``d`` counts
    the trained tokens in ``[t, s)``), with ``r`` the
    token rewards (the outcome reward on the last trained token, minus ``kl_coef`` times the
    per-token KL to the reference policy when KL is in the reward), then
    ``A_t = (G_t - mean) / (std + epsilon)`` with the mean and std over all trained tokens of
    the batch (:func:`~rllm_torch.core.returns.masked_whiten`).

    Args:
        {args_tokens}
        gamma: the discount, in ``[0, 1]`` (the paper uses 1).
        epsilon: added to the batch std.
        std_correction: 0 population std, 1 sample std (verl's ``masked_whiten``).

    Returns:
        {returns_tokens} ``returns`` are the discounted returns ``G``.

    Raises:
        InvalidRewardTypeError: ``batch`` is not a TokenRewards.
        InvalidRewardsError: ``gamma`` outside ``[0, 1]``, ``epsilon`` negative, or
            ``std_correction`` not a non-negative int.

    Edge cases: an empty batch or one with no trained token gives zeros; a batch whose returns
    are all equal (e.g. ``gamma = 1`` and one reward for every response) gets exactly 0.
    Untrained tokens inside a response (a multi-turn row's tool output) are skipped: the return
    passes through them undiscounted, as verl 0.9.1's ``compute_reinforce_plus_plus_outcome_advantage``
    carries it (its returns equal ours; with ``std_correction=1`` and ``epsilon=0`` the advantages
    agree within 1e-6 with its ``masked_whiten``, which adds 1e-8 to the variance).
    Returns and statistics accumulate in float32 (float64 for float64 input; the whitening's
    sums in float64). No host sync; ``gamma < 1`` scans over ``T``
    (:func:`~rllm_torch.core.returns.discounted_returns`).
    {ranks_tokens}

    References: Hu et al., "REINFORCE++: A Simple and Efficient Approach for Aligning Large
    Language Models", arXiv:2501.03262 (token rewards with the KL penalty, global batch
    normalisation); verl ``compute_reinforce_plus_plus_outcome_advantage``.

    Examples:
        >>> import torch
        >>> rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
        >>> adv, returns = reinforce_plus_plus(TokenRewards(rewards, torch.ones(2, 2)), gamma=0.5)
        >>> returns
        tensor([[0.5000, 1.0000],
                [0.0000, 0.0000]])
    """
    check_token_batch(batch, "reinforce_plus_plus")
    gamma = check_discount(gamma, "gamma")
    epsilon, std_correction = check_epsilon(epsilon), check_correction(std_correction)
    rewards, mask = batch.working()
    returns = discounted_returns(rewards, mask, gamma)
    adv = whiten_over(returns, mask, epsilon, std_correction, batch.process_group)
    return adv, returns
