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

An empty selection (no trained token at all) gives 0 in every mode, never NaN. In a
data-parallel run each rank passes the denominator summed over the ranks (``normaliser``,
:func:`loss_normaliser`), so the loss is that of the global mini-batch. :class:`Aggregation` holds
the three (mode, horizon, normaliser) as one object: every loss, built in or registered, takes
one and calls it on its per-token values (``LossContext.aggregate`` is one).

Sources: verl ``verl/trainer/ppo/core_algos.py::agg_loss``; DAPO (Yu et al. 2025,
arXiv:2503.14476) for the token mean; Dr. GRPO (Liu et al. 2025, arXiv:2503.20783) for the
constant horizon. Deliberate difference: verl's ``seq-mean-token-sum-norm`` sums the sequences
(``Σ_n Σ_t m ℓ / H``); we take their mean, as the mode's name says, so the loss scale does not
grow with the mini-batch size. Sequences with no trained token are left out of every sequence
mean (as recent verl does), so padding rows do not dilute it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

__all__ = ["AGG_MODES", "Aggregation", "aggregate_loss", "loss_normaliser", "token_mean"]

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def token_mean(values: Tensor, response_mask: Tensor) -> Tensor:
    """Mean of ``values [N, T]`` over the tokens where ``response_mask [N, T]`` is 1 (0 if none).

    Examples:
        >>> import torch
        >>> token_mean(torch.tensor([[1.0, 2.0], [3.0, 9.0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]]))
        tensor(2.)
    """
    return (values * response_mask).sum() / response_mask.sum().clamp(min=1.0)


def loss_normaliser(response_mask: Tensor, mode: str = "token-mean") -> Tensor:
    """The count ``mode`` divides by: trained tokens (``token-mean``) or sequences with a trained
    token (the ``seq-mean-*`` modes), a 0-d float tensor, before the clamp at 1.

    Summed over the ranks of a data-parallel run, it makes :func:`aggregate_loss` the loss of the
    global mini-batch (every rank's tokens or sequences), not a mean of per-rank means.

    Raises:
        ValueError: an unknown ``mode``.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"loss_agg_mode={mode!r} is not one of {AGG_MODES}.")
    mask_NT = response_mask.float()
    return mask_NT.sum() if mode == "token-mean" else (mask_NT.sum(-1) > 0).float().sum()


def aggregate_loss(
    loss: Tensor,
    response_mask: Tensor,
    mode: str = "token-mean",
    *,
    horizon: int | None = None,
    normaliser: Tensor | float | None = None,
) -> Tensor:
    """One scalar from per-token losses, by ``mode`` (see the module table).

    Args:
        loss: ``[N, T]`` float per-token losses (any device; gradients flow through).
        response_mask: ``[N, T]`` float or bool, 1 where a token is trained.
        mode: one of :data:`AGG_MODES`.
        horizon: ``H`` of ``seq-mean-token-sum-norm`` (e.g. the longest possible response);
            required for that mode, ignored by the others.
        normaliser: the token or sequence count to divide by (see :func:`loss_normaliser`);
            ``None``: this batch's own. A data-parallel rank passes the count summed over the
            ranks, so the loss is its share of the global mini-batch's. Clamped at 1.

    Returns:
        A 0-d tensor of ``loss``'s dtype; 0 when no token is trained. No host sync.

    Raises:
        ValueError: an unknown ``mode``, or ``seq-mean-token-sum-norm`` without a positive ``horizon``.

    Examples:
        >>> import torch
        >>> loss, mask = torch.tensor([[1.0, 3.0], [2.0, 0.0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]])
        >>> [round(aggregate_loss(loss, mask, m, horizon=4).item(), 3) for m in AGG_MODES]
        [2.0, 3.0, 2.0, 0.75]
    """
    _check_mode(mode, horizon)
    mask_NT = response_mask.to(loss.dtype)
    count = loss_normaliser(mask_NT, mode) if normaliser is None else torch.as_tensor(normaliser, dtype=loss.dtype)
    count = count.to(loss.dtype).clamp(min=1.0)
    if mode == "token-mean":
        return (loss * mask_NT).sum() / count
    seq_sum_N = (loss * mask_NT).sum(-1)
    if mode == "seq-mean-token-sum":
        return seq_sum_N.sum() / count
    if mode == "seq-mean-token-mean":
        return (seq_sum_N / mask_NT.sum(-1).clamp(min=1.0)).sum() / count
    return seq_sum_N.sum() / (count * horizon)


def _check_mode(mode: str, horizon: int | None) -> None:
    if mode not in AGG_MODES:  # checked here too: with a normaliser given, loss_normaliser would not see it
        raise ValueError(f"loss_agg_mode={mode!r} is not one of {AGG_MODES}.")
    if mode == "seq-mean-token-sum-norm" and (horizon is None or horizon <= 0):
        raise ValueError(
            f"loss_agg_mode='seq-mean-token-sum-norm' needs a positive horizon (the constant H), got {horizon!r}."
        )


@dataclass(frozen=True, eq=False)
class Aggregation:
    """How a loss reduces its per-token values to one scalar: :func:`aggregate_loss`'s ``mode``,
    ``horizon`` and ``normaliser`` held as one object, which every loss takes and calls (a built-in
    loss as its ``agg`` argument, a registered one as ``LossContext.aggregate``).

    Attributes:
        mode: one of :data:`AGG_MODES`.
        horizon: ``H`` of ``seq-mean-token-sum-norm`` (required for that mode).
        normaliser: the count ``mode`` divides by (a 0-d tensor; a data-parallel rank's is summed
            over the ranks, :func:`loss_normaliser`); None: each call's own mask's.

    Raises:
        ValueError: an unknown ``mode``, or ``seq-mean-token-sum-norm`` without a positive ``horizon``.

    Examples:
        >>> import torch
        >>> agg = Aggregation("seq-mean-token-sum", normaliser=torch.tensor(4.0))  # 4 sequences over the ranks
        >>> loss, mask = torch.tensor([[1.0, 3.0], [2.0, 0.0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]])
        >>> agg(loss, mask), agg(loss, mask, "token-mean")  # (4 + 2) / 4; another mode: this batch's count, 3
        (tensor(1.5000), tensor(2.))
    """

    mode: str = "token-mean"
    horizon: int | None = None
    normaliser: Tensor | float | None = None

    def __post_init__(self) -> None:
        _check_mode(self.mode, self.horizon)

    def __call__(self, per_token: Tensor, mask: Tensor, mode: str | None = None) -> Tensor:
        """``aggregate_loss(per_token [N, T], mask [N, T])`` in this aggregation's mode, divided by
        its ``normaliser``; in another ``mode`` (a registered loss may ask for one) divided by
        ``mask``'s own count, since the normaliser counts this mode's units.

        Raises:
            ValueError: ``mode`` unknown, or ``seq-mean-token-sum-norm`` without a horizon.
        """
        if mode is None or mode == self.mode:
            return aggregate_loss(per_token, mask, self.mode, horizon=self.horizon, normaliser=self.normaliser)
        return aggregate_loss(per_token, mask, mode, horizon=self.horizon)

    def pinned(self, mode: str | None, normaliser: Tensor | float | None) -> Aggregation:
        """This aggregation in ``mode`` (None: its own) dividing by ``normaliser`` (a loss that pins
        its mode is normalised by that mode's count)."""
        return self if mode is None or mode == self.mode else replace(self, mode=mode, normaliser=normaliser)


#: The default of the losses' ``agg``: the token mean over the call's own mask.
TOKEN_MEAN = Aggregation()
