"""Clip-Cov and KL-Cov (:mod:`rllm_torch.core.losses.covariance`) against float64 loops written from
verl's formulas (the random choice given as keys), in every aggregation mode; on-policy; compiled;
bad ratios."""

from __future__ import annotations

import pytest
import torch
from loss_reference import MODES, aggregate, random_batch, rows

from rllm_torch.core.losses.aggregation import Aggregation
from rllm_torch.core.losses.covariance import clip_cov_loss, kl_cov_loss


def covariances(logp, adv, mask):
    cells = [(a, lp) for a_r, lp_r, m_r in zip(rows(adv), rows(logp), rows(mask), strict=True)
             for a, lp, m in zip(a_r, lp_r, m_r, strict=True) if m > 0]  # fmt: skip
    mean_a = sum(a for a, _ in cells) / len(cells)
    mean_lp = sum(lp for _, lp in cells) / len(cells)
    return [[(a - mean_a) * (lp - mean_lp) if m > 0 else 0.0 for a, lp, m in zip(a_r, lp_r, m_r, strict=True)]
            for a_r, lp_r, m_r in zip(rows(adv), rows(logp), rows(mask), strict=True)], len(cells)  # fmt: skip


def clip_cov_reference(logp, old, adv, mask, keys, ratio, lb, ub, low=0.2, high=0.2):
    cov, n = covariances(logp, adv, mask)
    flat = []
    for i, (lp_r, o_r, a_r, m_r) in enumerate(zip(rows(logp), rows(old), rows(adv), rows(mask), strict=True)):
        for t, (lp, o, a, m) in enumerate(zip(lp_r, o_r, a_r, m_r, strict=True)):
            r = torch.tensor(lp - o, dtype=torch.float64).exp().item()
            pg1, pg2 = -a * r, -a * max(1 - low, min(1 + high, r))
            if m > 0 and pg2 <= pg1 and lb < cov[i][t] < ub:
                flat.append((keys[i][t], i, t))
    count = max(int(ratio * n), 1)
    cut = {(i, t) for _, i, t in sorted(flat, reverse=True)[:count]}
    out = []
    for i, (lp_r, o_r, a_r) in enumerate(zip(rows(logp), rows(old), rows(adv), strict=True)):
        row = []
        for t, (lp, o, a) in enumerate(zip(lp_r, o_r, a_r, strict=True)):
            r = torch.tensor(lp - o, dtype=torch.float64).exp().item()
            row.append(0.0 if (i, t) in cut else max(-a * r, -a * max(1 - low, min(1 + high, r))))
        out.append(row)
    return out, len(cut)


def kl_cov_reference(logp, old, adv, mask, ratio, coef):
    cov, n = covariances(logp, adv, mask)
    flat = sorted(
        ((cov[i][t], -i, -t) for i, m_r in enumerate(rows(mask)) for t, m in enumerate(m_r) if m > 0), reverse=True
    )
    chosen = {(-i, -t) for _, i, t in flat[: max(int(ratio * n), 1)]}
    out = []
    for i, (lp_r, o_r, a_r) in enumerate(zip(rows(logp), rows(old), rows(adv), strict=True)):
        row = []
        for t, (lp, o, a) in enumerate(zip(lp_r, o_r, a_r, strict=True)):
            x = lp - o
            row.append(
                -a * torch.tensor(x, dtype=torch.float64).exp().item() + (coef * abs(x) if (i, t) in chosen else 0.0)
            )
        out.append(row)
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(3))
def test_clip_cov_matches_a_float64_loop_in_every_mode(mode, seed):
    logp, old, adv, mask = random_batch(seed, rows=8, width=6)
    keys = torch.rand(logp.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    options = dict(clip_cov_ratio=0.2, clip_cov_lb=-1.0, clip_cov_ub=1.0)  # wide, so that some tokens are cut
    got, stats = clip_cov_loss(logp, old, adv, mask, random_keys=keys, agg=Aggregation(mode, horizon=5), **options)
    reference, cut = clip_cov_reference(logp, old, adv, mask, rows(keys), 0.2, -1.0, 1.0)
    assert got.item() == pytest.approx(aggregate(reference, rows(mask), mode), rel=1e-12, abs=1e-12)
    assert cut > 0 and stats["clip_fraction"].item() == pytest.approx(cut / mask.sum().item())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(3))
def test_kl_cov_matches_a_float64_loop_in_every_mode(mode, seed):
    logp, old, adv, mask = random_batch(seed, rows=8, width=6)
    got, _ = kl_cov_loss(logp, old, adv, mask, kl_cov_ratio=0.2, ppo_kl_coef=0.5, agg=Aggregation(mode, horizon=5))
    want = aggregate(kl_cov_reference(logp, old, adv, mask, 0.2, 0.5), rows(mask), mode)
    assert got.item() == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_on_policy_kl_cov_is_reinforce_and_clip_cov_cuts_only_the_chosen_tokens():
    logp, _, adv, mask = random_batch(3, rows=8, width=6)
    leaf = logp.clone().requires_grad_(True)
    kl_cov_loss(leaf, logp, adv, mask, kl_cov_ratio=0.3)[0].backward()
    torch.testing.assert_close(leaf.grad, -adv * mask / mask.sum(), rtol=1e-12, atol=1e-12)
    leaf = logp.clone().requires_grad_(True)
    loss, stats = clip_cov_loss(leaf, logp, adv, mask, clip_cov_ratio=0.3, clip_cov_lb=-9.0, clip_cov_ub=9.0)
    loss.backward()
    kept = leaf.grad != 0
    torch.testing.assert_close(leaf.grad[kept], (-adv * mask / mask.sum())[kept])
    assert (mask.bool() & ~kept).sum().item() == round(stats["clip_fraction"].item() * mask.sum().item())


@pytest.mark.parametrize(
    "fn, options, message",
    [
        (clip_cov_loss, dict(clip_cov_ratio=0.0), "clip_cov_ratio=0.0 must be in"),
        (clip_cov_loss, dict(clip_cov_lb=5.0, clip_cov_ub=1.0), "clip_cov_lb=5.0 must be below clip_cov_ub=1.0"),
        (kl_cov_loss, dict(kl_cov_ratio=2.0), "kl_cov_ratio=2.0 must be in"),
        (kl_cov_loss, dict(ppo_kl_coef=-1.0), "ppo_kl_coef=-1.0 >= 0"),
    ],
)
def test_bad_ratios_and_bounds_are_refused(fn, options, message):
    logp, old, adv, mask = random_batch(0)
    with pytest.raises(ValueError, match=message):
        fn(logp, old, adv, mask, **options)


def test_compiled_with_fullgraph_they_give_the_eager_numbers():
    logp, old, adv, mask = (t.float() for t in random_batch(2, rows=8, width=6))
    keys = torch.rand(logp.shape)
    clip = torch.compile(
        lambda a, b, c, d, k: clip_cov_loss(a, b, c, d, random_keys=k, clip_cov_lb=-9.0)[0], fullgraph=True
    )
    torch.testing.assert_close(
        clip(logp, old, adv, mask, keys), clip_cov_loss(logp, old, adv, mask, random_keys=keys, clip_cov_lb=-9.0)[0]
    )
    kl = torch.compile(lambda a, b, c, d: kl_cov_loss(a, b, c, d, kl_cov_ratio=0.2)[0], fullgraph=True)
    torch.testing.assert_close(kl(logp, old, adv, mask), kl_cov_loss(logp, old, adv, mask, kl_cov_ratio=0.2)[0])
