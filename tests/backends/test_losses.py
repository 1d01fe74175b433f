"""The policy losses and aggregation modes on hand-worked tables (arithmetic in the comments),
plus the on-policy gradient they all share."""

from __future__ import annotations

import json
import math
from math import log

import pytest
import torch

from rllm_torch.core.losses import (
    AGG_MODES,
    LOSS_FNS,
    aggregate_loss,
    cispo_loss,
    cross_entropy_loss,
    dro_loss,
    importance_sampling_loss,
    policy_loss,
    ppo_clip_loss,
)

# Two sequences of two tokens; the last token of row 1 is padding (mask 0).
LOGP = torch.tensor([[-1.0, -2.0], [-0.5, -4.0]])
RATIO = torch.tensor([[1.5, 0.5], [1.0, 1.1]])  # ρ = π_θ / π_old
OLD = LOGP - RATIO.log()
ADV = torch.tensor([[2.0, 2.0], [-1.0, -1.0]])
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]])


def test_ppo_clips_the_ratio_where_it_would_raise_the_objective():
    # ℓ = -min(ρA, clip(ρ, 0.8, 1.2)A):  (0,0) -min(3.0, 2.4) = -2.4;  (0,1) -min(1.0, 1.6) = -1.0;
    # (1,0) -min(-1, -1) = 1.  token mean over 3 tokens: (-2.4 - 1.0 + 1) / 3 = -0.8
    loss, stats = ppo_clip_loss(LOGP, OLD, ADV, MASK)
    assert loss.item() == pytest.approx(-0.8, abs=1e-6)
    assert stats["clip_fraction"].item() == pytest.approx(1 / 3)  # only (0,0) is clipped


def test_ppo_uses_the_high_bound_above_one_and_the_low_bound_below():
    # ε_low 0.1, ε_high 0.3: clip(ρ, 0.9, 1.3).  (0,0) ρ 1.5, A 2: -min(3.0, 2.6) = -2.6 (high bound);
    # (0,1) ρ 0.5, A -1: -min(-0.5, -0.9) = 0.9 (low bound).  mean -0.85; swapping or equating the
    # bounds gives -0.65 (high = 0.1) or -0.95 (low = 0.3)
    logp, ratio = torch.tensor([[-1.0, -2.0]]), torch.tensor([[1.5, 0.5]])
    adv, mask = torch.tensor([[2.0, -1.0]]), torch.ones(1, 2)
    loss, stats = ppo_clip_loss(logp, logp - ratio.log(), adv, mask, clip_ratio_low=0.1, clip_ratio_high=0.3)
    assert loss.item() == pytest.approx(-0.85, abs=1e-6)
    assert stats["clip_fraction"].item() == pytest.approx(1.0)  # both tokens take the clipped term


def test_importance_sampling_is_minus_ratio_times_advantage():
    # ℓ = -ρA: -3.0, -1.0, +1.0 -> mean -1.0
    loss, _ = importance_sampling_loss(LOGP, OLD, ADV, MASK)
    assert loss.item() == pytest.approx(-1.0, abs=1e-6)


def test_cispo_weights_the_log_likelihood_by_the_clipped_detached_ratio():
    # ℓ = -clip(ρ)·A·logπ: (0,0) -1.2·2·(-1) = 2.4;  (0,1) -0.8·2·(-2) = 3.2;  (1,0) -1·(-1)·(-0.5) = -0.5
    # mean (2.4 + 3.2 - 0.5) / 3 = 1.7
    loss, stats = cispo_loss(LOGP, OLD, ADV, MASK)
    assert loss.item() == pytest.approx(1.7, abs=1e-6)
    assert stats["clip_fraction"].item() == pytest.approx(2 / 3)  # ρ = 1.5 and 0.5 are clipped


