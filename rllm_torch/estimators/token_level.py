"""From token rewards to the per-token advantages a policy loss consumes: the trainer's side of
an outcome estimator.

The token-level path of a batch of ``B`` responses of ``T`` tokens::

    scores_B = sequence_scores(token_level_rewards_BT)             # one pass over [B, T]
    adv_B, _ = grpo(GroupedRewards.from_padded(scores_B.view(G, K)))  # the estimator: O(B)
    adv_BT = broadcast_to_tokens(adv_B, response_mask_BT, out=buffer) # one pass into a buffer

With a preallocated ``out`` the path costs about two passes over ``[B, T]`` and allocates
nothing per step (measured in ``benchmarks/bench_token_level.py``); allocating a fresh ``[B, T]``
output each step costs more than the arithmetic on CPU (page faults on first touch). No host
sync: the path runs on CUDA and inside ``torch.compile``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rllm_torch.errors import InvalidRewardsError, InvalidRewardTypeError

__all__ = ["sequence_scores", "broadcast_to_tokens"]


def _check_out(out: Tensor | None, shape: tuple[int, ...], like: Tensor, name: str) -> None:
    if out is None:
        return
    if not isinstance(out, Tensor) or tuple(out.shape) != shape or not out.is_floating_point():
        raise InvalidRewardsError(
            f"out must be a floating-point tensor of shape {shape} (the {name}), got "
            f"{getattr(out, 'dtype', type(out).__name__)} {tuple(getattr(out, 'shape', ()))}."
        )
    if out.device != like.device:
        raise InvalidRewardsError(f"out is on {out.device} but the inputs are on {like.device}; allocate it there.")


def sequence_scores(token_level_rewards: Tensor, *, out: Tensor | None = None) -> Tensor:
    """Each response's score, the sum of its token rewards: ``s_b = sum_t r[b, t]``.

    Args:
        token_level_rewards: ``[B, T]`` float rewards, 0 outside the response (as verl's
            ``token_level_rewards``: the outcome reward on the last response token, or a
            per-token reward), any device.
        out: an optional ``[B]`` float tensor to write into.

    Returns:
        ``[B]``, accumulated in float32 (float64 for float64 rewards), or ``out``.

    Raises:
        InvalidRewardTypeError: not a floating-point tensor. InvalidRewardsError: not 2-D, or an
        ``out`` of the wrong shape or device.

    Example:
        >>> sequence_scores(torch.tensor([[0.0, 1.0], [0.5, 0.0]]))
        tensor([1.0000, 0.5000])
    """
    if not isinstance(token_level_rewards, Tensor) or not token_level_rewards.is_floating_point():
        raise InvalidRewardTypeError(
            f"token_level_rewards must be a floating-point tensor, got {getattr(token_level_rewards, 'dtype', type(token_level_rewards).__name__)}."
        )
    if token_level_rewards.dim() != 2:
        raise InvalidRewardsError(f"token_level_rewards must be [B, T], got shape {tuple(token_level_rewards.shape)}.")
    _check_out(out, token_level_rewards.shape[:1], token_level_rewards, "one score per response")
    acc = torch.float64 if token_level_rewards.dtype == torch.float64 else torch.float32
    return torch.sum(token_level_rewards, dim=-1, dtype=acc, out=out)


def broadcast_to_tokens(advantages: Tensor, response_mask: Tensor, *, out: Tensor | None = None) -> Tensor:
    """Token-level advantages: each response's advantage on its trained tokens,
    ``A[b, t] = a_b * m[b, t]`` (verl's and rLLM's broadcast of an outcome advantage).

    Args:
        advantages: ``[B]`` float, one per response (an estimator's output).
        response_mask: ``[B, T]`` float (0/1) or bool, 1 on trained tokens, same device.
        out: an optional preallocated ``[B, T]`` float tensor (e.g. reused every step): the
            product is written there in one pass, and nothing is allocated.

    Returns:
        ``[B, T]``: ``out``, or a new float32 tensor (the advantages are cast: a float64 estimator
        output gives float32 tokens, as a policy loss uses them).

    Raises:
        InvalidRewardTypeError: ``advantages`` is not floating point or the mask not float/bool.
        InvalidRewardsError: shapes or devices do not match.

    Example:
        >>> broadcast_to_tokens(torch.tensor([2.0, -1.0]), torch.tensor([[1.0, 0.0], [1.0, 1.0]]))
        tensor([[ 2.,  0.],
                [-1., -1.]])
    """
    if not isinstance(advantages, Tensor) or not advantages.is_floating_point() or advantages.dim() != 1:
        raise InvalidRewardTypeError(
            f"advantages must be a 1-D floating-point tensor [B], got {getattr(advantages, 'dtype', type(advantages).__name__)} {tuple(getattr(advantages, 'shape', ()))}."
        )
    if not isinstance(response_mask, Tensor) or not (
        response_mask.is_floating_point() or response_mask.dtype == torch.bool
    ):
        raise InvalidRewardTypeError(
            f"response_mask must be a float (0/1) or bool tensor [B, T], got {getattr(response_mask, 'dtype', type(response_mask).__name__)}."
        )
    if response_mask.dim() != 2 or response_mask.shape[0] != advantages.shape[0]:
        raise InvalidRewardsError(
            f"response_mask has shape {tuple(response_mask.shape)} for {advantages.shape[0]} advantages; it must be [B, T] with B = {advantages.shape[0]}."
        )
    if response_mask.device != advantages.device:
        raise InvalidRewardsError(
            f"response_mask is on {response_mask.device} but the advantages are on {advantages.device}."
        )
    _check_out(out, tuple(response_mask.shape), response_mask, "token-level advantages")
    dtype = out.dtype if out is not None else torch.float32
    mask = response_mask if response_mask.dtype == dtype else response_mask.to(dtype)
    return torch.mul(mask, advantages.to(dtype)[:, None], out=out)
