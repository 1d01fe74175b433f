"""The optimal token baseline (verl's ``optimal_token_baseline``) against a float64 per-group loop
written from verl's formula (positions over trained tokens, the zero tail), with importance
weights, a group of one, missing inputs; and ``Σ π²`` of the chunked log-prob pass."""

from __future__ import annotations

import math

import pytest
import torch

from rllm_torch import TokenRewards, compute_advantages
from rllm_torch.backends.torch_backend.logprobs import chunked_token_log_probs
from rllm_torch.core.errors import InvalidRewardsError
from rllm_torch.core.estimators import optimal_token_baseline


def reference(rewards, mask, logp, sq, groups, weights=None):
    rows = []
    for b in range(len(rewards)):
        idx = [t for t in range(len(mask[b])) if mask[b][t]]
        r = [rewards[b][t] for t in idx]
        returns = [sum(r[k:]) for k in range(len(r))]
        w = [1 - 2 * math.exp(logp[b][t]) + sq[b][t] for t in idx]
        if weights is not None:
            w = [wk * weights[b][t] ** 2 for wk, t in zip(w, idx, strict=True)]
        cum = [sum(w[: k + 1]) for k in range(len(w))]
        rows.append((idx, returns, cum))
    out = [[0.0] * len(mask[0]) for _ in rewards]
    for b, (idx, returns, _) in enumerate(rows):
        members = [i for i in range(len(rewards)) if groups[i] == groups[b]]
        lengths = sorted((len(rows[i][0]) for i in members), reverse=True)
        unique_longest = len(members) > 1 and lengths[0] == len(idx) and (len(lengths) == 1 or lengths[1] < lengths[0])
        for k, t in enumerate(idx):
            reach = [i for i in members if len(rows[i][0]) > k]
            if len(members) == 1 or (unique_longest and k >= lengths[1]):
                baseline = 0.0
            else:
                baseline = sum(rows[i][1][k] * rows[i][2][k] for i in reach) / (
                    sum(rows[i][2][k] for i in reach) + 1e-8
                )
            out[b][t] = returns[k] - baseline
    return out


def random_tokens(seed, rows=7, width=6):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(rows, width, generator=gen, dtype=torch.float64)
    mask = (torch.rand(rows, width, generator=gen) > 0.25).double()
    logp = -torch.rand(rows, width, generator=gen, dtype=torch.float64) * 2
    sq = torch.rand(rows, width, generator=gen, dtype=torch.float64) * 0.5 + 0.1
    groups = torch.tensor([0, 0, 0, 1, 1, 2, 3][:rows])
    return rewards, mask, logp, sq, groups


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("weighted", [False, True])
def test_matches_a_float64_loop_of_verls_formula(seed, weighted):
    rewards, mask, logp, sq, groups = random_tokens(seed)
    weights = torch.rand(rewards.shape, dtype=torch.float64) + 0.5 if weighted else None
    batch = TokenRewards(
        rewards, mask, old_log_probs=logp, sum_pi_squared=sq, group_index=groups, importance_weights=weights
    )
    adv, returns = compute_advantages(batch, "optimal_token_baseline")
    want = reference(
        rewards.tolist(),
        mask.tolist(),
        logp.tolist(),
        sq.tolist(),
        groups.tolist(),
        None if weights is None else weights.tolist(),
    )
    torch.testing.assert_close(adv, torch.tensor(want, dtype=torch.float64) * mask, rtol=1e-10, atol=1e-10)
    assert (returns * (1 - mask)).abs().sum() == 0


def test_a_group_of_one_keeps_its_return_and_equal_responses_share_the_baseline():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 1.0], [0.0, 2.0]], dtype=torch.float64)
    batch = TokenRewards(
        rewards,
        torch.ones(3, 2),
        old_log_probs=torch.full((3, 2), -1.0),
        sum_pi_squared=torch.full((3, 2), 0.3),
        group_index=torch.tensor([0, 0, 1]),
    )
    adv, returns = optimal_token_baseline(batch)
    assert adv[:2].abs().max().item() < 1e-6  # identical responses: baseline = their return
    torch.testing.assert_close(adv[2], returns[2])


def test_missing_inputs_name_the_field_and_the_setting():
    with pytest.raises(InvalidRewardsError, match="sum_pi_squared"):
        optimal_token_baseline(
            TokenRewards(
                torch.zeros(1, 1), torch.ones(1, 1), old_log_probs=torch.zeros(1, 1), group_index=torch.tensor([0])
            )
        )


def test_the_log_prob_pass_gives_sum_pi_squared_of_the_temperature_scaled_distribution():
    h, w, y = (
        torch.randn(9, 4, dtype=torch.float64),
        torch.randn(11, 4, dtype=torch.float64),
        torch.randint(0, 11, (9,)),
    )
    logp, _, squares = chunked_token_log_probs(h, w, y, temperature=0.7, chunk_tokens=2, with_sum_pi_squared=True)
    p = torch.softmax(h @ w.T / 0.7, -1)
    torch.testing.assert_close(squares, (p**2).sum(-1))
    torch.testing.assert_close(logp, p.log().gather(1, y[:, None]).squeeze(1))
