"""The oracle: a plain per-group float64 loop, written the way rLLM's reference page computes,
with exact (``math.fsum``) sums and DESIGN.md's documented differences."""

from __future__ import annotations

import math

import numpy as np


def _mean(x: np.ndarray) -> float:
    if len(x) and bool((x == x[0]).all()):  # a constant group's mean is exact (DESIGN: advantages exactly 0)
        return float(x[0])
    return math.fsum(x.tolist()) / len(x)


def _std(x: np.ndarray, correction: int = 0) -> float:
    m = _mean(x)
    return math.sqrt(math.fsum(((x - m) ** 2).tolist()) / (len(x) - correction))


def reference_advantages(estimator: str, groups: list, *, norm_adv_by_std_in_grpo: bool = True, epsilon: float = 1e-6, std_correction: int = 0) -> list[np.ndarray]:
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
