"""Rollout correction: truncated importance sampling (TIS) of the trainer's old policy over the
sampler's (pure functions: tensors and numbers in, tensors out).

The sampler (vLLM, or ``generate`` in another precision) draws a response from ``π_rollout``,
whose log-probs differ from those the trainer computes for the same weights, ``π_old``. The
policy loss is built on ``π_old``; weighting each token's loss by ``w = π_old / π_rollout``
corrects the sampling mismatch, and truncating ``w`` at a cap ``C`` bounds its variance
(Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training";
verl's rollout correction, whose names rLLM maps to ``tis_mode`` / ``tis_cap``).

Shared notation: ``N`` sequences, ``T`` tokens, ``[N, T]`` float tensors on one device;
``δ = (log π_old − log π_rollout) · mask`` per token. Modes (``tis_mode``):

* ``token``: ``w_t = min(exp(δ_t), C)`` (per-token TIS; TRL's ``token_truncate``);
* ``sequence``: ``w = min(exp(Σ_t δ_t), C)`` for every token of the sequence (TRL's ``sequence_truncate``);
* ``token_mask`` / ``sequence_mask``: the ratio itself, ``0`` where it exceeds ``C`` (TRL's
  masking modes: a token or sequence far off the sampler's distribution is dropped from the
  gradient; it still counts in the loss's normaliser, as in TRL); with a lower cap ``c``
  (``tis_cap_lower``) also ``0`` below it: ``token_mask`` with ``c = 0.5, C = 5`` is IcePop's
  two-sided token mask (verl's ``rollout_is=token`` with ``rollout_is_threshold="0.5_5.0"``, TRL's
  ``token_mask`` with ``vllm_importance_sampling_clip_min/max``).

The weights are constants (no gradient). In log space, ``min(exp(x), C) = exp(min(x, log C))``,
so no ratio overflows however long the sequence. A *unit* is a trained token (token modes) or a
sequence with at least one trained token (sequence modes); the statistics are over units.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["TIS_MODES", "rollout_importance_weights", "importance_weight_stats", "summarise_importance_weights"]

TIS_MODES = ("token", "sequence", "token_mask", "sequence_mask")


def rollout_importance_weights(
    old_log_probs: Tensor,
    rollout_log_probs: Tensor,
    response_mask: Tensor,
    *,
    tis_mode: str,
    tis_cap: float,
    tis_cap_lower: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Per-token importance weights of ``π_old`` over ``π_rollout`` (module docstring).

    Args:
        old_log_probs, rollout_log_probs: ``[N, T]`` float log-probs of the sampled tokens.
        response_mask: ``[N, T]``, 1 on trained tokens.
        tis_mode: one of :data:`TIS_MODES`.
        tis_cap: the cap ``C >= 1``.
        tis_cap_lower: the mask modes' lower cap ``c`` in ``(0, 1]`` (None: none).

    Returns:
        ``(weights, capped)``: ``[N, T]`` float32 weights, 0 off the mask, without gradient; and
        ``[N, T]`` bool, True on the trained tokens whose unit's ratio exceeds ``C`` (truncated, or masked).

    Raises:
        ValueError: an unknown ``tis_mode``, ``tis_cap < 1``, or ``tis_cap_lower`` outside
            ``(0, 1]`` or with a truncating mode.

    Example (one sequence of two tokens, ratios e^1 and e^-1, cap 2):
        >>> old, rollout, mask = torch.tensor([[0.0, -2.0]]), torch.tensor([[-1.0, -1.0]]), torch.ones(1, 2)
        >>> [rollout_importance_weights(old, rollout, mask, tis_mode=m, tis_cap=2.0)[0].tolist() for m in TIS_MODES]
        [[[2.0, 0.3678794503211975]], [[1.0, 1.0]], [[0.0, 0.3678794503211975]], [[1.0, 1.0]]]
    """
    if tis_mode not in TIS_MODES:
        raise ValueError(f"tis_mode {tis_mode!r} is not one of {TIS_MODES}.")
    if not tis_cap >= 1.0:
        raise ValueError(f"tis_cap must be >= 1 (a cap below 1 truncates every on-policy token), got {tis_cap}.")
    if tis_cap_lower is not None and (not tis_mode.endswith("mask") or not 0 < tis_cap_lower <= 1):
        raise ValueError(
            f"tis_cap_lower={tis_cap_lower!r} is the lower cap of a mask mode (token_mask, sequence_mask), in (0, 1]; "
            f"tis_mode={tis_mode!r}."
        )
    mask_NT = response_mask.to(torch.float32)
    with torch.no_grad():
        delta_NT = (old_log_probs.float() - rollout_log_probs.float()) * mask_NT
        if tis_mode.startswith("sequence"):
            delta_NT = delta_NT.sum(-1, keepdim=True).expand_as(delta_NT)
        log_cap = math.log(tis_cap)
        out_NT = delta_NT > log_cap
        if tis_cap_lower is not None:
            out_NT = out_NT | (delta_NT < math.log(tis_cap_lower))
        capped_NT = out_NT & (mask_NT > 0)
        weights_NT = delta_NT.clamp(max=log_cap).exp() * mask_NT  # in the mask modes the capped ones are zeroed
        if tis_mode.endswith("mask"):
            weights_NT = weights_NT.masked_fill(capped_NT, 0.0)
    return weights_NT, capped_NT


