"""The one aggregation object every loss takes (``Aggregation``, what ``LossContext.aggregate``
is): its mode, Dr. GRPO's horizon and the global count it divides by; another mode asked of it
divides by the call's own count; a loss that pins its mode gets a copy in that mode. Expected
values are worked by hand in the comments."""

from __future__ import annotations

import pytest
import torch

from rllm_torch.core.losses import AGG_MODES, Aggregation, aggregate_loss

# Two trained rows: row 0 has 1 and 3 (sum 4, mean 2), row 1 has 2 (sum 2, mean 2); 9 is masked.
LOSS = torch.tensor([[1.0, 3.0], [2.0, 9.0]])
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]])


@pytest.mark.parametrize(
    "mode, normaliser, want",
    [
        # the global counts of a data-parallel mini-batch: 6 tokens, 4 sequences over the ranks
        ("token-mean", 6.0, (4 + 2) / 6),
        ("seq-mean-token-sum", 4.0, (4 + 2) / 4),
        ("seq-mean-token-mean", 4.0, (2 + 2) / 4),
        ("seq-mean-token-sum-norm", 4.0, (4 + 2) / (4 * 3)),  # horizon 3
        # no normaliser: this batch's own counts, 3 tokens and 2 sequences
        ("token-mean", None, 6 / 3),
        ("seq-mean-token-sum", None, 6 / 2),
        ("seq-mean-token-mean", None, 4 / 2),
        ("seq-mean-token-sum-norm", None, 6 / (2 * 3)),
    ],
)
def test_it_divides_by_its_normaliser_in_its_mode(mode, normaliser, want):
    agg = Aggregation(mode, horizon=3, normaliser=None if normaliser is None else torch.tensor(normaliser))
    assert agg(LOSS, MASK).item() == pytest.approx(want)
    assert agg(LOSS, MASK, mode).item() == pytest.approx(want)  # its own mode named: the same


def test_another_mode_asked_of_it_divides_by_the_calls_own_count_not_its_normaliser():
    # a token-mean run over 6 global tokens; a registered loss asks for seq-mean-token-sum: the 6
    # counts tokens, not sequences, so the call's own 2 sequences divide: (4 + 2) / 2 = 3
    agg = Aggregation("token-mean", normaliser=torch.tensor(6.0))
    assert agg(LOSS, MASK, "seq-mean-token-sum").item() == pytest.approx(3.0)
    assert agg(LOSS, MASK).item() == pytest.approx(1.0)  # (4 + 2) / 6


def test_a_pinned_copy_takes_the_mode_and_the_count_given_and_the_same_mode_is_itself():
    run = Aggregation("token-mean", horizon=3, normaliser=torch.tensor(6.0))
    assert run.pinned(None, torch.tensor(9.0)) is run and run.pinned("token-mean", torch.tensor(9.0)) is run
    gspo = run.pinned("seq-mean-token-mean", torch.tensor(4.0))
    assert (gspo.mode, gspo.horizon, float(gspo.normaliser)) == ("seq-mean-token-mean", 3, 4.0)
    assert gspo(LOSS, MASK).item() == pytest.approx(1.0)  # (2 + 2) / 4
    assert run.mode == "token-mean" and float(run.normaliser) == 6.0  # the run's is left as it was


def test_an_unknown_mode_or_a_missing_horizon_is_refused_when_it_is_made():
    with pytest.raises(ValueError, match=r"loss_agg_mode='seq-sum' is not one of"):
        Aggregation("seq-sum")
    with pytest.raises(ValueError, match=r"needs a positive horizon"):
        Aggregation("seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match=r"loss_agg_mode='seq-sum' is not one of"):
        Aggregation()(LOSS, MASK, "seq-sum")


@pytest.mark.parametrize("normaliser", [None, torch.tensor(4.0)])
def test_aggregate_loss_refuses_an_unknown_mode_also_when_given_a_normaliser(normaliser):
    """With a normaliser the count is not computed from the mode, so an unknown mode reached the
    last branch and came back as seq-mean-token-sum-norm's number: (4 + 2) / (4 * 3) = 0.5."""
    with pytest.raises(ValueError, match=r"loss_agg_mode='seq-sum' is not one of"):
        aggregate_loss(LOSS, MASK, "seq-sum", horizon=3, normaliser=normaliser)


def test_its_numbers_are_aggregate_losss_to_the_bit_in_every_mode():
    gen = torch.Generator().manual_seed(0)
    loss, mask = torch.randn(4, 5, generator=gen), (torch.rand(4, 5, generator=gen) > 0.3).float()
    for mode in AGG_MODES:
        count = torch.tensor(7.0)
        want = aggregate_loss(loss, mask, mode, horizon=5, normaliser=count)
        assert torch.equal(Aggregation(mode, 5, count)(loss, mask), want)
