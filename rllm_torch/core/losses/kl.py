"""Per-token estimators of the KL divergence to a reference policy, and the KL loss term.

With ``δ = log π_θ(a) - log π_ref(a)`` at each sampled token (``a ~ π_θ``), Schulman's estimators
of ``KL(π_θ ‖ π_ref)``:

==================  ==================  ===========================================================
name (verl's)       alias               per-token value
==================  ==================  ===========================================================
``kl``              ``k1``              ``δ``: unbiased, high variance, can be negative
``abs``                                 ``|δ|``
``mse``             ``k2``              ``½ δ²``: biased, low variance, ≥ 0
``low_var_kl``      ``k3``              ``exp(-δ) - 1 + δ``: unbiased, ≥ 0 (``δ`` clamped to ``[-20, 20]``, the value to ``[-10, 10]``, as verl)
==================  ==================  ===========================================================

Every estimator is 0 where the policy equals the reference. As a loss term (``use_kl_loss``)
its gradient flows through ``log π_θ``; in the reward (``use_kl_in_reward``) it is computed on
the old policy's log-probs, without gradient.

Sources: Schulman, "Approximating KL Divergence" (2020, http://joschu.net/blog/kl-approx.html);
DeepSeekMath (Shao et al. 2024, arXiv:2402.03300, eq. 4: the ``k3`` loss term of GRPO); verl
``verl/trainer/ppo/core_algos.py::kl_penalty`` (names and the ``low_var_kl`` clamp).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["KL_ESTIMATORS", "kl_penalty", "canonical_kl_name"]

KL_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
_CANONICAL = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}


def canonical_kl_name(name: str) -> str:
    """verl's name of a KL estimator (``k1`` → ``kl``, ``k2`` → ``mse``, ``k3`` → ``low_var_kl``).

    Raises:
        ValueError: an unknown name.
    """
    if name not in KL_ESTIMATORS:
        raise ValueError(f"KL estimator {name!r} is not one of {KL_ESTIMATORS}.")
    return _CANONICAL.get(name, name)


def kl_penalty(log_probs: Tensor, ref_log_probs: Tensor, kind: str = "low_var_kl") -> Tensor:
    """Per-token KL estimate ``[N, T]`` of ``kind`` (see the module table).

    Args:
        log_probs: ``[N, T]`` log π_θ of the sampled tokens (with gradient for a loss term).
        ref_log_probs: ``[N, T]`` log π_ref of the same tokens (no gradient needed).
        kind: one of :data:`KL_ESTIMATORS`.

    Returns:
        ``[N, T]`` in ``log_probs``' dtype; mask it with the response mask.

    Raises:
        ValueError: an unknown ``kind``.

    Examples:
        >>> logp, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.0, -1.0]])
        >>> kl_penalty(logp, ref, "kl"), kl_penalty(logp, ref, "mse")
        (tensor([[ 0., -1.]]), tensor([[0.0000, 0.5000]]))
    """
    kind = canonical_kl_name(kind)
    delta = log_probs - ref_log_probs
    if kind == "kl":
        return delta
    if kind == "abs":
        return delta.abs()
    if kind == "mse":
        return 0.5 * delta.square()
    delta = delta.clamp(min=-20.0, max=20.0)  # as verl: exp(-delta) stays finite
    return (torch.exp(-delta) - 1.0 + delta).clamp(min=-10.0, max=10.0)