def test_dro_is_the_advantage_weighted_log_likelihood_minus_a_quadratic_log_ratio_penalty():
    # β = 0.5: ℓ = -(A logπ - 0.25 (log ρ)²): (0,0) 2 + 0.25 log(1.5)²;  (0,1) 4 + 0.25 log(0.5)²;  (1,0) -0.5
    loss, _ = dro_loss(LOGP, OLD, ADV, MASK, beta=0.5)
    expected = (2 + 0.25 * log(1.5) ** 2 + 4 + 0.25 * log(0.5) ** 2 - 0.5) / 3  # = 1.883738...
    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_cross_entropy_is_the_advantage_weighted_negative_log_likelihood():
    # ℓ = -A logπ: 2, 4, -0.5 -> mean 5.5 / 3; with A = 1 it is the plain NLL (1 + 2 + 0.5) / 3
    loss, stats = cross_entropy_loss(LOGP, ADV, MASK)
    assert loss.item() == pytest.approx(5.5 / 3, abs=1e-6)
    assert stats["nll"].item() == pytest.approx(3.5 / 3, abs=1e-6)
    assert cross_entropy_loss(LOGP, MASK, MASK)[0].item() == pytest.approx(3.5 / 3, abs=1e-6)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", (1 + 3 + 2) / 3),  # every trained token: 6 / 3 = 2
        ("seq-mean-token-sum", ((1 + 3) + 2) / 2),  # row sums 4 and 2, mean 3; the empty row 2 is left out
        ("seq-mean-token-mean", ((1 + 3) / 2 + 2 / 1) / 2),  # row means 2 and 2 -> 2
        ("seq-mean-token-sum-norm", ((1 + 3) + 2) / (2 * 4)),  # (4 + 2) / (2 rows · H=4) = 0.75
    ],
)
def test_each_aggregation_mode_reduces_a_hand_worked_loss_matrix(mode, expected):
    loss_NT = torch.tensor([[1.0, 3.0, 7.0], [2.0, 5.0, 5.0], [9.0, 9.0, 9.0]])
    mask_NT = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert aggregate_loss(loss_NT, mask_NT, mode, horizon=4).item() == pytest.approx(expected)


def test_the_aggregation_mode_reaches_every_loss_through_policy_loss():
    # cross_entropy, seq-mean-token-sum: row sums -A logπ: (2 + 4) and -0.5 -> mean 2.75
    loss, _ = policy_loss("cross_entropy", LOGP, OLD, ADV, MASK, loss_agg_mode="seq-mean-token-sum")
    assert loss.item() == pytest.approx(2.75)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_no_trained_token_gives_a_zero_loss_in_every_mode(mode):
    assert aggregate_loss(torch.ones(2, 3), torch.zeros(2, 3), mode, horizon=3).item() == 0.0
    assert aggregate_loss(torch.ones(0, 3), torch.zeros(0, 3), mode, horizon=3).item() == 0.0


def test_an_unknown_mode_or_a_missing_horizon_is_refused():
    with pytest.raises(ValueError, match="loss_agg_mode='seq-sum'"):
        aggregate_loss(LOGP, MASK, "seq-sum")
    with pytest.raises(ValueError, match="horizon"):
        aggregate_loss(LOGP, MASK, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="'dpo' is not one of"):
        policy_loss("dpo", LOGP, OLD, ADV, MASK)


SEQUENCE_LOSSES = ("geo_mean", "luspo", "gspo")  # their on-policy gradients are sequence-level (tests/core/losses)


def test_gspo_by_its_own_name_is_ppo_on_the_sequence_ratio_aggregated_seq_mean_token_mean():
    old = LOGP - torch.tensor([[0.5, 0.3], [0.1, 0.0]])  # off-policy: row 0 ratio e^.4, clipped
    grads = []
    for name, options in (
        ("gspo", {}),
        ("ppo", {"importance_sampling_level": "sequence", "loss_agg_mode": "seq-mean-token-mean"}),
    ):
        logp = LOGP.clone().requires_grad_(True)
        loss, stats = policy_loss(name, logp, old, ADV, MASK, clip_ratio_low=0.1, clip_ratio_high=0.1, **options)
        loss.backward()
        grads.append((loss.detach(), logp.grad, stats["clip_fraction"]))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert grads[0][2] > 0  # the clip bites on this batch: the test compares the clipped branch too


