"""What the estimator tests that compare with a float64 loop share: their hypothesis settings,
ragged groups of rewards, the groups' flat form and the comparison with the loop's per-group arrays."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import settings
from hypothesis import strategies as st

#: 40 examples, no deadline (the first call of an estimator compiles nothing but may be slow).
PEERS = settings(max_examples=40, deadline=None)


@st.composite
def grouped(draw, max_groups: int = 6, columns: int = 0):
    """Ragged groups of rewards (quarters, so ties happen) and, with ``columns``, ``[n_g, R]``."""
    value = st.integers(-8, 8).map(lambda v: v / 4)
    sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=max_groups))
    groups = [[draw(value) for _ in range(n)] for n in sizes]
    if not columns:
        return groups
    return groups, [[[draw(value) for _ in range(columns)] for _ in range(n)] for n in sizes]


def flat(groups):
    """``(rewards, index)``: the groups' float64 rewards end to end and each one's group number."""
    rewards = torch.tensor([v for g in groups for v in g], dtype=torch.float64)
    index = torch.repeat_interleave(torch.arange(len(groups)), torch.tensor([len(g) for g in groups]))
    return rewards, index


def check(got: torch.Tensor, want: list[np.ndarray], **tol):
    """``got`` equals the loop's per-group arrays ``want`` end to end (default tolerance 1e-9)."""
    np.testing.assert_allclose(got.numpy(), np.concatenate(want), **(tol or dict(rtol=1e-9, atol=1e-9)))
