"""Which tokens the policy loss trains on (:mod:`rllm_torch.core.losses.token_selection`): the
high-entropy mask against ``numpy.quantile`` on one process and over 2 gloo ranks; the off-policy
sequence mask by hand and against a loop; bad values."""

from __future__ import annotations

import numpy as np
import pytest
import rank_tasks
import torch
from rank_pool import RankPool

from rllm_torch.core.losses import high_entropy_mask, off_policy_sequence_mask


@pytest.mark.parametrize("quantile", [0.0, 0.2, 0.5, 0.9, 1.0])
def test_the_entropy_mask_keeps_the_tokens_at_or_above_numpys_quantile(quantile):
    gen = torch.Generator().manual_seed(0)
    entropy, mask = (
        torch.rand(6, 7, generator=gen, dtype=torch.float64),
        (torch.rand(6, 7, generator=gen) > 0.3).double(),
    )
    got = high_entropy_mask(entropy, mask, quantile)
    values = entropy[mask > 0].numpy()
    threshold = np.quantile(values, 1 - quantile)
    want = (entropy.numpy() >= threshold) & (mask.numpy() > 0)
    assert np.array_equal(got.numpy(), want)
    assert got.sum().item() >= max(1, int(quantile * len(values)))


@pytest.fixture(scope="module")
def pool():
    ranks = RankPool(2)
    yield ranks
    ranks.close()


def test_on_two_ranks_the_quantile_is_over_every_ranks_tokens(pool):
    gen = torch.Generator().manual_seed(1)
    entropy, mask = torch.rand(6, 5, generator=gen), (torch.rand(6, 5, generator=gen) > 0.2).float()
    want = high_entropy_mask(entropy, mask, 0.3)
    parts = [(entropy[:2].tolist(), mask[:2].tolist(), 0.3), (entropy[2:].tolist(), mask[2:].tolist(), 0.3)]
    got = pool.run_ok(rank_tasks.entropy_mask, parts)
    assert torch.tensor(got[0] + got[1]).equal(want)


def test_the_off_policy_mask_drops_only_negative_sequences_that_moved_past_the_threshold():
    logp = torch.tensor([[-2.0, -2.0], [-2.0, -2.0], [-1.1, -1.1], [-3.0, -3.0]])
    behaviour = torch.full((4, 2), -1.0)  # mean KL: 1, 1, 0.1, 2
    adv = torch.tensor([[-1.0, -1.0], [1.0, 1.0], [-1.0, -1.0], [0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    got = off_policy_sequence_mask(logp, behaviour, adv, mask, 0.5)
    assert got.squeeze(-1).tolist() == [0.0, 1.0, 1.0, 1.0]  # A = 0 is kept, as TRL


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf"), True])
def test_a_threshold_that_is_not_a_finite_non_negative_number_is_refused(bad):
    t = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="off_policy_mask_threshold"):
        off_policy_sequence_mask(t, t, t, torch.ones(1, 1), bad)


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan")])
def test_a_quantile_outside_0_1_is_refused(bad):
    with pytest.raises(ValueError, match="top_entropy_quantile"):
        high_entropy_mask(torch.zeros(1, 1), torch.ones(1, 1), bad)
