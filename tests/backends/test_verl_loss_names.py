"""verl's loss names in rLLM's (estimator, loss) pairs (rLLM's tests/test_verl_policy_loss.py uses
``("grpo", "vanilla")`` and ``("reinforce", "gpg")``), with verl's meaning (verl
``verl/trainer/ppo/core_algos.py``): ``vanilla`` is PPO's clip with the dual clip at
``clip_ratio_c`` (3.0 by verl's ``ActorConfig``), ``gpg`` is ``-A log π``, aggregated."""

from __future__ import annotations

import json

import pytest
import torch

from rllm_torch import AlgorithmConfig
from rllm_torch.core.losses import policy_loss

MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
# log ρ per token: ln 4, 0, -ln 2 | ln 1.1, ln 0.5; A: -1, 2, 1 | -0.5, 3 (the padded ones are not read)
LOGP_OLD = torch.tensor([[-2.0, -1.0, -0.5, -3.0], [-1.0, -2.0, -1.0, -1.0]], dtype=torch.float64)
LOG_RATIO = torch.log(torch.tensor([[4.0, 1.0, 0.5, 1.0], [1.1, 0.5, 1.0, 1.0]], dtype=torch.float64))
LOGP = LOGP_OLD + LOG_RATIO
ADV = torch.tensor([[-1.0, 2.0, 1.0, 7.0], [-0.5, 3.0, 7.0, 7.0]], dtype=torch.float64)


def _verl_vanilla_token_mean(logp, old, adv, mask, eps=0.2, c=3.0):
    """verl's compute_policy_loss_vanilla written out (its clamp of log ρ to [-20, 20] included)."""
    ratio = torch.exp(torch.clamp(logp - old, -20.0, 20.0))
    clipped = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - eps, 1 + eps))
    losses = torch.where(adv < 0, torch.minimum(-adv * c, clipped), clipped)
    return (losses * mask).sum() / mask.sum()


def test_vanilla_is_verls_dual_clipped_ppo_by_hand():
    loss, stats = policy_loss("vanilla", LOGP, LOGP_OLD, ADV, MASK)
    # token by token (ρ, A): (4, -1): ppo max(4, 1.2) = 4, capped at -3A = 3 -> 3; (1, 2): -2;
    # (0.5, 1): max(-0.5, -0.8) = -0.5; (1.1, -0.5): ρ inside [0.8, 1.2], -Aρ = 0.55;
    # (0.5, 3): max(-1.5, -2.4) = -1.5
    # token mean over 5: (3 - 2 - 0.5 + 0.55 - 1.5) / 5 = -0.45 / 5 = -0.09
    assert loss.item() == pytest.approx(-0.09, abs=1e-12)
    assert loss.item() == pytest.approx(_verl_vanilla_token_mean(LOGP, LOGP_OLD, ADV, MASK).item(), abs=1e-12)
    assert stats["clip_fraction_lower"].item() == pytest.approx(1 / 5)  # the (4, -1) token


def test_vanilla_takes_the_runs_clip_ratio_c_and_equals_ppo_with_it():
    for c in (1.5, 10.0):
        vanilla, _ = policy_loss("vanilla", LOGP, LOGP_OLD, ADV, MASK, clip_ratio_c=c)
        ppo, _ = policy_loss("ppo", LOGP, LOGP_OLD, ADV, MASK, clip_ratio_c=c)
        torch.testing.assert_close(vanilla, ppo, rtol=0, atol=0)
        reference = _verl_vanilla_token_mean(LOGP, LOGP_OLD, ADV, MASK, c=c)
        assert vanilla.item() == pytest.approx(reference.item(), abs=1e-12)
    # without the cap (ppo's default) the (4, -1) token costs 4, not 3: (4 - 2 - 0.5 + 0.55 - 1.5) / 5 = 0.11
    assert policy_loss("ppo", LOGP, LOGP_OLD, ADV, MASK)[0].item() == pytest.approx(0.11, abs=1e-12)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_gpg_is_minus_advantage_times_log_prob_aggregated_as_cross_entropy_is(agg):
    loss, _ = policy_loss("gpg", LOGP, LOGP_OLD, ADV, MASK, loss_agg_mode=agg)
    per_token = -ADV * LOGP * MASK
    if agg == "token-mean":
        expected = per_token.sum() / MASK.sum()
    elif agg == "seq-mean-token-sum":
        expected = per_token.sum(1).mean()
    else:
        expected = (per_token.sum(1) / MASK.sum(1)).mean()
    assert loss.item() == pytest.approx(expected.item(), abs=1e-12)
    assert loss.item() == policy_loss("cross_entropy", LOGP, LOGP_OLD, ADV, MASK, loss_agg_mode=agg)[0].item()


def test_gpg_by_hand_token_mean():
    # log π: -2 + ln 4 = -0.6137, -1, -0.5 - ln 2 = -1.1931 | -1 + ln 1.1 = -0.9047, -2 - ln 2 = -2.6931
    # -A log π: -0.6137, 2, 1.1931 | -0.4523, 8.0794; sum 10.2065 / 5 = 2.04130
    assert policy_loss("gpg", LOGP, LOGP_OLD, ADV, MASK)[0].item() == pytest.approx(2.04130, abs=1e-4)


def test_rllms_pairs_with_verls_loss_names_are_accepted_as_rllm_splits_them():
    config = AlgorithmConfig(estimator_map={"a": ("grpo", "vanilla"), "b": ("reinforce", "gpg")})
    assert config.estimator_map == {"a": "grpo", "b": "reinforce"}
    assert config.loss_fn_map == {"a": "vanilla", "b": "gpg"}
    assert config.loss_fn_for("a") == "vanilla" and config.loss_fn_for("b") == "gpg"


def _first_step(tmp_path, *overrides: str) -> dict:
    """Step 1's metrics of a real run (partial-credit letters: rewards vary, advantages of both
    signs; two PPO epochs at lr 0.05, so the second one is off-policy and the clips can bite)."""
    from tiny_runs import TINY_STEPS
    from trainer_fakes import make_config

    from rllm_torch import UnifiedTrainer
    from rllm_torch.backends.torch_backend import TorchBackend
    from rllm_torch.rollouts import SingleTurnWorkflow

    config = make_config(
        tmp_path,
        *TINY_STEPS,
        "rllm.trainer.total_batches=1",
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
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return next(r for r in rows if "actor/loss" in r)


@pytest.mark.parametrize(
    ("verl_name", "ours"),
    [
        ("vanilla", ("rllm.algorithm.loss_fn=ppo", "backend.clip_ratio_c=3")),
        ("gpg", ("rllm.algorithm.loss_fn=cross_entropy",)),
    ],
)
def test_a_real_step_with_a_verl_loss_name_is_the_step_of_the_loss_it_names(tmp_path, verl_name, ours):
    named = _first_step(tmp_path / "verl", f"rllm.algorithm.loss_fn={verl_name}")
    same = _first_step(tmp_path / "ours", *ours)
    assert named["batch/reward"] == same["batch/reward"]  # the same samples, so the same batch
    for key in ("actor/loss", "actor/grad_norm"):  # two runs of one loss differ by float32 summation order only
        assert named[key] == pytest.approx(same[key], rel=1e-6), key
