"""GSPO's sequence-level importance ratio, dual-clip PPO and the entropy bonus: hand-worked
tables (arithmetic in the comments), float64 loop references of value and gradient, compiled
graphs, and bad options."""

from __future__ import annotations

import math

import pytest
import torch

from rllm_torch.core.losses import (
    AGG_MODES,
    Aggregation,
    entropy_bonus,
    log_importance_ratio,
    policy_loss,
    ppo_clip_loss,
)

# Two sequences: row 0 has three trained tokens, row 1 two (its last token is padding).
LOG_RATIO = torch.tensor([[0.3, -0.1, 0.4], [-0.5, -0.1, 2.0]], dtype=torch.float64)
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
ADV = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]], dtype=torch.float64)
LOGP = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]], dtype=torch.float64)


def _leaf():
    return LOGP.clone().requires_grad_(True)


def test_the_sequence_ratio_is_the_exp_of_the_mean_token_log_ratio():
    # row 0: (0.3 - 0.1 + 0.4) / 3 = 0.2;  row 1: (-0.5 - 0.1) / 2 = -0.3 (the padding's 2.0 ignored)
    got = log_importance_ratio(LOGP, LOGP - LOG_RATIO, MASK, "sequence")
    torch.testing.assert_close(got, torch.tensor([[0.2], [-0.3]], dtype=torch.float64))
    torch.testing.assert_close(log_importance_ratio(LOGP, LOGP - LOG_RATIO, MASK, "token"), LOG_RATIO)
    empty = log_importance_ratio(torch.zeros(1, 2), torch.ones(1, 2), torch.zeros(1, 2), "sequence")
    assert torch.equal(empty, torch.zeros(1, 1))  # no trained token: ratio 1, not 0/0


def test_gspo_hand_table():
    # s_0 = e^0.2 = 1.2214 > 1.2 and A > 0: clipped at 1.2, ℓ_0 = -1.2;  s_1 = e^-0.3 = 0.7408 < 0.8
    # and A < 0: -min(0.7408 * -2, 0.8 * -2) = 1.6.  seq-mean-token-mean: (-1.2 + 1.6) / 2 = 0.2;
    # token-mean: (3 * -1.2 + 2 * 1.6) / 5 = -0.08.  Both sequences take the clipped term.
    for mode, want in (("seq-mean-token-mean", 0.2), ("token-mean", -0.08)):
        loss, stats = ppo_clip_loss(
            LOGP, LOGP - LOG_RATIO, ADV, MASK, importance_sampling_level="sequence", agg=Aggregation(mode)
        )
        assert loss.item() == pytest.approx(want, abs=1e-12)
        assert stats["clip_fraction"].item() == pytest.approx(1.0)
    # token level, for contrast: the ratios e^0.3, e^-0.1, e^0.4 | e^-0.5, e^-0.1 differ per token
    token, _ = ppo_clip_loss(LOGP, LOGP - LOG_RATIO, ADV, MASK, agg=Aggregation("seq-mean-token-mean"))
    assert token.item() != pytest.approx(0.2, abs=1e-3)


def gspo_loop_reference(log_probs, old_log_probs, advantages, mask, low, high, mode):
    """verl's token form of GSPO, row by row in float64 with autograd: ``s_t = sg[s_i] · π(y_t) /
    sg[π(y_t)]`` on every trained token, PPO's clip of ``s_t``, then the aggregation."""
    total, seq_losses, tokens = 0.0, [], 0
    for n in range(log_probs.shape[0]):
        trained = [t for t in range(log_probs.shape[1]) if mask[n, t] > 0]
        if not trained:
            continue
        log_s = sum(log_probs[n, t].detach() - old_log_probs[n, t] for t in trained) / len(trained)
        terms = []
        for t in trained:
            s_t = torch.exp(log_s + log_probs[n, t] - log_probs[n, t].detach())
            a = advantages[n, t]
            terms.append(-torch.minimum(s_t * a, s_t.clamp(1 - low, 1 + high) * a))
        seq_losses.append((sum(terms), len(trained)))
        tokens += len(trained)
    if mode == "token-mean":
        total = sum(s for s, _ in seq_losses) / tokens
    else:  # seq-mean-token-mean
        total = sum(s / k for s, k in seq_losses) / len(seq_losses)
    return total


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gspo_equals_verls_token_form_in_value_and_gradient(mode, seed):
    gen = torch.Generator().manual_seed(seed)
    log_probs = (-torch.rand(4, 6, generator=gen, dtype=torch.float64) * 3).requires_grad_(True)
    old = log_probs.detach() + 0.15 * torch.randn(4, 6, generator=gen, dtype=torch.float64)
    adv = torch.randn(4, 1, generator=gen, dtype=torch.float64).expand(4, 6)
    mask = (torch.rand(4, 6, generator=gen) > 0.25).double()
    mask[3] = 0  # a row with nothing trained
    ours, _ = ppo_clip_loss(
        log_probs, old, adv, mask, clip_ratio_low=0.1, clip_ratio_high=0.05, importance_sampling_level="sequence",
        agg=Aggregation(mode),
    )  # fmt: skip
    (grad,) = torch.autograd.grad(ours, log_probs)
    ref_leaf = log_probs.detach().clone().requires_grad_(True)
    want = gspo_loop_reference(ref_leaf, old, adv, mask, 0.1, 0.05, mode)
    (want_grad,) = torch.autograd.grad(want, ref_leaf)
    assert ours.item() == pytest.approx(want.item(), rel=1e-12, abs=1e-14)
    torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("loss_fn", ["ppo", "importance_sampling", "cispo"])
