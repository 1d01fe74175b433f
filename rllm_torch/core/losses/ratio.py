"""The importance ratio ``ρ = π_θ / π_old`` of the ratio-based policy losses, per token or per
sequence (GSPO), and PPO's dual clip of it for negative advantages.

Sources: Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071 (the sequence
ratio ``s_i = (π_θ(y_i|x) / π_old(y_i|x))^(1/|y_i|)``; TRL's ``importance_sampling_level``, verl's
``loss_mode=gspo``); Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep
Reinforcement Learning", arXiv:1912.09729 (dual-clip PPO; verl's ``clip_ratio_c``).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["IMPORTANCE_SAMPLING_LEVELS", "log_importance_ratio", "dual_clip"]

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")


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
        mask_NT = response_mask.to(log_ratio_NT.dtype)
        return ((log_ratio_NT * mask_NT).sum(-1) / mask_NT.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    raise ValueError(
        f"importance_sampling_level={level!r} is not one of {IMPORTANCE_SAMPLING_LEVELS}; 'sequence' is GSPO's "
        "length-normalised sequence ratio (rllm.algorithm.importance_sampling_level)."
    )


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
