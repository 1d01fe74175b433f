"""Which tokens the policy loss trains on, beyond the response mask: the high-entropy minority
(TRL's ``top_entropy_quantile``) and the off-policy sequence mask (TRL's
``off_policy_mask_threshold``, DeepSeek-V3.2's OPSM). Each gives a multiplier of the per-token
policy loss; the masked tokens stay in the loss's normaliser, as in TRL.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["high_entropy_mask", "off_policy_sequence_mask"]


def _gather_values(values: Tensor, process_group: object) -> Tensor:
    """``values [n]`` of every rank of ``process_group`` (None: this process's), one all-gather of
    the counts and one of the padded values."""
    if process_group is None:
        return values
    world = dist.get_world_size(process_group)
    count = torch.tensor([values.numel()], device=values.device)
    counts = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(counts, count, group=process_group)
    longest = int(max(c.item() for c in counts))
    padded = values.new_zeros(longest)
    padded[: values.numel()] = values
    parts = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded, group=process_group)
    return torch.cat([part[: int(c.item())] for part, c in zip(parts, counts, strict=True)])


def high_entropy_mask(
    entropy: Tensor, response_mask: Tensor, quantile: float, *, process_group: object = None
) -> Tensor:
    """``[N, T]`` bool: the trained tokens whose entropy is at least the ``(1 - quantile)``
    quantile of every trained token's entropy (over every rank of ``process_group``; linear
    interpolation, ``torch.quantile``'s). ``quantile=1`` keeps every trained token, ``0.2`` the
    fifth with the highest entropy (the paper's "80/20"), ``0`` the most uncertain ones only.

    Args:
        entropy: ``[N, T]`` the policy's entropy at each position (no gradient needed).
        response_mask: ``[N, T]`` 1 on trained tokens.
        quantile: ρ in ``[0, 1]``.
        process_group: None (this process) or the run's ``ProcessGroup``: every rank must call.

    Raises:
        ValueError: ``quantile`` outside ``[0, 1]``.

    Source: Wang et al., "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective
    Reinforcement Learning for LLM Reasoning" (arXiv:2506.01939); TRL ``top_entropy_quantile``.

    Examples:
        >>> h, m = torch.tensor([[0.1, 2.0, 0.5, 3.0]]), torch.ones(1, 4)
        >>> high_entropy_mask(h, m, 0.5)
        tensor([[False,  True, False,  True]])
    """
    if isinstance(quantile, bool) or not isinstance(quantile, (int, float)) or not 0 <= quantile <= 1:
        raise ValueError(f"top_entropy_quantile={quantile!r} must be a number in [0, 1] (1: every token).")
    trained_NT = response_mask > 0
    if quantile >= 1:
        return trained_NT
    with torch.no_grad():
        values = _gather_values(entropy.detach()[trained_NT], process_group)
        if values.numel() == 0:
            return torch.zeros_like(trained_NT)
        exact = values if values.dtype in (torch.float32, torch.float64) else values.float()  # quantile takes these
        threshold = torch.quantile(exact, 1.0 - float(quantile))
        return (entropy.detach() >= threshold.to(entropy.dtype)) & trained_NT


def off_policy_sequence_mask(
    log_probs: Tensor, behaviour_log_probs: Tensor, advantages: Tensor, response_mask: Tensor, threshold: float
) -> Tensor:
    """``[N, 1]`` float (no gradient): 0 for a sequence with a negative advantage whose mean
    per-token ``log π_behaviour - log π_θ`` over its trained tokens exceeds ``threshold``, 1 for
    every other. A sequence the policy already moved away from, and that would be pushed down
    further, is left out (DeepSeek-V3.2's off-policy sequence masking).

    Raises:
        ValueError: ``threshold`` not a finite number >= 0.

    Source: DeepSeek-V3.2 (arXiv:2512.02556, eq. 9); TRL ``off_policy_mask_threshold`` (the
    behaviour policy is the sampler's log-probs, else the old policy's).

    Examples:
        >>> logp, behaviour = torch.tensor([[-2.0], [-2.0]]), torch.tensor([[-1.0], [-1.0]])
        >>> off_policy_sequence_mask(logp, behaviour, torch.tensor([[-1.0], [1.0]]), torch.ones(2, 1), 0.5)
        tensor([[0.],
                [1.]])
    """
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
        raise ValueError(f"off_policy_mask_threshold={threshold!r} must be a finite number >= 0.")
    if threshold < 0:
        raise ValueError(f"off_policy_mask_threshold={threshold!r} must be >= 0 (a mean KL).")
    with torch.no_grad():
        mask_NT = response_mask.to(log_probs.dtype)
        kl_N1 = ((behaviour_log_probs - log_probs) * mask_NT).sum(-1, keepdim=True) / mask_NT.sum(
            -1, keepdim=True
        ).clamp(min=1.0)
        negative_N1 = (advantages * mask_NT).sum(-1, keepdim=True) < 0
        return (~(negative_N1 & (kl_N1 > threshold))).to(log_probs.dtype)
