"""GPG (arXiv:2504.02546, verl's ``gpg``): a hand table and a float64 loop."""

from __future__ import annotations

import torch
from grouped_cases import PEERS, check, flat, grouped
from hypothesis import given
from reference import reference_advantages

from rllm_torch import GroupedRewards, compute_advantages


def test_gpg_hand_table():
    # [1, 0, 0, 0 | 0, 0 | 3]: 2 of 7 nonzero, alpha = 7 / 2; means 0.25, 0, (a group of one: 0)
    adv, _ = compute_advantages(GroupedRewards.from_groups([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0], [3.0]]), "gpg")
    want = torch.tensor([0.75, -0.25, -0.25, -0.25, 0.0, 0.0, 3.0], dtype=torch.float64) * 3.5
    torch.testing.assert_close(adv, want)
    none, _ = compute_advantages(GroupedRewards.from_groups([[0.0, 0.0]]), "gpg")
    assert torch.equal(none, torch.zeros(2, dtype=torch.float64))  # no nonzero reward: alpha = B, A = 0


@PEERS
@given(groups=grouped())
def test_gpg_matches_a_float64_loop(groups):
    rewards, index = flat(groups)
    got, _ = compute_advantages(GroupedRewards.from_flat(rewards, index), "gpg")
    check(got, reference_advantages("gpg", groups))
