"""The importance ratio ``ρ = π_θ / π_old`` of the ratio-based policy losses, per token or per
sequence (GSPO); PPO's clipped surrogate of it and its dual clip for negative advantages; and the
approximate KL every ratio loss reports. Written once here, used by each loss module.

Sources: Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071 (the sequence
ratio ``s_i = (π_θ(y_i|x) / π_old(y_i|x))^(1/|y_i|)``; TRL's ``importance_sampling_level``, verl's
``loss_mode=gspo``); Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep
Reinforcement Learning", arXiv:1912.09729 (dual-clip PPO; verl's ``clip_ratio_c``); Schulman
et al. 2017, arXiv:1707.06347, eq. 7 (the clipped surrogate); Schulman 2020, "Approximating KL
divergence" (the k3 estimator).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rllm_torch.core.losses.aggregation import token_mean

__all__ = [
    "IMPORTANCE_SAMPLING_LEVELS",
    "LOG_RATIO_CLAMP",
    "log_importance_ratio",
    "sequence_mean",
    "clipped_surrogate",
    "dual_clip",
    "approx_kl",
]

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
#: verl's clamp of ``log ρ`` before ``exp`` in the losses that take one (SAPO, VESPO, DPPO, the
#: rollout rejection): ``e^20`` stays finite in every float dtype.
LOG_RATIO_CLAMP = 20.0


def sequence_mean(values: Tensor, mask: Tensor) -> Tensor:
    """``[N, 1]`` each row's mean of ``values [N, T]`` over its tokens where ``mask [N, T]`` (float,
    ``values``' dtype) is 1; 0 for a row with none.

    Example:
        >>> sequence_mean(torch.tensor([[1.0, 3.0], [2.0, 5.0]]), torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
        tensor([[2.],
                [0.]])
    """
    return (values * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)


def log_importance_ratio(
    log_probs: Tensor, old_log_probs: Tensor, response_mask: Tensor, level: str = "token"
) -> Tensor:
    """``log ρ``: per token ``[N, T]`` (``log π_θ - log π_old``), or per sequence ``[N, 1]``, the
    length-normalised log-ratio ``Σ_t m (log π_θ - log π_old) / max(Σ_t m, 1)`` (GSPO's
    ``log s_i``), which broadcasts over the sequence's tokens.

    At the sequence level the gradient flows through every trained token's log-prob: with the
    per-token loss ``ℓ = f(s_i) A_i`` on each of the ``|y_i|`` tokens and any aggregation, the
    loss and its gradient equal verl's token form ``sg[s_i] · π_θ(y_t) / sg[π_θ(y_t)]`` (the
    ``|y_i|`` copies of ``∂s_i = s_i · mean_t ∂log π`` sum to ``s_i Σ_t ∂log π``).

    Args:
        log_probs, old_log_probs, response_mask: ``[N, T]`` float, one device.
        level: ``"token"`` or ``"sequence"``.

    Raises:
        ValueError: ``level`` is neither.

    Example (two tokens with log-ratios 0.2 and -0.4: the sequence's mean is -0.1):
        >>> logp = torch.tensor([[0.2, -0.4]])
        >>> log_importance_ratio(logp, torch.zeros(1, 2), torch.ones(1, 2), "sequence")
        tensor([[-0.1000]])
    """
    log_ratio_NT = log_probs - old_log_probs
    if level == "token":
        return log_ratio_NT
    if level == "sequence":
        return sequence_mean(log_ratio_NT, response_mask.to(log_ratio_NT.dtype))
    raise ValueError(
        f"importance_sampling_level={level!r} is not one of {IMPORTANCE_SAMPLING_LEVELS}; 'sequence' is GSPO's "
        "length-normalised sequence ratio (rllm.algorithm.importance_sampling_level)."
    )


def clipped_surrogate(
    ratio: Tensor,
    advantages: Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    delta: float | None = None,
) -> tuple[Tensor, Tensor]:
    """PPO's clipped surrogate, negated, per token: ``ℓ = -min(min(ρ, δ) A, clip(ρ, 1 - ε_low,
    1 + ε_high) A)`` (``delta = None``: no cap ``δ``); ``(loss, clipped)``, ``clipped`` the bool
    ``[N, T]`` tokens where the clipped term is the smaller (PPO's ``clip_fraction``).

    Args:
        ratio: ``[N, T]`` per token, or ``[N, 1]`` per sequence (it broadcasts over the tokens).
        advantages: ``[N, T]``.

    Example (ρ = 1.5 and 0.5 with A = 1: the first is clipped at 1.2):
        >>> clipped_surrogate(torch.tensor([[1.5, 0.5]]), torch.ones(1, 2), clip_ratio_low=0.2, clip_ratio_high=0.2)
        (tensor([[-1.2000, -0.5000]]), tensor([[ True, False]]))
    """
    unclipped_NT = (ratio if delta is None else ratio.clamp(max=delta)) * advantages
    clipped_NT = ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high) * advantages
    return -torch.minimum(unclipped_NT, clipped_NT), clipped_NT < unclipped_NT


def dual_clip(loss: Tensor, advantages: Tensor, clip_ratio_c: float) -> tuple[Tensor, Tensor]:
    """Dual-clip PPO: where ``A < 0``, the clipped loss ``max(-ρA, -clip(ρ)A)`` is capped at
    ``-c A``, so a token whose ratio grew past ``c`` while its advantage is negative stops pushing
    (its gradient is 0) instead of growing without bound. ``(loss, capped)``, ``capped`` the bool
    ``[N, T]`` tokens where the cap holds.

    Raises:
        ValueError: ``clip_ratio_c <= 1`` (the cap must lie above the upper clip of ρ = 1).

    Example (ρ = 5, A = -1: PPO's loss 5 is capped at c = 3):
        >>> dual_clip(torch.tensor([[5.0, 0.5]]), torch.tensor([[-1.0, -1.0]]), 3.0)
        (tensor([[3.0000, 0.5000]]), tensor([[ True, False]]))
    """
    if not clip_ratio_c > 1.0:
        raise ValueError(
            f"clip_ratio_c={clip_ratio_c!r}: dual-clip PPO needs a cap above 1 (verl's default is 3.0; "
            "backend.clip_ratio_c=null turns it off)."
        )
    cap_NT = -clip_ratio_c * advantages
    capped_NT = (advantages < 0) & (loss > cap_NT)
    return torch.where(capped_NT, cap_NT, loss), capped_NT


def approx_kl(log_ratio: Tensor, response_mask: Tensor) -> Tensor:
    """The k3 estimate of ``KL(π_old ‖ π_θ)``, ``ρ - 1 - log ρ``, averaged over the trained tokens:
    a 0-d tensor without gradient (every ratio loss's ``approx_kl`` stat).

    Args:
        log_ratio: ``[N, T]`` ``log ρ`` per token.
        response_mask: ``[N, T]``, 1 on trained tokens.

    Example (log ρ = 0 gives 0; log ρ = 1 gives e - 2):
        >>> round(approx_kl(torch.tensor([[0.0, 1.0]]), torch.ones(1, 2)).item(), 4)  # (0 + 0.7183) / 2
        0.3591
    """
    with torch.no_grad():
        return token_mean(log_ratio.exp() - 1 - log_ratio, response_mask)
