"""The entropy bonus of a policy loss: ``- entropy_coeff · agg(H)``, with ``H[n, t]`` the entropy of
the policy's next-token distribution at each response token, aggregated like the policy loss.

Adding it to the loss rewards spread-out distributions (exploration); a positive
``entropy_coeff`` lowers the loss as the entropy rises. verl's actor computes
``pg_loss - entropy_coeff * agg_loss(entropy, response_mask, loss_agg_mode)`` (its
``actor.entropy_coeff``, default 0); TRL's ``entropy_coef`` bonus is the token mean of ``H``
(ours with the token-mean aggregation). Sources: Williams and Peng 1991, "Function
optimization using connectionist reinforcement learning algorithms" (entropy regularisation);
Mnih et al. 2016, arXiv:1602.01783 (A3C's entropy bonus).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rllm_torch.core.losses.aggregation import TOKEN_MEAN, Aggregation, token_mean

__all__ = ["entropy_bonus"]


def entropy_bonus(
    entropy: Tensor,
    response_mask: Tensor,
    *,
    entropy_coeff: float,
    agg: Aggregation = TOKEN_MEAN,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The term to add to the policy loss, ``-entropy_coeff · agg(entropy, response_mask)``, and
    its stats.

    Args:
        entropy: ``[N, T]`` float, the entropy (nats) of π_θ(· | context) at each token, with its
            gradient (e.g. ``logsumexp(z) - Σ softmax(z) z`` of the logits ``z``).
        response_mask: ``[N, T]``, 1 on trained tokens; the same mask as the policy loss.
        entropy_coeff: the weight, a finite number ``>= 0`` (0: no bonus, the term is 0).
        agg: the policy loss's :class:`~rllm_torch.core.losses.aggregation.Aggregation`, so that
            the bonus and the loss share one scale, also across data-parallel ranks.

    Returns:
        ``(term, {"entropy": token mean of H over the mask})``: ``term`` a 0-d tensor with
        gradient, ``stats`` detached.

    Raises:
        ValueError: ``entropy_coeff`` negative or not finite (a negative weight would penalise
            entropy: use a KL term for that).

    Example (entropies 0.5 and 1.5 on the trained tokens, token mean 1.0):
        >>> term, stats = entropy_bonus(torch.tensor([[0.5, 1.5, 9.0]]), torch.tensor([[1.0, 1.0, 0.0]]),
        ...                             entropy_coeff=0.01)
        >>> round(term.item(), 6), stats["entropy"].item()
        (-0.01, 1.0)
    """
    if isinstance(entropy_coeff, bool) or not isinstance(entropy_coeff, (int, float)):
        raise ValueError(f"entropy_coeff must be a number >= 0, got {entropy_coeff!r}.")
    if not (math.isfinite(entropy_coeff) and entropy_coeff >= 0):
        raise ValueError(f"entropy_coeff must be a finite number >= 0 (0 turns the bonus off), got {entropy_coeff!r}.")
    aggregated = agg(entropy, response_mask)
    with torch.no_grad():
        stats = {"entropy": token_mean(entropy, response_mask.to(entropy.dtype))}
    return -entropy_coeff * aggregated, stats
