"""How a ``[N, T]`` matrix of per-token losses becomes one scalar: verl's ``agg_loss`` modes.

Notation: ``ℓ[n, t]`` the per-token loss, ``m[n, t]`` the response mask (1 on trained tokens),
``S = {n : Σ_t m[n, t] > 0}`` the rows with at least one trained token, ``H`` a constant horizon.

=========================  =======================================================================
mode                       scalar
=========================  =======================================================================
token-mean                 ``Σ_nt m ℓ / max(Σ_nt m, 1)``: every token weighs the same (DAPO)
seq-mean-token-sum         ``mean_{n ∈ S} Σ_t m ℓ``: every sequence weighs the same, long ones sum more
seq-mean-token-mean        ``mean_{n ∈ S} (Σ_t m ℓ / Σ_t m)``: each sequence's token mean, then the mean (GRPO)
seq-mean-token-sum-norm    ``mean_{n ∈ S} Σ_t m ℓ / H``: Dr. GRPO's constant normaliser
=========================  =======================================================================

An empty selection (no trained token at all) gives 0 in every mode, never NaN.

Sources: verl ``verl/trainer/ppo/core_algos.py::agg_loss``; DAPO (Yu et al. 2025,
arXiv:2503.14476) for the token mean; Dr. GRPO (Liu et al. 2025, arXiv:2503.20783) for the
constant horizon. Deliberate difference: verl's ``seq-mean-token-sum-norm`` sums the sequences
(``Σ_n Σ_t m ℓ / H``); we take their mean, as the mode's name says, so the loss scale does not
grow with the mini-batch size. Sequences with no trained token are left out of every sequence
mean (as recent verl does), so padding rows do not dilute it.
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["AGG_MODES", "aggregate_loss", "token_mean"]

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def token_mean(values: Tensor, response_mask: Tensor) -> Tensor:
    """Mean of ``values [N, T]`` over the tokens where ``response_mask [N, T]`` is 1 (0 if none).

    Example:
        >>> import torch
        >>> token_mean(torch.tensor([[1.0, 2.0], [3.0, 9.0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]]))
        tensor(2.)
    """
    return (values * response_mask).sum() / response_mask.sum().clamp(min=1.0)


def aggregate_loss(
    loss: Tensor, response_mask: Tensor, mode: str = "token-mean", *, horizon: int | None = None
) -> Tensor:
    """One scalar from per-token losses, by ``mode`` (see the module table).

    Args:
        loss: ``[N, T]`` float per-token losses (any device; gradients flow through).
        response_mask: ``[N, T]`` float or bool, 1 where a token is trained.
        mode: one of :data:`AGG_MODES`.
        horizon: ``H`` of ``seq-mean-token-sum-norm`` (e.g. the longest possible response);
            required for that mode, ignored by the others.

    Returns:
        A 0-d tensor of ``loss``'s dtype; 0 when no token is trained. No host sync.

    Raises:
        ValueError: an unknown ``mode``, or ``seq-mean-token-sum-norm`` without a positive ``horizon``.

    Example:
        >>> import torch
        >>> loss, mask = torch.tensor([[1.0, 3.0], [2.0, 0.0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]])
        >>> [round(aggregate_loss(loss, mask, m, horizon=4).item(), 3) for m in AGG_MODES]
        [2.0, 3.0, 2.0, 0.75]
    """
    mask_NT = response_mask.to(loss.dtype)
    if mode == "token-mean":
        return token_mean(loss, mask_NT)
    if mode not in AGG_MODES:
        raise ValueError(f"loss_agg_mode={mode!r} is not one of {AGG_MODES}.")
    tokens_N = mask_NT.sum(-1)
    seq_sum_N = (loss * mask_NT).sum(-1)
    has_tokens_N = (tokens_N > 0).to(loss.dtype)
    num_seqs = has_tokens_N.sum().clamp(min=1.0)
    if mode == "seq-mean-token-sum":
        return seq_sum_N.sum() / num_seqs
    if mode == "seq-mean-token-mean":
        return (seq_sum_N / tokens_N.clamp(min=1.0)).sum() / num_seqs
    if horizon is None or horizon <= 0:
        raise ValueError(
            f"loss_agg_mode='seq-mean-token-sum-norm' needs a positive horizon (the constant H), got {horizon!r}."
        )
    return seq_sum_N.sum() / (num_seqs * horizon)