@pytest.mark.parametrize("name", [n for n in LOSS_FNS if n not in SEQUENCE_LOSSES])
def test_on_policy_every_token_level_loss_has_the_reinforce_gradient(name):
    # ρ = 1: d loss / d logπ[n, t] = -A[n, t] · mask / (number of trained tokens = 3)
    logp = LOGP.clone().requires_grad_(True)
    loss, _ = policy_loss(name, logp, LOGP, ADV, MASK, beta=0.5)
    loss.backward()
    torch.testing.assert_close(logp.grad, -ADV * MASK / 3)


def _first_step(tmp_path, *overrides: str) -> dict:
    """Step 1's metrics of a run on a task with partial credit (letters: each of the 3 answer
    characters right scores 1/3), so rewards vary, grpo gives advantages of both signs, responses
    have different lengths (some end early) and the second PPO epoch (lr 0.05) moves the policy."""
    from tiny_runs import TINY_STEPS
    from trainer_fakes import make_config

    from rllm_torch import UnifiedTrainer
    from rllm_torch.backends.torch_backend import TorchBackend
    from rllm_torch.rollouts import SingleTurnWorkflow

    config = make_config(
        tmp_path,
        *TINY_STEPS,
        "rllm.trainer.total_batches=1",
        "rllm.algorithm.adv_estimator=grpo",
        "rllm.rollout.max_new_tokens=3",
        "backend.ppo_epochs=2",
        "backend.lr=0.05",
        *overrides,
    )
    train = [{"prompt": f"{c}>", "answer": c * 3} for c in "abcd"] * 2

    def partial_credit(task, response):
        return sum(a == b for a, b in zip(response, task["answer"], strict=False)) / 3

    trainer = UnifiedTrainer(
        TorchBackend, config, SingleTurnWorkflow, train, workflow_args={"reward_fn": partial_credit}
    )
    try:
        trainer.fit()
    finally:
        trainer.shutdown()
    (row,) = [
        json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines() if "actor/loss" in line
    ]
    return row


@pytest.fixture(scope="module")
def ppo_token_mean(tmp_path_factory):
    return _first_step(tmp_path_factory.mktemp("ppo"))


@pytest.mark.parametrize(
    ("loss_fn", "mode", "options"),
    [
        ("ppo", "seq-mean-token-sum-norm", ()),
        ("importance_sampling", "token-mean", ()),
        ("cispo", "seq-mean-token-mean", ()),
        ("dro", "seq-mean-token-sum", ()),
        ("cross_entropy", "token-mean", ()),
        ("sapo", "token-mean", ()),
        ("geo_mean", "seq-mean-token-sum", ()),
        ("dppo_tv", "token-mean", ()),
        ("dppo_kl", "seq-mean-token-mean", ()),
        ("clip_cov", "token-mean", ("backend.clip_cov_ratio=0.3", "backend.clip_cov_lb=-5")),  # cut some tokens
        ("kl_cov", "token-mean", ()),
        ("luspo", "seq-mean-token-sum", ()),
        ("vespo", "token-mean", ()),
    ],
)
def test_each_loss_fn_and_aggregation_mode_changes_a_real_training_step(
    tmp_path, ppo_token_mean, loss_fn, mode, options
):
    """Each loss and mode in a real step of the backend, against the same step with the defaults
    (ppo, token-mean): the batch is the same (same rewards), the loss or the gradient is not (a
    loss_fn or loss_agg_mode dropped on the way to the update would leave them equal)."""
    row = _first_step(tmp_path, f"rllm.algorithm.loss_fn={loss_fn}", f"rllm.algorithm.loss_agg_mode={mode}", *options)
    assert row["batch/reward"] == ppo_token_mean["batch/reward"] > 0
    assert row["batch/response_length"] == ppo_token_mean["batch/response_length"] < 3  # some ended early
    assert math.isfinite(row["actor/loss"]) and math.isfinite(row["actor/grad_norm"])
    ours, default = (
        (row["actor/loss"], row["actor/grad_norm"]),
        (ppo_token_mean["actor/loss"], ppo_token_mean["actor/grad_norm"]),
    )
    assert ours != pytest.approx(default, rel=1e-4, abs=1e-6), (ours, default)
