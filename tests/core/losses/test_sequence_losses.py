"""GMPO and LUSPO (:mod:`rllm_torch.core.losses.sequence`) against float64 loops written from
verl's and TRL's formulas, in every aggregation mode each supports; their on-policy sequence-level
gradients; compiled; LUSPO's one mode enforced."""

from __future__ import annotations

import math

import pytest
import torch
from loss_reference import MODES, aggregate, random_batch, rows

from rllm_torch.core.losses.aggregation import Aggregation
from rllm_torch.core.losses.sequence import geo_mean_loss, luspo_loss


def gmpo_reference(logp, old, adv, mask, low=0.2, high=0.2):
    out = []
    for lp_r, o_r, a_r, m_r in zip(rows(logp), rows(old), rows(adv), rows(mask), strict=True):
        n = sum(m_r)
        if n == 0:
            out.append([0.0] * len(lp_r))
            continue
        chosen = []
        for lp, o, a in zip(lp_r, o_r, a_r, strict=True):
            x = lp - o
            xc = max(-low, min(high, x))
            s = (a > 0) - (a < 0)
            chosen.append(s * min(s * x, s * xc))
        ratio = math.exp(sum(c * m for c, m in zip(chosen, m_r, strict=True)) / n)
        abar = sum(a * m for a, m in zip(a_r, m_r, strict=True)) / n
        out.append([-abar * ratio / n] * len(lp_r))
    return out


def luspo_reference(logp, old, adv, mask, low=0.2, high=0.2, delta=None):
    out = []
    for lp_r, o_r, a_r, m_r in zip(rows(logp), rows(old), rows(adv), rows(mask), strict=True):
        n = max(sum(m_r), 1.0)
        s = math.exp(sum((lp - o) * m for lp, o, m in zip(lp_r, o_r, m_r, strict=True)) / n)
        capped = s if delta is None else min(s, delta)
        out.append([-min(capped * a, max(1 - low, min(1 + high, s)) * a) for a in a_r])
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(4))
def test_gmpo_matches_a_float64_loop_in_every_mode(mode, seed):
    logp, old, adv, mask = random_batch(seed)
    got, _ = geo_mean_loss(
        logp, old, adv, mask, clip_ratio_low=0.1, clip_ratio_high=0.3, agg=Aggregation(mode, horizon=5)
    )
    want = aggregate(gmpo_reference(logp, old, adv, mask, 0.1, 0.3), rows(mask), mode)
    assert got.item() == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_gmpo_in_seq_mean_token_sum_is_verls_mean_over_sequences_of_minus_abar_r():
    logp, old, adv, mask = random_batch(1)
    got, _ = geo_mean_loss(logp, old, adv, mask, agg=Aggregation("seq-mean-token-sum"))
    reference = gmpo_reference(logp, old, adv, mask)
    per_seq = [
        sum(v * w for v, w in zip(row, m, strict=True)) for row, m in zip(reference, rows(mask), strict=True) if sum(m)
    ]
    assert got.item() == pytest.approx(sum(per_seq) / len(per_seq), rel=1e-12)


@pytest.mark.parametrize("delta", [None, 1.3])
@pytest.mark.parametrize("seed", range(4))
def test_luspo_matches_a_float64_loop_weighting_each_sequence_by_its_length(seed, delta):
    logp, old, adv, mask = random_batch(seed)
    got, _ = luspo_loss(logp, old, adv, mask, delta=delta)
    want = aggregate(luspo_reference(logp, old, adv, mask, delta=delta), rows(mask), "seq-mean-token-sum")
    assert got.item() == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_on_policy_gmpo_pushes_each_sequence_by_its_mean_advantage_over_its_mean_log_prob():
    logp, _, adv, mask = random_batch(5)
    leaf = logp.clone().requires_grad_(True)
    geo_mean_loss(leaf, logp, adv, mask, agg=Aggregation("seq-mean-token-sum"))[0].backward()
    lengths, sequences = mask.sum(-1, keepdim=True), (mask.sum(-1) > 0).sum()
    abar = (adv * mask).sum(-1, keepdim=True) / lengths.clamp(min=1)
    torch.testing.assert_close(leaf.grad, -abar * mask / lengths.clamp(min=1) / sequences, rtol=1e-12, atol=1e-12)


def test_on_policy_luspo_pushes_each_sequence_by_its_advantage_over_its_summed_log_prob():
    logp, _, adv, mask = random_batch(6)
    leaf = logp.clone().requires_grad_(True)
    luspo_loss(leaf, logp, adv, mask)[0].backward()
    sequences = (mask.sum(-1) > 0).sum()
    torch.testing.assert_close(leaf.grad, -adv * mask / sequences, rtol=1e-12, atol=1e-12)


def test_luspo_refuses_another_aggregation_mode_naming_the_setting():
    logp, old, adv, mask = random_batch(0)
    with pytest.raises(ValueError, match=r"set rllm.algorithm.loss_agg_mode=seq-mean-token-sum"):
        luspo_loss(logp, old, adv, mask, agg=Aggregation("token-mean"))


@pytest.mark.parametrize("fn", [geo_mean_loss, luspo_loss])
def test_compiled_with_fullgraph_they_give_the_eager_numbers(fn):
    logp, old, adv, mask = (t.float() for t in random_batch(3))
    agg = Aggregation("seq-mean-token-sum")
    compiled = torch.compile(lambda a, b, c, d: fn(a, b, c, d, agg=agg)[0], fullgraph=True)
    want = fn(logp, old, adv, mask, agg=agg)[0]
    torch.testing.assert_close(compiled(logp, old, adv, mask), want, rtol=1e-5, atol=1e-6)
