"""DPPO-TV and DPPO-KL (:mod:`rllm_torch.core.losses.trust_region`) against float64 loops written
from verl's formulas, in every aggregation mode; which tokens are dropped, by hand; on-policy the
REINFORCE gradient; compiled."""

from __future__ import annotations

import math

import pytest
import torch
from loss_reference import MODES, aggregate, random_batch, rows

from rllm_torch.core.losses import policy_loss
from rllm_torch.core.losses.aggregation import Aggregation
from rllm_torch.core.losses.trust_region import dppo_keep_mask, dppo_kl_loss, dppo_tv_loss


def dppo_reference(logp, old, adv, mask, divergence, low=0.2, high=0.2, cap=None):
    out = []
    for lp_r, o_r, a_r in zip(rows(logp), rows(old), rows(adv), strict=True):
        row = []
        for lp, o, a in zip(lp_r, o_r, a_r, strict=True):
            p, q = math.exp(lp), math.exp(o)
            if divergence == "tv":
                keep = p - q <= high if a > 0 else p - q >= -low
            else:
                bkl = q * (o - lp) + (1 - q) * math.log((1 - q + 1e-8) / (1 - p + 1e-8))
                keep = (bkl <= high or p <= q) if a > 0 else (bkl <= low or p >= q)
            r = math.exp(max(-20, min(20, lp - o)))
            w = r if cap is None else min(r, cap)
            row.append(-a * w * lp * keep)
        out.append(row)
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("divergence", ["tv", "kl"])
@pytest.mark.parametrize("seed", range(3))
def test_dppo_matches_a_float64_loop_in_every_mode(mode, divergence, seed):
    logp, old, adv, mask = random_batch(seed)
    fn = dppo_tv_loss if divergence == "tv" else dppo_kl_loss
    got, _ = fn(
        logp,
        old,
        adv,
        mask,
        clip_ratio_low=0.05,
        clip_ratio_high=0.1,
        clip_ratio_c=1.5,
        agg=Aggregation(mode, horizon=5),
    )
    want = aggregate(dppo_reference(logp, old, adv, mask, divergence, 0.05, 0.1, 1.5), rows(mask), mode)
    assert got.item() == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_a_token_is_dropped_only_past_the_bound_in_its_advantages_direction():
    # p_old = 0.5; p = 0.8 (rose by 0.3) and p = 0.2 (fell by 0.3); bounds 0.2
    old = torch.log(torch.tensor([[0.5, 0.5, 0.5, 0.5]]))
    logp = torch.log(torch.tensor([[0.8, 0.8, 0.2, 0.2]]))
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    keep = dppo_keep_mask(logp, old, adv, divergence="tv", low=0.2, high=0.2)
    assert keep.tolist() == [[False, True, True, False]]  # pushed further up / down past the bound: dropped


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
def test_on_policy_nothing_is_dropped_and_the_gradient_is_reinforces(name):
    logp, _, adv, mask = random_batch(4)
    leaf = logp.clone().requires_grad_(True)
    loss, stats = policy_loss(name, leaf, logp, adv, mask)
    loss.backward()
    torch.testing.assert_close(leaf.grad, -adv * mask / mask.sum(), rtol=1e-12, atol=1e-12)
    assert stats["clip_fraction"].item() == 0.0


@pytest.mark.parametrize("fn", [dppo_tv_loss, dppo_kl_loss])
def test_compiled_with_fullgraph_they_give_the_eager_numbers(fn):
    logp, old, adv, mask = (t.float() for t in random_batch(2))
    compiled = torch.compile(lambda a, b, c, d: fn(a, b, c, d, clip_ratio_c=3.0)[0], fullgraph=True)
    torch.testing.assert_close(
        compiled(logp, old, adv, mask), fn(logp, old, adv, mask, clip_ratio_c=3.0)[0], rtol=1e-5, atol=1e-6
    )


def test_the_kl_bound_drops_only_a_token_pushed_further_in_its_advantages_direction():
    # p_old = .5; p = .95 or .05: binary KL .5 ln(.5/.95) + .5 ln(.5/.05) = .830 > .2 either way; p = .55: KL .005
    old = torch.log(torch.full((1, 6), 0.5, dtype=torch.float64))
    logp = torch.log(torch.tensor([[0.95, 0.95, 0.05, 0.05, 0.55, 0.55]], dtype=torch.float64))
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0, 1.0, -1.0]], dtype=torch.float64)
    keep = dppo_keep_mask(logp, old, adv, divergence="kl", low=0.2, high=0.2)
    # rose past the bound with A > 0, fell past it with A < 0: dropped; moved against A, or within: kept
    assert keep.tolist() == [[False, True, True, False, True, True]]
    # the loss: a dropped token has no gradient at all, a kept one -A min(rho, C) (here rho = p / p_old)
    leaf = logp.clone().requires_grad_(True)
    loss, stats = dppo_kl_loss(leaf, old, adv, torch.ones_like(adv), agg=Aggregation("token-mean"))
    loss.backward()
    rho = (logp - old).exp()
    torch.testing.assert_close(leaf.grad, -adv * rho * keep / 6, rtol=1e-12, atol=1e-12)
    assert stats["clip_fraction"].item() == pytest.approx(2 / 6)
