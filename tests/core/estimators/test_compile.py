"""The estimators beyond rLLM's under ``torch.compile(fullgraph=True)``: the same numbers as eager,
no graph break (the grpo, rloo and REINFORCE++ baseline forms: tests/core/test_contracts.py)."""

from __future__ import annotations

import math

import torch

from rllm_torch import GroupedRewards, TokenRewards, compute_advantages, gae, opo, reinforce_plus_plus


def test_opo_and_the_token_level_estimators_compile_with_fullgraph():
    rewards_GK, weights_GK = torch.rand(6, 4), torch.randint(1, 9, (6, 4)).float()
    compiled = torch.compile(
        lambda r, w: opo(GroupedRewards.from_padded(r, weights=w, validate=False))[0], fullgraph=True
    )
    torch.testing.assert_close(
        compiled(rewards_GK, weights_GK), opo(GroupedRewards.from_padded(rewards_GK, weights=weights_GK))[0]
    )
    rewards, mask, values = torch.randn(5, 7), (torch.rand(5, 7) > 0.3).float(), torch.randn(5, 7)
    for fn, kwargs in ((reinforce_plus_plus, dict(gamma=0.9)), (gae, dict(gamma=0.9, lam=0.95))):
        eager = fn(TokenRewards(rewards, mask, values=values), **kwargs)
        graph = torch.compile(lambda r, m, v, fn=fn, kw=kwargs: fn(TokenRewards(r, m, values=v), **kw), fullgraph=True)
        for got, want in zip(graph(rewards, mask, values), eager, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert math.isfinite(float(compiled(rewards_GK, weights_GK).sum()))


def test_grpo_batch_std_grpo_passk_gpg_and_gdpo_compile_with_fullgraph():
    gen = torch.Generator().manual_seed(0)
    rewards = (torch.rand(6, 4, generator=gen) * 4).round() / 4  # ties, and a nonzero share below 1
    components = torch.rand(6, 4, 3, generator=gen)
    index = torch.arange(6).repeat_interleave(4)[torch.randperm(24, generator=gen)]
    flat = torch.rand(24, generator=gen)
    cases = {
        "grpo batch std": (lambda r: compute_advantages(GroupedRewards.from_padded(r, validate=False), "grpo",
                                                        scale_rewards="batch")[0], (rewards,)),
        "grpo_passk": (lambda r, i: compute_advantages(GroupedRewards.from_flat(r, i, num_groups=6, validate=False),
                                                       "grpo_passk")[0], (flat, index)),
        "gpg": (lambda r: compute_advantages(GroupedRewards.from_padded(r, validate=False), "gpg")[0], (rewards,)),
        "gdpo": (lambda r, c: compute_advantages(GroupedRewards.from_padded(r, validate=False, reward_components=c),
                                                 "gdpo", reward_weights=[1.0, 0.5, 2.0])[0], (rewards, components)),
    }  # fmt: skip
    for name, (fn, args) in cases.items():
        torch.testing.assert_close(torch.compile(fn, fullgraph=True)(*args), fn(*args), rtol=1e-5, atol=1e-5, msg=name)
