"""Pieces shared by the tensor estimators: option checks, working dtype, docstring text (private)."""

from __future__ import annotations

import numbers
from typing import Any

from torch import Tensor

from rllm_torch.core.errors import InvalidRewardsError, InvalidRewardTypeError
from rllm_torch.core.moments import std_plus_epsilon
from rllm_torch.core.packing import GroupedRewards
from rllm_torch.core.segment import Centered, SegmentLayout, accumulation_dtype
from rllm_torch.core.tokens import TokenRewards

__all__ = [
    "shared_docstring",
    "check_batch",
    "check_token_batch",
    "check_epsilon",
    "check_correction",
    "check_flag",
    "check_discount",
    "working_rewards",
    "whiten",
    "divide_by_group_std",
    "standardise_over_batch",
]

# Text every estimator docstring shares, written once (formatted in by ``shared_docstring``).
_SHARED_DOCS = {
    "args_batch": """batch: packed rewards, a :class:`~rllm_torch.GroupedRewards` on any device. Reward
                dtypes bool, integer, float16, bfloat16, float32 or float64 are accepted.""",
    "returns": """``(advantages, returns)``: one ``[N]`` tensor in the batch's flat order, on its
        device, float64 for float64 rewards and float32 otherwise, returned twice (as rLLM
        returns the same array for both; clone before changing one in place). Never the
        caller's tensor: the input is not modified. Detached: an advantage is a constant of the
        policy-gradient loss, so no gradient flows back to rewards that require one (every
        estimator, built-in or registered, run through ``compute_advantages``).""",
    "numerics": """Group statistics are two-pass (centred) and accumulate in float32 (float64 for
        float64 input), see :mod:`rllm_torch.core.segment`. An empty batch gives empty outputs; a
        NaN reward makes NaN only in its own group. No host-device synchronisation.""",
    "args_tokens": """batch: a :class:`~rllm_torch.core.tokens.TokenRewards`: ``[B, T]`` float token
                rewards and response mask (any device); untrained tokens are skipped.""",
    "returns_tokens": """``(advantages, returns)``: two ``[B, T]`` tensors on the batch's device, float64 for
        float64 rewards and float32 otherwise, 0 on untrained tokens; detached, new tensors (the
        input is not modified).""",
    "ranks_tokens": """Across ranks (``TokenRewards(..., process_group=pg)``): whitening is over every rank's
        trained tokens (one ``all_gather`` of 4 float64 values per rank, merged exactly); every
        rank must call. Returns are per row and need no communication.""",
    "ranks": """Across ranks (a batch built with ``process_group``, :mod:`rllm_torch.core.distributed`):
        each rank gets the advantages of its own trajectories, equal to one process's on the
        concatenation of all ranks' batches (up to the order of float additions); group sizes,
        singleton rules and exact zeros are those of the global groups. Every rank of the group
        must call the estimator (a rank with no trajectory too). Collectives are
        ``torch.distributed.all_reduce`` calls on the process group's backend (gloo for CPU,
        NCCL for CUDA tensors), in the accumulation dtype; their number does not depend on ``N``.""",
}


def shared_docstring(fn):
    """Fill ``{args_batch}``, ``{returns}`` and ``{numerics}`` into ``fn``'s docstring."""
    fn.__doc__ = fn.__doc__.format(**_SHARED_DOCS)
    return fn


def _check_input_type(batch: object, kind: type, estimator: str, expects: str, build: str) -> Any:
    if not isinstance(batch, kind):
        raise InvalidRewardTypeError(
            f"{estimator} {expects} a {kind.__name__}, got {type(batch).__name__}; build one with {build}."
        )
    return batch


def check_token_batch(batch: object, estimator: str) -> TokenRewards:
    return _check_input_type(
        batch,
        TokenRewards,
        estimator,
        "is a token-level estimator and expects",
        "TokenRewards(token_level_rewards_BT, response_mask_BT) (values=values_BT for gae)",
    )


def check_batch(batch: object, estimator: str) -> GroupedRewards:
    return _check_input_type(
        batch,
        GroupedRewards,
        estimator,
        "expects",
        "GroupedRewards.from_groups(list_of_groups), .from_flat(rewards, group_index) or .from_padded(rewards_GK)",
    )


def check_epsilon(epsilon: object) -> float:
    if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real) or not epsilon >= 0:
        raise InvalidRewardsError(f"epsilon must be a non-negative real number (added to the std), got {epsilon!r}.")
    return float(epsilon)


def check_correction(correction: object) -> int:
    if isinstance(correction, bool) or not isinstance(correction, numbers.Integral) or correction < 0:
        raise InvalidRewardsError(
            f"std_correction must be a non-negative int as in torch.std (0 = population, 1 = sample), got {correction!r}."
        )
    return int(correction)


def check_discount(value: object, name: str) -> float:
    """A discount (``gamma``, ``lam``): a real number in ``[0, 1]``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value <= 1:
        raise InvalidRewardsError(
            f"{name} must be a number in [0, 1] (1: no discount), got {value!r}; set rllm.algorithm.{name}."
        )
    return float(value)


def check_flag(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidRewardTypeError(f"{name} must be a bool, got {value!r}.")
    return value


def working_rewards(batch: GroupedRewards) -> tuple[Tensor, SegmentLayout]:
    """The rewards in the accumulation dtype and the layout's working shape, plus the layout."""
    layout = batch.layout
    rewards = batch.rewards.detach()  # advantages are constants of the policy loss: no graph
    return layout.values(rewards.to(accumulation_dtype(rewards.dtype))), layout


def whiten(centered_N: Tensor, layout: SegmentLayout, epsilon: float) -> Tensor:
    """``c / (std(c) + epsilon)`` in place, one population std over all of ``c`` of the batch
    (over every rank of ``layout.batch_comm``), centred on the mean of ``c``."""
    return centered_N.div_(std_plus_epsilon(layout.batch_std(centered_N), epsilon))


def divide_by_group_std(stats: Centered, layout: SegmentLayout, epsilon: float, std_correction: int) -> Tensor:
    """GRPO's scaling, in place on ``stats.values``: ``(x - mean_g) / (std_g + epsilon)``, one
    division per group; a group of one has std 1 (rLLM's rule)."""
    std_G = layout.where_singleton(stats.var(std_correction).sqrt_(), 1.0)
    return stats.values.mul_(layout.expand(std_plus_epsilon(std_G, epsilon).reciprocal_()))


def standardise_over_batch(x_N: Tensor, layout: SegmentLayout, epsilon: float, std_correction: int = 0) -> Tensor:
    """``(x - mean_B) / (std_B + epsilon)`` over every value of the batch (every rank of
    ``layout.batch_comm``), a new ``[N]`` tensor: PRPO's and GDPO's batch whitening."""
    whole, x_1N = layout.whole_batch(x_N)
    stats = whole.center(x_1N, singleton_baseline=None)
    return whole.flat(stats.values.div_(std_plus_epsilon(stats.var(std_correction).sqrt_(), epsilon)))
