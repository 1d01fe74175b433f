"""GPG (arXiv:2504.02546, verl's ``gpg``): a hand table and a float64 loop."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import reference_advantages

from rllm_torch import GroupedRewards, compute_advantages

settings.register_profile("peers", max_examples=40, deadline=None)


@st.composite
def grouped(draw, max_groups: int = 6, columns: int = 0):
    """Ragged groups of rewards (quarters, so ties happen) and, with ``columns``, ``[n_g, R]``."""
    value = st.integers(-8, 8).map(lambda v: v / 4)
    sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=max_groups))
    groups = [[draw(value) for _ in range(n)] for n in sizes]
    if not columns:
        return groups
    return groups, [[[draw(value) for _ in range(columns)] for _ in range(n)] for n in sizes]


def _flat(groups):
    rewards = torch.tensor([v for g in groups for v in g], dtype=torch.float64)
    index = torch.repeat_interleave(torch.arange(len(groups)), torch.tensor([len(g) for g in groups]))
    return rewards, index


def _check(got: torch.Tensor, want: list[np.ndarray], **tol):
    np.testing.assert_allclose(got.numpy(), np.concatenate(want), **(tol or dict(rtol=1e-9, atol=1e-9)))


def test_gpg_hand_table():
    # [1, 0, 0, 0 | 0, 0 | 3]: 2 of 7 nonzero, alpha = 7 / 2; means 0.25, 0, (a group of one: 0)
    adv, _ = compute_advantages(GroupedRewards.from_groups([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0], [3.0]]), "gpg")
    want = torch.tensor([0.75, -0.25, -0.25, -0.25, 0.0, 0.0, 3.0], dtype=torch.float64) * 3.5
    torch.testing.assert_close(adv, want)
    none, _ = compute_advantages(GroupedRewards.from_groups([[0.0, 0.0]]), "gpg")
    assert torch.equal(none, torch.zeros(2, dtype=torch.float64))  # no nonzero reward: alpha = B, A = 0


@settings(settings.get_profile("peers"))
@given(groups=grouped())
def test_gpg_matches_a_float64_loop(groups):
    rewards, index = _flat(groups)
    got, _ = compute_advantages(GroupedRewards.from_flat(rewards, index), "gpg")
    _check(got, reference_advantages("gpg", groups))