def test_on_policy_the_sequence_ratio_gives_the_reinforce_gradient(loss_fn):
    """ρ = 1: with a token-mean every trained token gets ``-A / (trained tokens)``, as at the token level."""
    leaf = _leaf()
    loss, _ = policy_loss(loss_fn, leaf, LOGP, ADV, MASK, importance_sampling_level="sequence")
    (grad,) = torch.autograd.grad(loss, leaf)
    torch.testing.assert_close(grad, -ADV * MASK / MASK.sum())


def test_dual_clip_caps_the_loss_of_negative_advantages_whose_ratio_grew():
    # ρ = [5, 2 | 5, 0.5], A = [-1, -1 | 1, 1], c = 3, ε = 0.2:
    # (0,0) PPO's max(5, 1.2) = 5, capped at c|A| = 3 (gradient 0);  (0,1) max(2, 1.2) = 2 < 3: kept
    # (1,0) A > 0: -min(5, 1.2) = -1.2;  (1,1) -min(0.5, 0.8) = -0.5.  token mean (3 + 2 - 1.2 - 0.5) / 4
    ratio = torch.tensor([[5.0, 2.0], [5.0, 0.5]], dtype=torch.float64)
    adv = torch.tensor([[-1.0, -1.0], [1.0, 1.0]], dtype=torch.float64)
    leaf = torch.zeros(2, 2, dtype=torch.float64, requires_grad=True)
    loss, stats = ppo_clip_loss(leaf, -ratio.log(), adv, torch.ones(2, 2), clip_ratio_c=3.0)
    assert loss.item() == pytest.approx((3 + 2 - 1.2 - 0.5) / 4)
    assert stats["clip_fraction_lower"].item() == pytest.approx(0.25)
    (grad,) = torch.autograd.grad(loss, leaf)
    # d/dlogπ of -ρA is -ρA: (0,1) 2/4, the capped (0,0) and the clipped (1,0) 0, (1,1) -0.5/4
    torch.testing.assert_close(grad, torch.tensor([[0.0, 0.5], [0.0, -0.125]], dtype=torch.float64))
    plain, plain_stats = ppo_clip_loss(leaf, -ratio.log(), adv, torch.ones(2, 2))
    assert plain.item() == pytest.approx((5 + 2 - 1.2 - 0.5) / 4) and "clip_fraction_lower" not in plain_stats


def test_dual_clip_matches_verls_formula_in_a_float64_loop():
    """Per token, verl's ``compute_policy_loss_vanilla``: ``l1 = max(-ρA, -clip(ρ)A)``; where
    ``A < 0``, ``min(l1, -cA)``; then the token mean over the mask."""
    gen = torch.Generator().manual_seed(4)
    log_ratio = torch.randn(5, 7, generator=gen, dtype=torch.float64) * 1.5  # ratios from 0.01 to 90
    adv = torch.randn(5, 7, generator=gen, dtype=torch.float64)
    mask = (torch.rand(5, 7, generator=gen) > 0.2).double()
    loss, stats = ppo_clip_loss(torch.zeros_like(adv), -log_ratio, adv, mask, clip_ratio_c=3.0, clip_ratio_high=0.28)
    total, capped = 0.0, 0
    for n in range(5):
        for t in range(7):
            if not mask[n, t]:
                continue
            rho, a = math.exp(log_ratio[n, t].item()), adv[n, t].item()
            token = max(-rho * a, -min(max(rho, 0.8), 1.28) * a)
            if a < 0 and token > -3.0 * a:
                token, capped = -3.0 * a, capped + 1
            total += token
    assert loss.item() == pytest.approx(total / mask.sum().item(), rel=1e-12)
    assert stats["clip_fraction_lower"].item() == pytest.approx(capped / mask.sum().item())
    assert capped > 0


