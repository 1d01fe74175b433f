"""Accuracy of GRPO at a large common offset: rllm_torch against a reference on the rewards as stored.

    python benchmarks/accuracy_at_offsets.py

float32 rewards ``1e4 + 0.01 u`` (4096 groups of 8, dense and ragged layouts): the largest
absolute error of GRPO's advantages against float64 arithmetic on the same float32 values
(deviations from the group's first member, exact in float64 for float32 inputs). float64
rewards ``1e8 + 1e-5 u``: the largest error of ``x - mean`` (Dr. GRPO) over 64 groups, relative
to the group's largest deviation, against exact rational arithmetic. A mean rounded to the
rewards' dtype before the subtraction errs by half an ulp of the offset: about 0.7 and 3e-3.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import torch

from rllm_torch import GroupedRewards, compute_advantages

GROUPS, SIZE = 4096, 8


def _batches(rewards: torch.Tensor) -> dict[str, GroupedRewards]:
    index = torch.arange(GROUPS).repeat_interleave(SIZE)
    return {
        "dense": GroupedRewards.from_padded(rewards.view(GROUPS, SIZE)),
        "ragged": GroupedRewards.from_flat(rewards, index, num_groups=GROUPS),
    }


def float32_error(u: np.ndarray) -> dict[str, float]:
    stored = (1e4 + 0.01 * u).astype(np.float32)
    x = stored.astype(np.float64).reshape(GROUPS, SIZE)
    d = x - x[:, :1]
    d -= d.mean(1, keepdims=True)
    want = (d / (np.sqrt((d * d).mean(1, keepdims=True)) + 1e-6)).ravel()
    return {
        layout: float(np.abs(compute_advantages(batch, "grpo")[0].double().numpy() - want).max())
        for layout, batch in _batches(torch.from_numpy(stored)).items()
    }


def float64_error(u: np.ndarray, groups: int = 64) -> dict[str, float]:
    stored = 1e8 + 1e-5 * u
    rows = stored.reshape(GROUPS, SIZE)[:groups]
    want = np.array([[float(Fraction(v) - sum(map(Fraction, row)) / SIZE) for v in row] for row in rows])
    out = {}
    for layout, batch in _batches(torch.from_numpy(stored)).items():
        got = compute_advantages(batch, "grpo", norm_adv_by_std_in_grpo=False)[0].numpy()[: groups * SIZE]
        err = np.abs(got.reshape(groups, SIZE) - want).max(1) / np.abs(want).max(1)
        out[layout] = float(err.max())
    return out


def main() -> None:
    u = np.random.default_rng(0).random(GROUPS * SIZE)
    for layout, err in float32_error(u).items():
        print(f"float32, 1e4 + 0.01 u, {layout}: GRPO max abs error {err:.2g}")
    for layout, err in float64_error(u).items():
        print(f"float64, 1e8 + 1e-5 u, {layout}: x - mean max error / largest deviation {err:.2g}")


if __name__ == "__main__":
    main()
