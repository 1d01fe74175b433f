"""The reference policy and KL (as a loss term and in the reward), the critic of GAE, and the
start-up errors of their settings, through the real torch backend and training runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from trainer_fakes import make_config

from rllm_torch import AlgorithmConfig
from rllm_torch.backends.torch_backend import TorchBackend, build_char_tokenizer
from rllm_torch.backends.torch_backend.forward import token_log_probs
from rllm_torch.backends.torch_backend.model import build_policy
from rllm_torch.cli.train_command import run
from rllm_torch.core.errors import ConfigError
from rllm_torch.core.losses import kl_penalty
from rllm_torch.trainer import TokenBatch, compute_token_advantages

SMALL = (
    "model.num_layers=1",
    "model.hidden_size=32",
    "model.num_heads=2",
    "task.train_size=16",
    "task.val_size=4",
    "data.train_batch_size=4",
    "rllm.rollout.n=4",
    "rllm.rollout.n_val=2",
    "backend.device=cpu",
)

# ---- the KL estimators ------------------------------------------------------------------------

DERIVATIVES = {  # d/d(log pi) of each estimator, with delta = log pi - log pi_ref
    "kl": lambda d: torch.ones_like(d),
    "k1": lambda d: torch.ones_like(d),
    "abs": torch.sign,
    "mse": lambda d: d,
    "k2": lambda d: d,
    "low_var_kl": lambda d: 1 - torch.exp(-d),
    "k3": lambda d: 1 - torch.exp(-d),
}


@pytest.mark.parametrize("kind", sorted(DERIVATIVES))
def test_each_kl_estimator_is_zero_at_the_reference_and_has_the_formulas_gradient(kind):
    ref = torch.tensor([[-1.0, -2.5, -0.1, -3.0]], dtype=torch.float64)
    same = ref.clone().requires_grad_(True)
    assert torch.equal(kl_penalty(same, ref, kind), torch.zeros_like(ref))
    delta = torch.tensor([[0.3, -0.7, 1.2, -0.05]], dtype=torch.float64)
    log_probs = (ref + delta).requires_grad_(True)
    (grad,) = torch.autograd.grad(kl_penalty(log_probs, ref, kind).sum(), log_probs)
    torch.testing.assert_close(grad, DERIVATIVES[kind](delta))


def test_k3_is_non_negative_and_clamped_as_verl():
    log_probs, ref = torch.tensor([[0.0, -50.0, 5.0]]), torch.tensor([[-50.0, 0.0, 0.0]])
    k3 = kl_penalty(log_probs, ref, "low_var_kl")
    assert (k3 >= 0).all() and k3.max() <= 10.0 and torch.isfinite(k3).all()
    with pytest.raises(ValueError, match="k4"):
        kl_penalty(log_probs, ref, "k4")


# ---- the KL loss term through the backend ------------------------------------------------------


def _backend(tmp_path, *overrides):
    return TorchBackend(make_config(tmp_path, *SMALL, *overrides), alphabet="0123456789+=")


def _token_batch(backend, rows=3, width=6):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 10, (rows, width), generator=gen)
    mask = torch.ones(rows, width)
    mask[:, :3] = 0  # the prompt
    batch = TokenBatch(
        ids,
        torch.ones_like(ids),
        mask,
        torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)[:rows],
        torch.zeros(rows, dtype=torch.long),
        ["solver"],
        torch.zeros(rows, width),
    )
    with torch.no_grad():
        batch.old_log_probs = token_log_probs(backend.model, ids, batch.attention_mask)
        batch.ref_log_probs = token_log_probs(backend.ref_model, ids, batch.attention_mask)
    batch.advantages = torch.randn(rows, width, generator=gen) * mask
    return batch


def _loss_and_grads(backend, batch):
    rows = torch.arange(batch.input_ids.shape[0])
    backend.model.zero_grad()
    loss, stats = backend.updater.micro_batch_loss(batch, rows, backend.updater.global_normaliser(batch.response_mask))
    loss.backward()
    return loss.detach(), stats, [p.grad.clone() for p in backend.model.parameters()]


def test_the_kl_loss_is_zero_at_the_reference_and_its_gradient_is_autograd_of_the_formula(tmp_path):
    coef = 0.3
    with_kl = _backend(tmp_path, "rllm.algorithm.use_kl_loss=true", f"rllm.algorithm.kl_loss_coef={coef}")
    plain = _backend(tmp_path)
    batch = _token_batch(with_kl)
    loss_kl, stats, grads_kl = _loss_and_grads(with_kl, batch)
    loss, _, grads = _loss_and_grads(plain, batch)  # the same initial weights (same seed)
    assert stats["kl_loss"].item() == 0.0 and loss_kl.item() == loss.item()
    for a, b in zip(grads_kl, grads, strict=True):
        torch.testing.assert_close(a, b)
    # move the policy away from the reference: the extra loss is coef * token-mean k3, and its
    # gradient is autograd of that formula written out here
    with torch.no_grad():
        for p_kl, p in zip(with_kl.model.parameters(), plain.model.parameters(), strict=True):
            p_kl.add_(0.05 * torch.randn_like(p_kl))
            p.copy_(p_kl)
    loss_kl, stats, grads_kl = _loss_and_grads(with_kl, batch)
    loss, _, grads = _loss_and_grads(plain, batch)
    plain.model.zero_grad()
    log_probs = token_log_probs(plain.model, batch.input_ids, batch.attention_mask)
    delta = log_probs - batch.ref_log_probs
    mask = batch.response_mask
    k3 = ((torch.exp(-delta) - 1 + delta) * mask).sum() / mask.sum()
    (coef * k3).backward()
    assert stats["kl_loss"].item() == pytest.approx(k3.item(), rel=1e-5) and k3.item() > 0
    assert (loss_kl - loss).item() == pytest.approx(coef * k3.item(), rel=1e-4)
    for a, b, p in zip(grads_kl, grads, plain.model.parameters(), strict=True):
        torch.testing.assert_close(a - b, p.grad, rtol=1e-4, atol=1e-6)


def test_the_reference_is_frozen_and_a_copy_of_the_initial_policy(tmp_path):
    backend = _backend(tmp_path, "rllm.algorithm.use_kl_in_reward=true")
    assert not any(p.requires_grad for p in backend.ref_model.parameters()) and not backend.ref_model.training
    for a, b in zip(backend.ref_model.parameters(), backend.model.parameters(), strict=True):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    assert _backend(tmp_path).ref_model is None  # off by default: no reference, no extra forward


# ---- KL in the reward -------------------------------------------------------------------------


def _penalised_batch():
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0]])
    batch = TokenBatch(
        torch.zeros(2, 4, dtype=torch.long),
        torch.ones(2, 4, dtype=torch.long),
        mask,
        torch.tensor([1.0, 0.5], dtype=torch.float64),
        torch.tensor([0, 0]),
        ["solver"],
        torch.zeros(2, 4),
    )
    batch.reward_penalty = torch.tensor([[9.0, 0.1, 0.2, 0.3], [9.0, 0.05, 0.05, 9.0]]) * mask
    return batch


def test_with_kl_in_the_reward_the_token_rewards_carry_it():
    batch = _penalised_batch()
    compute_token_advantages(batch, AlgorithmConfig(estimator="reinforce_plus_plus", gamma=1.0))
    # token rewards: -penalty on every trained token, + the outcome on the last one
    rewards = torch.tensor([[0.0, -0.1, -0.2, 1.0 - 0.3], [0.0, -0.05, 0.5 - 0.05, 0.0]])
    returns = rewards.flip(-1).cumsum(-1).flip(-1) * batch.response_mask
    torch.testing.assert_close(batch.returns, returns)
    trained = returns[batch.response_mask > 0]
    torch.testing.assert_close(
        batch.advantages, (returns - trained.mean()) / (trained.std(correction=0) + 1e-6) * batch.response_mask
    )


def test_with_kl_in_the_reward_outcome_estimators_see_the_penalised_score():
    batch = _penalised_batch()
    metrics = compute_token_advantages(batch, AlgorithmConfig(estimator="grpo", norm_adv_by_std_in_grpo=False))
    scores = torch.tensor([1.0 - 0.6, 0.5 - 0.1])
    assert metrics["reward/solver/mean"] == pytest.approx(float(scores.mean()))
    torch.testing.assert_close(batch.advantages[:, 1], scores - scores.mean())


# ---- training runs -----------------------------------------------------------------------------


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_ppo_with_a_critic_trains_checkpoints_the_critic_and_resumes_it(tmp_path):
    gae = ("rllm.algorithm.adv_estimator=gae", "rllm.algorithm.lam=0.95", "backend.critic.enable=true")
    trainer = run(make_config(tmp_path, *SMALL, *gae, "rllm.trainer.total_batches=2", "rllm.trainer.save_freq=2"))
    train_rows = [r for r in _rows(tmp_path) if "critic/vf_loss" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    assert all(r["critic/vf_loss"] > 0 and r["critic/grad_norm"] > 0 and "returns/solver/mean" in r for r in train_rows)
    state = torch.load(tmp_path / "checkpoints" / "step_000002" / "backend.pt", weights_only=False)
    saved = state["critic"] if "critic" in state else state["backend"]["critic"]
    for name, value in trainer.backend.critic.model.state_dict().items():
        assert torch.equal(saved[name], value), name
    resumed = TorchBackend(make_config(tmp_path, *SMALL, *gae), alphabet="0123456789+=")
    resumed.load_state_dict(trainer.backend.state_dict())
    for a, b in zip(resumed.critic.model.parameters(), trainer.backend.critic.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_kl_runs_log_the_kl_to_the_reference(tmp_path):
    run(
        make_config(
            tmp_path,
            *SMALL,
            "rllm.algorithm.use_kl_loss=true",
            "backend.weight_decay=0.5",
            "rllm.trainer.total_batches=2",
        )
    )  # decay moves the weights even if no group has signal
    rows = [r for r in _rows(tmp_path) if "actor/kl_loss" in r]
    assert len(rows) == 2 and rows[0]["ref/kl_k1"] == 0.0 and rows[0]["ref/kl_k3"] == 0.0  # step 1: policy = ref
    assert rows[1]["ref/kl_k3"] > 0 and rows[1]["actor/kl_loss"] > 0


@pytest.mark.parametrize(
    "overrides, message",
    [
        (("rllm.algorithm.adv_estimator=gae",), "backend.critic.enable=true"),
        (("backend.critic.enable=true",), "no estimator uses a critic"),
        (("rllm.algorithm.use_kl_loss=true", "rllm.algorithm.kl_loss_type=k4"), "kl_loss_type"),
        (("rllm.algorithm.use_kl_in_reward=true", "rllm.algorithm.kl_penalty=full"), "kl_penalty"),
        (("rllm.algorithm.adv_estimator=pass_at_k",), "k >= 1"),
        (
            ("rllm.algorithm.adv_estimator=pass_at_k", "rllm.algorithm.estimator_options.pass_at_k.k=5"),
            "group 0 has 4",
        ),
        (("rllm.algorithm.estimator_options.grpo.k=2",), "no option 'k'"),
        (("rllm.algorithm.gamma=1.5",), r"rllm.algorithm.gamma.*\[0, 1\]"),
        (("rllm.algorithm.lam=-0.5",), r"rllm.algorithm.lam.*\[0, 1\]"),
    ],
)
def test_bad_settings_stop_the_run_at_start_up_naming_them(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        run(make_config(tmp_path, *SMALL, "rllm.trainer.total_batches=1", *overrides))
    assert not (tmp_path / "metrics.jsonl").exists()


def test_a_reference_model_with_another_vocabulary_is_refused(tmp_path):
    other = build_policy(make_config(tmp_path, *SMALL).model, build_char_tokenizer("abc"))
    other.save_pretrained(tmp_path / "other")
    with pytest.raises(ConfigError, match="model.ref_path=.*vocabulary"):
        _backend(tmp_path / "run", "rllm.algorithm.use_kl_loss=true", f"model.ref_path={tmp_path / 'other'}")


def test_a_critic_value_is_the_head_at_the_position_before_the_token():
    """``values[:, t]`` is ``V(s_t)``, the head's output after the tokens before ``t``: it does not
    change when token ``t`` changes, and column 0 (no context) is 0."""
    from rllm_torch.backends.torch_backend.critic import build_critic, token_values

    config = make_config(Path("unused"), *SMALL).model
    critic = build_critic(config, build_policy(config, build_char_tokenizer("0123456789+=")), seed=1)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        values = token_values(critic, ids, torch.ones_like(ids))
        changed = token_values(critic, torch.tensor([[1, 2, 3, 9, 5]]), torch.ones_like(ids))
        head = critic(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, :, 0]
    assert values[0, 0] == 0.0 and torch.equal(values[0, 1:], head[:-1])
    assert torch.equal(values[0, :4], changed[0, :4]) and values[0, 4] != changed[0, 4]


def test_a_token_level_role_beside_an_outcome_role_gets_only_its_own_rows():
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 1.0, 1.0], [0.0, 1.0, 1.0]])
    batch = TokenBatch(
        torch.zeros(4, 3, dtype=torch.long),
        torch.ones(4, 3, dtype=torch.long),
        mask,
        torch.tensor([1.0, 0.0, 3.0, 5.0], dtype=torch.float64),
        torch.tensor([0, 0, 1, 1]),
        ["judge", "solver"],
        torch.zeros(4, 3),
    )
    config = AlgorithmConfig(estimator="reinforce_plus_plus", estimator_map={"judge": "grpo"}, gamma=0.5)
    compute_token_advantages(batch, config)
    # solver (rows 2, 3): returns of [0, 0, 3] and [0, 0, 5] at gamma 0.5, whitened over its 4 tokens
    returns = torch.tensor([[0.0, 1.5, 3.0], [0.0, 2.5, 5.0]])
    trained = returns[mask[2:] > 0]
    torch.testing.assert_close(batch.returns[2:], returns)
    torch.testing.assert_close(
        batch.advantages[2:], (returns - trained.mean()) / (trained.std(correction=0) + 1e-6) * mask[2:]
    )
    # judge (rows 0, 1): grpo of [1, 0] broadcast over each row's mask; no returns
    torch.testing.assert_close(
        batch.advantages[:2], torch.tensor([[0.0, 1.0, 1.0], [0.0, -1.0, 0.0]]), atol=1e-5, rtol=0
    )
    assert torch.equal(batch.returns[:2], torch.zeros(2, 3))


def test_a_non_finite_critic_gradient_stops_the_step_and_keeps_the_critics_weights(tmp_path):
    """As the policy's: a NaN in the value model's gradient raises before AdamW moves a weight."""
    from rllm_torch.core.errors import NonFiniteGradientError

    backend = _backend(tmp_path, "rllm.algorithm.adv_estimator=gae", "backend.critic.enable=true")
    critic = backend.critic
    before = {k: v.clone() for k, v in critic.model.state_dict().items()}
    for p in critic.model.parameters():
        p.grad = torch.ones_like(p)
    next(critic.model.parameters()).grad[0] = float("nan")
    with pytest.raises(NonFiniteGradientError, match="the critic's gradient norm is nan"):
        critic.step()
    assert all(torch.equal(before[k], v) for k, v in critic.model.state_dict().items())
    assert all(p.grad is None for p in critic.model.parameters())  # cleared for the next mini-batch


def test_a_micro_batchs_kl_loss_is_its_share_of_the_global_mini_batchs_token_mean(tmp_path):
    """One row of three as the micro-batch, the mini-batch's global token count as its normaliser
    (as under several micro-batches, or ranks): the KL term is that row's k3 sum divided by the
    global count, not by the row's own tokens (the policy moved off the reference first)."""
    backend = _backend(tmp_path, "rllm.algorithm.use_kl_loss=true")
    batch = _token_batch(backend)
    with torch.no_grad():
        for p in backend.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    row, mask = torch.tensor([0]), batch.response_mask
    global_tokens = backend.updater.global_normaliser(mask)
    assert global_tokens.item() > mask[0].sum().item() > 0
    with torch.no_grad():
        _, stats = backend.updater.micro_batch_loss(batch, row, global_tokens)
        delta = token_log_probs(backend.model, batch.input_ids, batch.attention_mask) - batch.ref_log_probs
    k3_sum = ((torch.exp(-delta) - 1 + delta) * mask)[0].sum()
    assert stats["kl_loss"].item() == pytest.approx((k3_sum / global_tokens).item(), rel=1e-5) and k3_sum > 0
