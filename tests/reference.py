"""The oracle: a plain per-group float64 loop, written the way rLLM's reference page computes,
with exact rational statistics (so a constant group's mean is its value) and DESIGN.md's
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
) -> list[np.ndarray]:
    """Per-group float64 advantages of a built-in estimator."""
    groups = [np.asarray(g, dtype=np.float64).reshape(-1) for g in groups]
    if estimator == "grpo":
        out = []
        for r in groups:
            mean, std = (0.0, 1.0) if len(r) <= 1 else (_mean(r), _std(r, std_correction))
            out.append((r - mean) / (std + epsilon) if norm_adv_by_std_in_grpo else r - mean)
        return out
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