def test_dual_clip_with_the_sequence_ratio():
    # log-ratios |LOG_RATIO|: row 0 log s = (0.3 + 0.1 + 0.4) / 3, s = 1.3056, A = 1: clipped, -1.2;
    # row 1 log s = (0.5 + 0.1) / 2 = 0.3, s = 1.3499, A = -2: PPO's max(2.6997, 2.4) = 2.6997, capped
    # at c |A| = 1.3 * 2 = 2.6.  seq-mean-token-mean (-1.2 + 2.6) / 2 = 0.7; row 1's 2 of 5 tokens capped
    loss, stats = ppo_clip_loss(
        LOGP, LOGP - LOG_RATIO.abs(), ADV, MASK, clip_ratio_c=1.3, importance_sampling_level="sequence",
        agg=Aggregation("seq-mean-token-mean"),
    )  # fmt: skip
    assert loss.item() == pytest.approx(0.7, abs=1e-12)
    assert stats["clip_fraction_lower"].item() == pytest.approx(2 / 5)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(name="ppo", importance_sampling_level="sentence"), "not one of"),
        (dict(name="dro", importance_sampling_level="sequence"), "has none"),
        (dict(name="cross_entropy", importance_sampling_level="sequence"), "has none"),
        (dict(name="cispo", clip_ratio_c=3.0), "it applies to 'ppo', 'dppo_tv', 'dppo_kl', 'vanilla' only"),
        (dict(name="ppo", clip_ratio_c=1.0), "above 1"),
    ],
)
def test_bad_ratio_options_are_value_errors(kwargs, message):
    name = kwargs.pop("name")
    with pytest.raises(ValueError, match=message):
        policy_loss(name, LOGP, LOGP, ADV, MASK, **kwargs)


def test_entropy_bonus_hand_table_in_every_aggregation_mode():
    # H = [[1, 3, (9)], [2, (7), (7)]] on the mask; coeff 0.1, horizon 4:
    # token-mean (1 + 3 + 2) / 3 = 2;  seq-mean-token-sum (4 + 2) / 2 = 3;  seq-mean-token-mean
    # (2 + 2) / 2 = 2;  seq-mean-token-sum-norm 3 / 4.  The term is -0.1 times each.
    entropy = torch.tensor([[1.0, 3.0, 9.0], [2.0, 7.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    want = {"token-mean": 2.0, "seq-mean-token-sum": 3.0, "seq-mean-token-mean": 2.0, "seq-mean-token-sum-norm": 0.75}
    for mode in AGG_MODES:
        term, stats = entropy_bonus(entropy, mask, entropy_coeff=0.1, agg=Aggregation(mode, horizon=4))
        assert term.item() == pytest.approx(-0.1 * want[mode])
        assert stats["entropy"].item() == pytest.approx(2.0)
    global_tokens = torch.tensor(6.0)  # another rank holds 3 more tokens: the sum is divided by 6
    term, _ = entropy_bonus(entropy, mask, entropy_coeff=0.1, agg=Aggregation(normaliser=global_tokens))
    assert term.item() == pytest.approx(-0.1)


def test_the_entropy_bonus_pushes_the_entropy_up():
    """A gradient step on the term raises the entropy of a softmax policy (and coeff 0 leaves it)."""
    logits = torch.tensor([[[2.0, 0.0, -1.0]]], requires_grad=True)

    def entropy_of(z):
        return torch.logsumexp(z, -1) - (z.softmax(-1) * z).sum(-1)

    term, _ = entropy_bonus(entropy_of(logits), torch.ones(1, 1), entropy_coeff=0.5)
    (grad,) = torch.autograd.grad(term, logits)
    stepped = logits.detach() - 0.1 * grad
    assert entropy_of(stepped).item() > entropy_of(logits.detach()).item()
    zero, _ = entropy_bonus(entropy_of(logits), torch.ones(1, 1), entropy_coeff=0.0)
    assert zero.item() == 0.0


@pytest.mark.parametrize("coeff", [-0.01, math.inf, math.nan, True, "0.1"])
def test_a_bad_entropy_coeff_is_a_value_error(coeff):
    with pytest.raises(ValueError, match="entropy_coeff"):
        entropy_bonus(torch.ones(1, 1), torch.ones(1, 1), entropy_coeff=coeff)


def test_the_new_loss_options_compile_with_fullgraph():
    gen = torch.Generator().manual_seed(0)
    logp, old = -torch.rand(3, 5, generator=gen), -torch.rand(3, 5, generator=gen)
    adv, mask = torch.randn(3, 5, generator=gen), (torch.rand(3, 5, generator=gen) > 0.2).float()
    entropy = torch.rand(3, 5, generator=gen)

    def step(lp, op, a, m, h):
        loss, stats = ppo_clip_loss(lp, op, a, m, clip_ratio_c=3.0, importance_sampling_level="sequence")
        bonus, _ = entropy_bonus(h, m, entropy_coeff=0.01)
        return loss + bonus, stats["clip_fraction_lower"]

    compiled = torch.compile(step, fullgraph=True)
    for got, want in zip(compiled(logp, old, adv, mask, entropy), step(logp, old, adv, mask, entropy), strict=True):
        torch.testing.assert_close(got, want)
