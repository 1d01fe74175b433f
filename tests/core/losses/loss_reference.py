"""Plain float64 references for the policy-loss tests: per-token Python loops and the four
aggregation modes written out, and random batches with padding, both signs of advantage and
ratios away from 1."""

from __future__ import annotations

import math

import torch

MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
HORIZON = 5


def aggregate(loss, mask, mode, horizon=HORIZON):
    """``loss`` and ``mask`` as lists of rows of Python floats."""
    rows = [(row, m) for row, m in zip(loss, mask, strict=True) if sum(m) > 0]
    if mode == "token-mean":
        total = sum(v * w for row, m in rows for v, w in zip(row, m, strict=True))
        return total / max(sum(sum(m) for _, m in rows), 1.0)
    if not rows:
        return 0.0
    sums = [sum(v * w for v, w in zip(row, m, strict=True)) for row, m in rows]
    if mode == "seq-mean-token-sum":
        return sum(sums) / len(rows)
    if mode == "seq-mean-token-mean":
        return sum(s / sum(m) for s, (_, m) in zip(sums, rows, strict=True)) / len(rows)
    return sum(s / horizon for s in sums) / len(rows)


def random_batch(seed, rows=5, width=5):
    """``(log_probs, old_log_probs, advantages, mask)`` float64 ``[rows, width]``: per-sequence
    advantages of both signs, ratios within ``e^{±0.6}``, one fully masked row."""
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, width, generator=gen, dtype=torch.float64) * 3 - 0.05
    logp = (old + (torch.rand(rows, width, generator=gen, dtype=torch.float64) - 0.5) * 1.2).clamp(max=-1e-3)
    lengths = torch.randint(1, width + 1, (rows,), generator=gen)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).double()
    mask[-1] = 0.0
    adv = (torch.randn(rows, 1, generator=gen, dtype=torch.float64)).expand(rows, width) * mask
    return logp, old, adv.contiguous(), mask


def rows(t):
    return t.tolist()


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))
