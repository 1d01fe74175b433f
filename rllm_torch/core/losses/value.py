"""The critic's clipped value loss (PPO with a value model).

``ℓ[n, t] = ½ max((V - R)², (V_clip - R)²)`` with ``V`` the critic's prediction (with gradient),
``V_old`` its prediction before the update, ``R`` the GAE returns and
``V_clip = V_old + clip(V - V_old, -ε_v, ε_v)``, reduced by the policy loss's aggregation. Sources: Schulman et al. 2017, arXiv:1707.06347 (the value term of eq. 9); the clipped
form of OpenAI's baselines PPO2 and verl ``compute_value_loss`` (``cliprange_value``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rllm_torch.core.losses.aggregation import TOKEN_MEAN, Aggregation, token_mean

__all__ = ["clipped_value_loss"]


def clipped_value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    response_mask: Tensor,
    *,
    cliprange_value: float = 0.5,
    agg: Aggregation = TOKEN_MEAN,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The clipped value loss and its diagnostics.

    Args:
        values: ``[N, T]`` float predictions ``V`` (with gradient).
        old_values: ``[N, T]`` the predictions before the update (no gradient).
        returns: ``[N, T]`` the regression targets ``R``.
        response_mask: ``[N, T]`` 1 on trained tokens.
        cliprange_value: ``ε_v >= 0``, how far a prediction may move from ``V_old`` before its
            loss stops pulling it further.
        agg: the policy loss's :class:`~rllm_torch.core.losses.aggregation.Aggregation`.

    Returns:
        ``(loss, stats)``: the 0-d loss and ``{"vf_clipfrac": share of tokens where the clipped
        term is the larger}``.

    Examples:
        >>> v, old, ret, m = torch.tensor([[2.0]]), torch.tensor([[0.0]]), torch.tensor([[3.0]]), torch.ones(1, 1)
        >>> clipped_value_loss(v, old, ret, m, cliprange_value=0.5)[0]  # V_clip = 0.5: ½ max(1, 6.25)
        tensor(3.1250)
    """
    clipped = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    unclipped_loss, clipped_loss = (values - returns).square(), (clipped - returns).square()
    loss = agg(0.5 * torch.maximum(unclipped_loss, clipped_loss), response_mask)
    with torch.no_grad():
        stats = {"vf_clipfrac": token_mean((clipped_loss > unclipped_loss).float(), response_mask)}
    return loss, stats
