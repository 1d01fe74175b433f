"""The oracle: a plain per-group float64 loop, written the way rLLM's reference page computes,
with exact rational statistics (so a constant group's mean is its value) and docs/design.md's
documented differences."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np


def _exact_mean(x: np.ndarray) -> Fraction:
    return sum(map(Fraction, x.tolist()), Fraction(0)) / len(x)


def _mean(x: np.ndarray) -> float:
    return float(_exact_mean(x))


def _std(x: np.ndarray, correction: int = 0) -> float:
    m = _exact_mean(x)
    return math.sqrt(float(sum(((Fraction(v) - m) ** 2 for v in x.tolist()), Fraction(0)) / (len(x) - correction)))


def reference_advantages(
    estimator: str,
    groups: list,
    *,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
    std_correction: int = 0,
    scale_rewards: str = "group",
) -> list[np.ndarray]:
    """Per-group float64 advantages of a built-in estimator."""
    groups = [np.asarray(g, dtype=np.float64).reshape(-1) for g in groups]
    if estimator == "grpo" and scale_rewards == "batch":  # TRL: the group mean, the batch's std of the rewards
        if not groups or not sum(map(len, groups)):
            return [r.copy() for r in groups]
        std = _std(np.concatenate(groups), std_correction)
        return [(r - (0.0 if len(r) <= 1 else _mean(r))) / (std + epsilon) for r in groups]
    if estimator == "grpo":
        out = []
        for r in groups:
            mean, std = (0.0, 1.0) if len(r) <= 1 else (_mean(r), _std(r, std_correction))
            out.append((r - mean) / (std + epsilon) if norm_adv_by_std_in_grpo else r - mean)
        return out
    if estimator == "grpo_passk":  # verl: the best member gets max - second max (ties count), others 0
        out = []
        for r in groups:
            adv = np.zeros_like(r)
            if len(r):
                best = int(np.argmax(r))
                second = 0.0 if len(r) == 1 else float(np.sort(r)[-2])
                std = 1.0 if len(r) == 1 else _std(r, std_correction)
                adv[best] = (r[best] - second) / (std + epsilon if norm_adv_by_std_in_grpo else 1.0)
            out.append(adv)
        return out
    if estimator == "gpg":  # verl: alpha (r - mean), alpha = B / max(1, number of nonzero rewards)
        everything = np.concatenate(groups) if groups else np.zeros(0)
        alpha = len(everything) / max(1, int(np.count_nonzero(everything)))
        return [alpha * (r - (0.0 if len(r) <= 1 else _mean(r))) for r in groups]
    if estimator == "rloo":
        return [r.copy() if len(r) <= 1 else len(r) / (len(r) - 1) * (r - _mean(r)) for r in groups]
    if estimator == "reinforce":
        return [r.copy() for r in groups]
    if estimator == "reinforce_plus_plus_baseline":
        centered = [r.copy() if len(r) <= 1 else r - _mean(r) for r in groups]
        if not centered or not sum(map(len, centered)):
            return centered
        std = _std(np.concatenate(centered))
        return [c / (std + epsilon) for c in centered]
    if estimator == "prpo":
        if not groups or not sum(map(len, groups)):
            return [r.copy() for r in groups]
        everything = np.concatenate(groups)
        mean, std = _mean(everything), _std(everything)
        return [(r - mean) / (std + epsilon) for r in groups]
    raise KeyError(estimator)


BUILTINS = ("grpo", "rloo", "reinforce", "reinforce_plus_plus_baseline", "prpo")
GROUP_WISE = ("grpo", "rloo", "reinforce")  # no batch-wide statistic


def gdpo_reference(
    components: list[np.ndarray], weights: list[float] | None = None, epsilon: float = 1e-6, std_correction: int = 0
) -> list[np.ndarray]:
    """GDPO per group from each group's ``[n_g, R]`` rewards: every column GRPO-normalised in its
    group, the weighted sum, then ``(s - mean) / (std + epsilon)`` over the whole batch."""
    components = [np.asarray(c, dtype=np.float64).reshape(len(c), -1) for c in components]
    count = components[0].shape[1]
    weights = [1.0] * count if weights is None else weights
    sums = []
    for c in components:
        z = [
            reference_advantages("grpo", [c[:, k]], epsilon=epsilon, std_correction=std_correction)[0]
            for k in range(count)
        ]
        sums.append(sum(w * zk for w, zk in zip(weights, z, strict=True)))
    everything = np.concatenate(sums)
    mean, std = _mean(everything), _std(everything, std_correction)
    return [(s - mean) / (std + epsilon) for s in sums]
