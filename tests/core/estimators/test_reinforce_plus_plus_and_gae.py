"""The token-level estimators, REINFORCE++ (arXiv:2501.03262) and GAE (arXiv:1506.02438): hand tables,
plain float64 per-row loops, verl's carry through untrained tokens, the blocked discounted
returns, and bad token batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rllm_torch import (
    GroupedRewards,
    TokenRewards,
    compute_advantages,
    gae,
    reinforce_plus_plus,
)
from rllm_torch.core.errors import InvalidRewardsError, InvalidRewardTypeError
from rllm_torch.core.returns import discounted_returns

settings.register_profile("estimators", max_examples=60, deadline=None)


def row_returns_reference(rewards, mask, gamma):
    """Per row, from the end: ``G = r + gamma G`` at trained tokens; untrained tokens carry G."""
    out = np.zeros_like(rewards, dtype=np.float64)
    for b in range(rewards.shape[0]):
        running = 0.0
        for t in reversed(range(rewards.shape[1])):
            if mask[b, t]:
                running = rewards[b, t] + gamma * running
                out[b, t] = running
    return out


def row_gae_reference(rewards, values, mask, gamma, lam):
    adv = np.zeros_like(rewards, dtype=np.float64)
    for b in range(rewards.shape[0]):
        next_value, running = 0.0, 0.0
        for t in reversed(range(rewards.shape[1])):
            if mask[b, t]:
                delta = rewards[b, t] + gamma * next_value - values[b, t]
                running = delta + gamma * lam * running
                adv[b, t], next_value = running, values[b, t]
    return adv, (adv + values) * mask


def whiten_reference(x, mask, epsilon=1e-6):
    trained = x[mask > 0]
    if trained.size == 0:
        return np.zeros_like(x)
    return (x - trained.mean()) / (trained.std() + epsilon) * mask


def verl_reinforce_plus_plus_reference(rewards, mask, gamma):
    """verl 0.9.1's ``compute_reinforce_plus_plus_outcome_advantage`` recurrence as a float64 loop
    over time: ``new = r_t + gamma * running``; the return is ``new`` on a trained token; an
    untrained token carries ``running`` through unchanged (its own reward is dropped); then
    ``masked_whiten``: sample variance, ``(x - mean) * rsqrt(var + 1e-8)``."""
    returns = np.zeros_like(rewards, dtype=np.float64)
    running = np.zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        new = rewards[:, t] + gamma * running
        returns[:, t] = new * mask[:, t]
        running = new * mask[:, t] + running * (1 - mask[:, t])
    trained = returns[mask > 0]
    adv = (returns - trained.mean()) / np.sqrt(trained.var(ddof=1) + 1e-8) * mask
    return adv, returns


@st.composite
def token_batches(draw):
    rows, width = draw(st.integers(0, 6)), draw(st.integers(1, 9))
    rewards = np.array(draw(st.lists(st.floats(-5, 5), min_size=rows * width, max_size=rows * width))).reshape(
        rows, width
    )
    mask = np.array(draw(st.lists(st.booleans(), min_size=rows * width, max_size=rows * width))).reshape(rows, width)
    values = np.array(draw(st.lists(st.floats(-3, 3), min_size=rows * width, max_size=rows * width))).reshape(
        rows, width
    )
    gamma = draw(st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0]))
    lam = draw(st.sampled_from([0.0, 0.8, 0.95, 1.0]))
    return rewards, mask.astype(np.float64), values, gamma, lam


def test_reinforce_plus_plus_hand_table_with_padding_and_gamma_one_and_below():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 9.0], [0.0, 2.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])  # row 0: one padding token (its reward ignored)
    _, returns = reinforce_plus_plus(TokenRewards(rewards, mask), gamma=1.0)
    torch.testing.assert_close(returns, torch.tensor([[1.0, 1.0, 1.0, 0.0], [2.0, 2.0, 0.0, 0.0]]))
    adv, returns = reinforce_plus_plus(TokenRewards(rewards, mask), gamma=0.5)
    torch.testing.assert_close(returns, torch.tensor([[0.25, 0.5, 1.0, 0.0], [1.0, 2.0, 0.0, 0.0]]))
    trained = returns[mask > 0]
    want = (returns - trained.mean()) / (trained.std(correction=0) + 1e-6) * mask
    torch.testing.assert_close(adv, want)
    assert torch.equal(adv[mask == 0], torch.zeros(3))


def test_reinforce_plus_plus_edge_cases():
    empty_adv, empty_ret = reinforce_plus_plus(TokenRewards(torch.zeros(0, 5), torch.zeros(0, 5)), gamma=0.9)
    assert empty_adv.shape == empty_ret.shape == (0, 5)
    none_trained, _ = reinforce_plus_plus(TokenRewards(torch.ones(2, 3), torch.zeros(2, 3)))
    assert torch.equal(none_trained, torch.zeros(2, 3))
    equal_returns = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    constant, _ = reinforce_plus_plus(TokenRewards(equal_returns, torch.ones(2, 3)), gamma=1.0)
    assert torch.equal(constant, torch.zeros(2, 3))  # every return is 1: exactly 0, not 0/eps noise
    row_of_one, _ = reinforce_plus_plus(TokenRewards(torch.tensor([[3.0]]), torch.ones(1, 1)))
    assert torch.equal(row_of_one, torch.zeros(1, 1))


def test_reinforce_plus_plus_carries_the_return_through_untrained_tokens_as_verl_does():
    """A multi-turn row with a tool output (untrained tokens) inside the response: the return
    passes through it undiscounted, in ours and in verl 0.9.1 alike (1e-6, with verl's sample
    variance and no epsilon)."""
    gen = torch.Generator().manual_seed(3)
    rewards = torch.randn(6, 12, generator=gen, dtype=torch.float64)
    mask = torch.ones(6, 12, dtype=torch.float64)
    mask[:, 4:7] = 0  # a tool's output in every row
    mask[2, 9:] = 0  # and padding
    for gamma in (1.0, 0.9):
        adv, returns = reinforce_plus_plus(TokenRewards(rewards, mask), gamma=gamma, epsilon=0.0, std_correction=1)
        want_adv, want_returns = verl_reinforce_plus_plus_reference(rewards.numpy(), mask.numpy(), gamma)
        np.testing.assert_allclose(returns.numpy(), want_returns, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(adv.numpy(), want_adv, rtol=1e-6, atol=1e-6)
        assert returns[0, 3] == pytest.approx(rewards[0, 3].item() + gamma * returns[0, 7].item())  # across the tool


@settings(settings.get_profile("estimators"))
@given(data=token_batches())
def test_token_level_estimators_match_a_per_row_float64_loop(data):
    rewards, mask, values, gamma, lam = data
    as_t = torch.from_numpy
    adv, returns = reinforce_plus_plus(TokenRewards(as_t(rewards), as_t(mask)), gamma=gamma)
    want_returns = row_returns_reference(rewards, mask, gamma)
    np.testing.assert_allclose(returns.numpy(), want_returns, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(adv.numpy(), whiten_reference(want_returns, mask), rtol=1e-6, atol=1e-6)
    batch = TokenRewards(as_t(rewards), as_t(mask), values=as_t(values))
    adv, returns = gae(batch, gamma=gamma, lam=lam, whiten=False)
    want_adv, want_ret = row_gae_reference(rewards, values, mask, gamma, lam)
    np.testing.assert_allclose(adv.numpy(), want_adv, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(returns.numpy(), want_ret, rtol=1e-9, atol=1e-9)
    whitened, _ = gae(batch, gamma=gamma, lam=lam)
    np.testing.assert_allclose(whitened.numpy(), whiten_reference(want_adv, mask), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("width", [63, 64, 65, 200, 1000])
def test_discounted_returns_over_many_blocks_match_the_loop_in_float64(width):
    gen = torch.Generator().manual_seed(width)
    rewards = torch.randn(5, width, generator=gen, dtype=torch.float64)
    mask = (torch.rand(5, width, generator=gen) > 0.3).double()
    mask[0, 10:150] = 0  # a long untrained stretch across block boundaries
    mask[1] = 0  # a row with no trained token
    for gamma in (0.0, 0.001, 0.01, 0.3, 0.9, 0.999, 1.0):  # 0 and 1: their own closed forms
        got = discounted_returns(rewards * mask, mask, gamma)
        want = row_returns_reference(rewards.numpy(), mask.numpy(), gamma)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)


def test_discounted_returns_in_float32_match_float64_on_long_rows():
    gen = torch.Generator().manual_seed(0)
    rewards, mask = torch.randn(16, 1024, generator=gen), (torch.rand(16, 1024, generator=gen) > 0.1).float()
    for gamma in (0.0, 0.01, 0.5, 0.99, 1.0):
        got = discounted_returns(rewards * mask, mask, gamma)
        want = row_returns_reference(rewards.double().numpy(), mask.numpy(), gamma)
        np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-4, atol=2e-3)


def test_gae_hand_table():
    rewards, values = torch.tensor([[0.0, 1.0, 0.0]]), torch.tensor([[0.5, 0.25, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the last token is padding: its value is ignored
    adv, returns = gae(TokenRewards(rewards, mask, values=values), gamma=1.0, lam=1.0, whiten=False)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.75, 0.0]]))  # Monte-Carlo return 1 minus V
    torch.testing.assert_close(returns, torch.tensor([[1.0, 1.0, 0.0]]))
    adv, _ = gae(TokenRewards(rewards, mask, values=values), gamma=0.5, lam=0.0, whiten=False)
    torch.testing.assert_close(adv, torch.tensor([[0.0 + 0.5 * 0.25 - 0.5, 1.0 - 0.25, 0.0]]))  # one-step TD errors
    adv, _ = gae(TokenRewards(rewards, mask, values=values), gamma=0.5, lam=0.5, whiten=False)
    torch.testing.assert_close(adv, torch.tensor([[-0.375 + 0.25 * 0.75, 0.75, 0.0]]))


def test_gae_without_values_says_to_configure_a_critic():
    with pytest.raises(InvalidRewardsError, match="backend.critic.enable"):
        gae(TokenRewards(torch.zeros(1, 2), torch.ones(1, 2)))


@pytest.mark.parametrize(
    "key, value", [("gamma", 1.5), ("gamma", -0.1), ("lam", 2.0), ("gamma", float("nan")), ("lam", "0.9")]
)
def test_gamma_and_lam_outside_0_1_are_refused(key, value):
    batch = TokenRewards(torch.zeros(1, 2), torch.ones(1, 2), values=torch.zeros(1, 2))
    with pytest.raises((InvalidRewardsError, InvalidRewardTypeError), match=key):
        compute_advantages(batch, "gae", **{key: value})


@pytest.mark.parametrize(
    "args, error, message",
    [
        ((torch.zeros(2, 3), torch.ones(2, 4)), InvalidRewardsError, "shape"),
        ((torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2, 2)), InvalidRewardsError, "shape"),
        ((torch.zeros(3), torch.ones(3)), InvalidRewardsError, r"\[B, T\]"),
        (([[0.0, 1.0]], torch.ones(1, 2)), InvalidRewardTypeError, "tensor"),
        ((torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2)), InvalidRewardTypeError, "float"),
    ],
)
def test_bad_token_batches_are_typed_errors(args, error, message):
    rewards, mask, *values = args
    with pytest.raises(error, match=message):
        TokenRewards(rewards, mask, values=values[0] if values else None)


def test_token_level_and_outcome_estimators_refuse_the_other_kind_of_batch():
    with pytest.raises(InvalidRewardTypeError, match="TokenRewards"):
        compute_advantages(GroupedRewards.from_groups([[1.0, 0.0]]), "reinforce_plus_plus")
    with pytest.raises(InvalidRewardTypeError, match="GroupedRewards"):
        compute_advantages(TokenRewards(torch.zeros(1, 2), torch.ones(1, 2)), "grpo")
