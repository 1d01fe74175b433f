"""SAPO and VESPO (:mod:`rllm_torch.core.losses.soft_gate`) against float64 loops written from
verl's and TRL's formulas, in every aggregation mode; the on-policy gradient; compiled; bad taus."""

from __future__ import annotations

import math

import pytest
import torch
from loss_reference import MODES, aggregate, random_batch, rows, sigmoid

from rllm_torch.core.losses import policy_loss
from rllm_torch.core.losses.aggregation import Aggregation
from rllm_torch.core.losses.soft_gate import sapo_loss, vespo_loss


def sapo_reference(logp, old, adv, mask, tau_pos=1.0, tau_neg=1.05):
    out = []
    for lp_r, old_r, a_r in zip(rows(logp), rows(old), rows(adv), strict=True):
        row = []
        for lp, o, a in zip(lp_r, old_r, a_r, strict=True):
            r = math.exp(max(-20.0, min(20.0, lp - o)))
            tau = tau_pos if a > 0 else tau_neg
            row.append(-sigmoid(tau * (r - 1.0)) * 4.0 / tau * a)
        out.append(row)
    return out


def vespo_reference(logp, old, adv, mask, k_pos=2.0, lam_pos=3.0, k_neg=3.0, lam_neg=2.0):
    out = []
    for lp_r, old_r, a_r, m_r in zip(rows(logp), rows(old), rows(adv), rows(mask), strict=True):
        log_w = sum(max(-20.0, min(20.0, lp - o)) * m for lp, o, m in zip(lp_r, old_r, m_r, strict=True))
        log_w = max(math.log(1e-8), min(20.0, log_w))
        row = []
        for lp, a in zip(lp_r, a_r, strict=True):
            k, lam = (k_pos, lam_pos) if a >= 0 else (k_neg, lam_neg)
            phi = math.exp(lam + k * log_w - lam * math.exp(log_w))
            row.append(-phi * a * lp)
        out.append(row)
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(4))
def test_sapo_matches_a_float64_loop_in_every_mode(mode, seed):
    logp, old, adv, mask = random_batch(seed)
    got, _ = sapo_loss(logp, old, adv, mask, tau_pos=0.8, tau_neg=1.3, agg=Aggregation(mode, horizon=5))
    want = aggregate(sapo_reference(logp, old, adv, mask, 0.8, 1.3), rows(mask), mode)
    assert got.item() == pytest.approx(want, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(4))
def test_vespo_matches_a_float64_loop_in_every_mode(mode, seed):
    logp, old, adv, mask = random_batch(seed)
    got, _ = vespo_loss(logp, old, adv, mask, agg=Aggregation(mode, horizon=5))
    want = aggregate(vespo_reference(logp, old, adv, mask), rows(mask), mode)
    assert got.item() == pytest.approx(want, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("name", ["sapo", "vespo"])
def test_on_policy_the_gradient_is_reinforces(name):
    logp, _, adv, mask = random_batch(7)
    leaf = logp.clone().requires_grad_(True)
    policy_loss(name, leaf, logp, adv, mask)[0].backward()
    torch.testing.assert_close(leaf.grad, -adv * mask / mask.sum(), rtol=1e-12, atol=1e-12)


def test_the_sapo_gate_fades_off_policy_tokens_where_ppo_would_stop_them():
    # A > 0, rho = 1.5: PPO's gradient is 0 past 1 + 0.2; SAPO's slope 4 s (1 - s) at tau (rho - 1) = 0.5
    logp, old, adv, mask = torch.tensor([[math.log(1.5)]]), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1)
    leaf = logp.clone().requires_grad_(True)
    sapo_loss(leaf, old, adv, mask)[0].backward()
    s = sigmoid(0.5)
    assert leaf.grad.item() == pytest.approx(-4 * s * (1 - s) * 1.5, rel=1e-6)


def test_vespo_weighs_a_far_off_policy_sequence_down():
    logp = torch.tensor([[-0.1, -0.1], [-3.0, -3.0]])
    old = torch.tensor([[-0.1, -0.1], [-0.1, -0.1]])  # the second sequence's w = e^{-5.8}
    _, stats = vespo_loss(logp, old, torch.ones(2, 2), torch.ones(2, 2))
    assert 0.4 < stats["phi_mean"].item() < 0.6  # phi = 1 for the first, ~0 for the second


@pytest.mark.parametrize("tau", [0.0, -1.0, float("nan"), float("inf")])
def test_a_sapo_temperature_that_is_not_positive_is_refused(tau):
    logp, old, adv, mask = random_batch(0)
    with pytest.raises(
        ValueError, match=r"tau_pos=.* must be a finite number > 0 \(the backend setting backend.tau_pos\)"
    ):
        sapo_loss(logp, old, adv, mask, tau_pos=tau)


@pytest.mark.parametrize("fn", [sapo_loss, vespo_loss])
def test_compiled_with_fullgraph_they_give_the_eager_numbers(fn):
    logp, old, adv, mask = (t.float() for t in random_batch(3))
    compiled = torch.compile(lambda a, b, c, d: fn(a, b, c, d)[0], fullgraph=True)
    torch.testing.assert_close(compiled(logp, old, adv, mask), fn(logp, old, adv, mask)[0], rtol=1e-5, atol=1e-6)
