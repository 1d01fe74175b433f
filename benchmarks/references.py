"""The implementations we race against, all float32-in / float64-math numpy (as rLLM's code)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

EPS = 1e-6


# (b) a per-group numpy loop, the way rLLM's reference page computes it
def per_group_loop(estimator: str, groups: list[np.ndarray]) -> list[np.ndarray]:
    if estimator == "grpo":
        out = []
        for r in groups:
            mean, std = (0.0, 1.0) if len(r) <= 1 else (np.mean(r), np.std(r))
            out.append((r - mean) / (std + EPS))
        return out
    if estimator == "rloo":
        return [r if len(r) <= 1 else len(r) / (len(r) - 1) * (r - r.mean()) for r in groups]
    if estimator == "reinforce_plus_plus_baseline":
        centered = [r if len(r) <= 1 else r - np.mean(r) for r in groups]
        std = np.std(np.concatenate(centered))
        return [c / (std + EPS) for c in centered]
    raise KeyError(estimator)


# (c) a per-trajectory dictionary loop in plain Python
def dict_loop(estimator: str, labels: list, rewards: list[float]) -> list[float]:
    sums, counts = defaultdict(float), defaultdict(int)
    for label, r in zip(labels, rewards, strict=True):
        sums[label] += r
        counts[label] += 1
    means = {k: (sums[k] / counts[k] if counts[k] > 1 else 0.0) for k in sums}
    if estimator == "rloo":
        return [
            r - means[k] if counts[k] <= 1 else counts[k] / (counts[k] - 1) * (r - means[k])
            for k, r in zip(labels, rewards, strict=True)
        ]
    if estimator == "grpo":
        sq = defaultdict(float)
        for label, r in zip(labels, rewards, strict=True):
            sq[label] += (r - means[label]) ** 2
        stds = {k: (sq[k] / counts[k]) ** 0.5 if counts[k] > 1 else 1.0 for k in sums}
        return [(r - means[k]) / (stds[k] + EPS) for k, r in zip(labels, rewards, strict=True)]
    if estimator == "reinforce_plus_plus_baseline":
        centered = [r - means[k] for k, r in zip(labels, rewards, strict=True)]
        mean_c = sum(centered) / len(centered)
        std = (sum((c - mean_c) ** 2 for c in centered) / len(centered)) ** 0.5
        return [c / (std + EPS) for c in centered]
    raise KeyError(estimator)


# (d) label factorizing + bincount, vectorized numpy
def factorize_bincount(estimator: str, labels: np.ndarray, rewards: np.ndarray) -> np.ndarray:
    _, inverse = np.unique(labels, return_inverse=True)
    counts = np.bincount(inverse)
    n = counts[inverse]
    mean = np.bincount(inverse, weights=rewards) / counts
    centered = np.where(n > 1, rewards - mean[inverse], rewards)
    if estimator == "rloo":
        return np.where(n > 1, centered * n / np.maximum(n - 1, 1), centered)
    if estimator == "grpo":
        std = np.sqrt(np.bincount(inverse, weights=centered * centered) / counts)
        return centered / (np.where(n > 1, std[inverse], 1.0) + EPS)
    if estimator == "reinforce_plus_plus_baseline":
        return centered / (np.std(centered) + EPS)
    raise KeyError(estimator)
