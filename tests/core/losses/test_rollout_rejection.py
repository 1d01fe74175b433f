"""Rollout rejection sampling (:mod:`rllm_torch.core.losses.rollout_rejection`): verl's option and
threshold syntax (and what it refuses), every option against a float64 loop, and IcePop's
two-sided token mask of :func:`rollout_importance_weights`."""

from __future__ import annotations

import math

import pytest
import torch

from rllm_torch.core.losses import (
    ROLLOUT_RS_OPTIONS,
    parse_rollout_rs,
    rollout_importance_weights,
    rollout_rejection_mask,
)
from rllm_torch.core.losses.rollout_rejection import RejectionRule


def test_the_threshold_syntax_is_verls():
    assert parse_rollout_rs("token_k1", "0.5_2.0") == [RejectionRule("token_k1", 0.5, 2.0)]
    assert parse_rollout_rs("seq_mean_k1", 2.0) == [RejectionRule("seq_mean_k1", 0.5, 2.0)]  # lower = 1 / upper
    assert parse_rollout_rs("token_k2, seq_max_k3", "0.1") == [
        RejectionRule("token_k2", None, 0.1),
        RejectionRule("seq_max_k3", None, 0.1),
    ]  # one threshold for every option
    assert len(parse_rollout_rs("token_k1,token_k1", "2")) == 1  # repeated options once
    assert "seq_max_k1" not in ROLLOUT_RS_OPTIONS and len(ROLLOUT_RS_OPTIONS) == 11


@pytest.mark.parametrize(
    "options, threshold, error, message",
    [
        ("", 1.0, ValueError, "non-empty string"),
        ("token_k4", 1.0, ValueError, "is not one of"),
        ("seq_max_k1", 1.0, ValueError, "is not one of"),
        ("token_k1", None, ValueError, "needs rollout_rs_threshold"),
        ("token_k1,token_k2", "1,2,3", ValueError, "3 entries for 2 options"),
        ("token_k1", "2.0_0.5", ValueError, "lower 2.0 > upper 0.5"),
        ("token_k2", "0.1_0.2", ValueError, "one upper bound"),
        ("token_k2", "-1", ValueError, "finite number > 0"),
        ("token_k2", "abc", ValueError, "not a number"),
        ("token_k2", True, TypeError, "string or a number"),
    ],
)
def test_what_verl_refuses_is_refused(options, threshold, error, message):
    with pytest.raises(error, match=message):
        parse_rollout_rs(options, threshold)


def statistic(log_r, kind):
    return {"k1": -log_r, "k2": 0.5 * log_r * log_r, "k3": math.exp(log_r) - 1 - log_r}[kind]


def reference_keep(old, rollout, mask, rule):
    where, _, kind = rule.option.rpartition("_")
    keep = []
    for o_r, r_r, m_r in zip(old.tolist(), rollout.tolist(), mask.tolist(), strict=True):
        stats = [statistic(max(-20, min(20, o - r)), kind) for o, r in zip(o_r, r_r, strict=True)]
        trained = [s for s, m in zip(stats, m_r, strict=True) if m > 0]
        if where == "token":
            values = stats
        else:
            seq = {
                "seq_sum": sum(trained),
                "seq_mean": sum(trained) / max(len(trained), 1),
                "seq_max": max(trained, default=0.0),
            }[where]
            values = [seq] * len(stats)
        if kind == "k1":
            ok = [math.log(rule.lower) <= v <= math.log(rule.upper) for v in values]
        else:
            ok = [v <= rule.upper for v in values]
        keep.append([float(k and m > 0) for k, m in zip(ok, m_r, strict=True)])
    return keep


@pytest.mark.parametrize("option", ROLLOUT_RS_OPTIONS)
def test_every_option_matches_a_float64_loop(option):
    gen = torch.Generator().manual_seed(len(option))
    rollout = -torch.rand(6, 5, generator=gen, dtype=torch.float64) * 2
    old = rollout + torch.randn(6, 5, generator=gen, dtype=torch.float64) * 0.3
    mask = (torch.rand(6, 5, generator=gen) > 0.2).double()
    threshold = "0.8_1.3" if option.endswith("k1") else "0.25" if option.startswith("seq_sum") else "0.05"
    (rule,) = parse_rollout_rs(option, threshold)
    keep, stats = rollout_rejection_mask(old, rollout, mask, [rule])
    want = reference_keep(old, rollout, mask, rule)
    assert keep.tolist() == want
    assert stats["rejected_tokens"].item() == mask.sum().item() - sum(map(sum, want))
    assert 0 < stats["rejected_tokens"].item() < mask.sum().item()  # the case rejects some, not all


def test_several_options_must_all_keep_a_token():
    old, rollout, mask = torch.tensor([[0.0, -0.5], [0.0, 0.0]]), torch.zeros(2, 2), torch.ones(2, 2)
    keep, stats = rollout_rejection_mask(old, rollout, mask, parse_rollout_rs("token_k2,seq_sum_k1", "0.1,0.9_1.1"))
    assert keep.tolist() == [[0.0, 0.0], [1.0, 1.0]]  # token 2 fails k2; then its sequence fails the sum
    assert stats["rejected_sequences"].item() == 1.0


def test_icepop_masks_tokens_outside_both_caps():
    old = torch.log(torch.tensor([[0.3, 1.0, 6.0, 1.0]]))
    weights, capped = rollout_importance_weights(
        old, torch.zeros(1, 4), torch.ones(1, 4), tis_mode="token_mask", tis_cap=5.0, tis_cap_lower=0.5
    )
    torch.testing.assert_close(weights, torch.tensor([[0.0, 1.0, 0.0, 1.0]]))
    assert capped.tolist() == [[True, False, True, False]]


@pytest.mark.parametrize("mode, lower", [("token", 0.5), ("token_mask", 0.0), ("token_mask", 1.5)])
def test_a_lower_cap_outside_a_mask_mode_or_0_1_is_refused(mode, lower):
    with pytest.raises(ValueError, match="tis_cap_lower"):
        rollout_importance_weights(
            torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), tis_mode=mode, tis_cap=2.0, tis_cap_lower=lower
        )
