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
the old policy's log-probs, without gradient. A name with ``+`` after it (verl's ``k3+``) has the
estimator's value and ``k2``'s gradient ``δ ∇ log π_θ`` (a straight-through estimator: ``k3``'s own
gradient ``(1 - e^{-δ}) ∇ log π_θ`` is biased for the KL's gradient, ``k2``'s is not).
:func:`bias_corrected_kl` is TRL's importance-corrected ``k3`` for samples from ``π_old``.

Sources: Schulman, "Approximating KL Divergence" (2020, http://joschu.net/blog/kl-approx.html);
DeepSeekMath (Shao et al. 2024, arXiv:2402.03300, eq. 4: the ``k3`` loss term of GRPO); verl
``verl/trainer/ppo/core_algos.py::kl_penalty`` (names, the ``low_var_kl`` clamp, the ``+``
forms); TRL ``use_bias_correction_kl`` (DeepSeek-V3.2, arXiv:2512.02556).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["KL_ESTIMATORS", "kl_penalty", "canonical_kl_name", "bias_corrected_kl"]

_BASE = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
KL_ESTIMATORS = _BASE + tuple(f"{name}+" for name in _BASE)
_CANONICAL = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}


def canonical_kl_name(name: str) -> str:
    """verl's name of a KL estimator (``k1`` → ``kl``, ``k2`` → ``mse``, ``k3`` → ``low_var_kl``).

    Raises:
        ValueError: an unknown name.
    """
    if name not in KL_ESTIMATORS:
        raise ValueError(f"KL estimator {name!r} is not one of {KL_ESTIMATORS}.")
    base, plus = name.removesuffix("+"), "+" if name.endswith("+") else ""
    return _CANONICAL.get(base, base) + plus


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
    if kind.endswith("+"):  # the estimator's value, k2's gradient (straight through)
        value = kl_penalty(log_probs, ref_log_probs, kind[:-1]).detach()
        k2 = 0.5 * (log_probs - ref_log_probs).square()
        return k2 - k2.detach() + value
    delta = log_probs - ref_log_probs
    if kind == "kl":
        return delta
    if kind == "abs":
        return delta.abs()
    if kind == "mse":
        return 0.5 * delta.square()
    delta = delta.clamp(min=-20.0, max=20.0)  # as verl: exp(-delta) stays finite
    return (torch.exp(-delta) - 1.0 + delta).clamp(min=-10.0, max=10.0)


def bias_corrected_kl(kl: Tensor, log_probs: Tensor, old_log_probs: Tensor) -> Tensor:
    """``kl [N, T]`` times the importance ratio ``π_θ / π_old`` (with gradient through it): the
    KL estimate for tokens sampled from ``π_old`` corrected to ``π_θ`` (TRL's
    ``use_bias_correction_kl``). On-policy the ratio is 1 and its gradient adds ``kl ∇ log π_θ``.

    Examples:
        >>> kl, logp = torch.tensor([[0.5]]), torch.tensor([[-1.0]])
        >>> bias_corrected_kl(kl, logp, logp - 0.1)
        tensor([[0.5526]])
    """
    return kl * (log_probs - old_log_probs).exp()