def importance_weight_stats(weights: Tensor, capped: Tensor, response_mask: Tensor, *, tis_mode: str) -> Tensor:
    """``[5]`` float64 sums over the units (module docstring) of a batch, to add up over ranks
    and mini-batches: ``(units, Σ w, Σ w², units capped, max w)`` (the last one to max-reduce;
    0 for no unit). No host sync.

    Args:
        weights, capped: :func:`rollout_importance_weights`'s outputs. response_mask: ``[N, T]``.
        tis_mode: the mode the weights were made with (sequence modes count sequences).
    """
    trained_NT = response_mask > 0
    if tis_mode.startswith("sequence"):  # one unit per sequence with a trained token
        unit_N = trained_NT.any(-1)
        w_U, c_U, keep_U = weights.amax(-1), capped.any(-1), unit_N
    else:
        w_U, c_U, keep_U = weights.flatten(), capped.flatten(), trained_NT.flatten()
    w_U, keep_U = w_U.double(), keep_U.double()
    return torch.stack(
        [
            keep_U.sum(),
            (w_U * keep_U).sum(),
            (w_U.square() * keep_U).sum(),
            (c_U.double() * keep_U).sum(),
            (w_U * keep_U).amax() if w_U.numel() else w_U.new_zeros(()),
        ]
    )


def summarise_importance_weights(stats: list[float]) -> dict[str, float]:
    """The ``rollout_corr/*`` metrics from :func:`importance_weight_stats`'s sums (added over
    ranks, the max maxed): ``weight_mean``, ``weight_max``, ``clip_fraction`` (share of units
    whose ratio exceeded the cap) and ``ess``, Kish's normalised effective sample size
    ``(Σ w)² / (n Σ w²)`` in ``[0, 1]`` (1: all weights equal; 0 when every unit is masked).

    Examples:
        >>> summarise_importance_weights([4.0, 4.0, 6.0, 1.0, 2.0])  # weights 2, 1, 1, 0
        {'rollout_corr/weight_mean': 1.0, 'rollout_corr/weight_max': 2.0, 'rollout_corr/clip_fraction': 0.25, 'rollout_corr/ess': 0.6666666666666666}
    """
    units, total, squares, capped, largest = stats
    n = max(units, 1.0)
    return {
        "rollout_corr/weight_mean": total / n,
        "rollout_corr/weight_max": largest,
        "rollout_corr/clip_fraction": capped / n,
        "rollout_corr/ess": total * total / (n * squares) if squares > 0 else 0.0,
    }
