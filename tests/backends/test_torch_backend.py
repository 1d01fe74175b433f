"""The embedded torch backend: tokenizer, sampler, losses, token-level advantages, and a few
real training steps of a tiny model."""

from __future__ import annotations

import json
import math

import pytest
import torch
from omegaconf import OmegaConf
from tiny_runs import TINY_VALIDATED
from trainer_fakes import make_config

from rllm_torch import AlgorithmConfig, GroupedRewards, compute_advantages
from rllm_torch.backends.torch_backend import (
    build_char_tokenizer,
    importance_sampling_loss,
    ppo_clip_loss,
    sample_completions,
    token_log_probs,
    token_mean,
)
from rllm_torch.backends.torch_backend.model import build_policy
from rllm_torch.core.errors import ModelNotFoundError
from rllm_torch.trainer import TokenBatch, compute_token_advantages

TINY = OmegaConf.create(
    {"path": None, "arch": "gpt2", "num_layers": 1, "hidden_size": 32, "num_heads": 2, "max_positions": 16}
)


def test_the_character_tokenizer_round_trips_text_and_ends_with_eos():
    tok = build_char_tokenizer("0123456789+=")
    ids = tok("3+4=")["input_ids"]
    assert len(ids) == 4 and tok.decode(ids) == "3+4="
    assert tok.pad_token_id == tok.eos_token_id


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_sampled_log_probs_match_the_trainers_recomputed_log_probs(arch):
    tok = build_char_tokenizer("0123456789+=")
    model = build_policy(OmegaConf.merge(TINY, {"arch": arch}), tok, seed=0).eval()
    prompts = [tok("3+4=")["input_ids"], tok("12+3=")["input_ids"]]  # different lengths: left padding
    gen = torch.Generator().manual_seed(0)
    responses, logprobs, reasons = sample_completions(
        model, prompts, max_new_tokens=3, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, generator=gen
    )
    for prompt, response, logp in zip(prompts, responses, logprobs, strict=True):
        assert 1 <= len(response) <= 3 and len(logp) == len(response)
        ids = torch.tensor([prompt + response])
        recomputed = token_log_probs(model, ids, torch.ones_like(ids))[0, len(prompt) :]
        torch.testing.assert_close(recomputed, torch.tensor(logp), atol=1e-5, rtol=1e-5)
    assert set(reasons) <= {"stop", "length"}


def test_ppo_loss_is_the_negative_token_mean_advantage_on_policy_and_clips_off_policy():
    logp = torch.tensor([[-1.0, -2.0, 0.0]], requires_grad=True)
    adv, mask = torch.tensor([[0.0, 2.0, 2.0]]), torch.tensor([[0.0, 1.0, 1.0]])
    loss, stats = ppo_clip_loss(logp, logp.detach(), adv, mask)
    assert loss.item() == pytest.approx(-2.0) and stats["clip_fraction"].item() == 0.0
    loss, stats = ppo_clip_loss(logp.detach() + 1.0, logp.detach(), adv, mask)  # ratio e > 1.2: clipped
    assert loss.item() == pytest.approx(-1.2 * 2.0) and stats["clip_fraction"].item() == 1.0
    is_loss, _ = importance_sampling_loss(logp.detach() + 1.0, logp.detach(), adv, mask)
    assert is_loss.item() == pytest.approx(-torch.e * 2.0, rel=1e-6)
    assert token_mean(torch.ones(2, 2), torch.zeros(2, 2)).item() == 0.0


def _batch(rewards, group_index, roles, num_tokens=3):
    n = len(rewards)
    mask = torch.ones(n, num_tokens)
    mask[:, 0] = 0  # the prompt token
    return TokenBatch(
        torch.zeros(n, num_tokens, dtype=torch.long),
        torch.ones(n, num_tokens, dtype=torch.long),
        mask,
        torch.tensor(rewards),
        torch.tensor(group_index),
        roles,
        torch.zeros(n, num_tokens),
    )


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce", "reinforce_plus_plus_baseline", "prpo"])
def test_token_advantages_are_the_estimators_advantages_times_the_response_mask(estimator):
    batch = _batch([1.0, 0.0, 0.5, 1.0, 0.0, 0.0], [0, 0, 1, 1, 1, 0], ["default", "default"])
    compute_token_advantages(batch, AlgorithmConfig(estimator=estimator))
    expected_N, _ = compute_advantages(
        GroupedRewards.from_flat(batch.rewards, batch.group_index, num_groups=2), estimator
    )
    torch.testing.assert_close(batch.advantages, expected_N[:, None] * batch.response_mask)


def test_token_advantages_run_each_roles_estimator_on_that_roles_groups_only():
    batch = _batch([1.0, 0.0, 3.0, 5.0], [0, 0, 1, 1], ["solver", "judge"])
    metrics = compute_token_advantages(batch, AlgorithmConfig(estimator="grpo", estimator_map={"judge": "reinforce"}))
    adv_N = batch.advantages[:, 1]
    torch.testing.assert_close(adv_N, torch.tensor([1.0, -1.0, 3.0, 5.0]), atol=1e-5, rtol=0)
    assert metrics["reward/judge/mean"] == 4.0


def test_a_missing_model_directory_is_a_clear_error(tmp_path):
    tok = build_char_tokenizer("01")
    with pytest.raises(ModelNotFoundError, match="model.path"):
        build_policy(OmegaConf.merge(TINY, {"path": str(tmp_path / "nope")}), tok)


def test_a_few_real_training_steps_update_the_tiny_model_and_save_a_loadable_checkpoint(tmp_path):
    from rllm_torch.cli.train_command import run

    config = make_config(
        tmp_path,
        *TINY_VALIDATED,
        "rllm.algorithm.adv_estimator=rloo",
    )
    trainer = run(config)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "actor/loss" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    assert all(math.isfinite(r["actor/grad_norm"]) and math.isfinite(r["actor/loss"]) for r in train_rows)
    assert all(r["actor/rollout_logprob_abs_diff"] < 1e-4 for r in train_rows)  # sampled = recomputed log-probs
    assert [step for step, _ in trainer.val_history] == [0, 2]
    assert (tmp_path / "config.yaml").exists() and (tmp_path / "checkpoints" / "final" / "config.json").exists()
    reloaded = build_policy(OmegaConf.merge(TINY, {"path": str(tmp_path / "checkpoints" / "final")}), trainer.tokenizer)
    for a, b in zip(reloaded.parameters(), trainer.backend.model.parameters(), strict=True):
        torch.testing.assert_close(a, b.cpu())


def _backend_step(dotlist: list[str], *, recompute_old: bool = False):
    """One real step of the torch backend on fixed groups: ``(backend, metrics, old log-probs
    after process_backend_batch, policy forwards)``. ``recompute_old``: fill the old log-probs
    with a separate no-gradient pass before the update, as the backend did before it skipped it."""
    import asyncio

    from trainer_rank_tasks import AlgorithmConfigFrom, _groups, backend_config, eos_id, fixed_groups

    from rllm_torch.backends.torch_backend.backend import TorchBackend
    from rllm_torch.trainer.state import TrainerState

    config = backend_config(*dotlist)
    backend = TorchBackend(config, alphabet="0123456789+=")
    backend.init_rollout_engine()
    state = TrainerState(trajectory_groups=_groups(fixed_groups(0, 4, 4, eos_id())), total_steps=1)
    state.backend_batch = backend.transform_to_backend_batch(state)
    forwards = []
    backend.model.base_model.register_forward_hook(lambda *_: forwards.append(1))  # the body: every pass

    async def step():
        await backend.process_backend_batch(state)
        old = state.backend_batch.old_log_probs
        if recompute_old:
            with torch.no_grad():
                rows = torch.arange(state.backend_batch.input_ids.shape[0])
                state.backend_batch.old_log_probs = backend.passes.log_probs(
                    backend.actor.scorer, state.backend_batch, [rows]
                )
        await backend.compute_advantages(state, AlgorithmConfigFrom(config))
        await backend.update_policy(state)
        return old

    old = asyncio.run(step())
    return backend, state.metrics, old, len(forwards)


@pytest.mark.parametrize("loss_fn", ["ppo", "cispo", "dro"])
def test_one_update_per_batch_takes_the_old_log_probs_from_its_own_forward(loss_fn):
    dotlist = [f"rllm.algorithm.loss_fn={loss_fn}"]
    skipped, metrics, old, forwards = _backend_step(dotlist)
    assert old is None and forwards == 1  # the update's forward only
    recomputed, metrics_ref, _, forwards_ref = _backend_step(dotlist, recompute_old=True)
    assert forwards_ref == 2
    for a, b in zip(skipped.model.parameters(), recomputed.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert metrics.keys() == metrics_ref.keys()
    for key in metrics:
        assert metrics[key] == pytest.approx(metrics_ref[key], abs=1e-6), key
    assert metrics["actor/approx_kl"] == 0.0 and metrics["actor/rollout_logprob_abs_diff"] > 0


@pytest.mark.parametrize(
    "dotlist, updates",
    [
        (["backend.ppo_epochs=2"], 2),
        (["backend.mini_batch_size=4"], 4),  # 16 rows in 4 mini-batches
        (["rllm.algorithm.use_kl_in_reward=true"], 1),  # the reward's KL needs them before the advantages
    ],
)
def test_the_old_log_probs_are_a_pass_of_their_own_when_the_update_is_not_the_only_one(dotlist, updates):
    backend, metrics, old, forwards = _backend_step(dotlist)
    assert old is not None
    assert forwards == 1 + updates
    assert metrics["actor/rollout_logprob_abs_diff"] > 0


def test_forwards_run_only_up_to_the_longest_real_row_and_pad_back_with_zeros():
    from rllm_torch.backends.torch_backend.forward import on_real_columns

    ids = torch.tensor([[5, 6, 7, 0, 0, 0], [5, 6, 0, 0, 0, 0]])
    mask = (torch.arange(6) < torch.tensor([[3], [2]])).long()
    widths = []

    def forward(i, m):
        widths.append(i.shape[1])
        return (i * m).float() + 1.0

    out = on_real_columns(forward, ids, mask)
    assert widths == [3]
    torch.testing.assert_close(out, torch.tensor([[6.0, 7, 8, 0, 0, 0], [6, 7, 1, 0, 0, 0]]))
    assert on_real_columns(forward, ids[:0], mask[:0]).shape == (0, 6)  # no rows: the forward on nothing


def test_the_critic_values_are_computed_on_the_real_columns_only(tmp_path):
    from trainer_rank_tasks import _groups, backend_config, eos_id, fixed_groups

    from rllm_torch.backends.torch_backend.backend import TorchBackend
    from rllm_torch.backends.torch_backend.critic import token_values
    from rllm_torch.trainer.state import TrainerState

    config = backend_config("rllm.algorithm.adv_estimator=gae", "backend.critic.enable=true")
    backend = TorchBackend(config, alphabet="0123456789+=")
    state = TrainerState(trajectory_groups=_groups(fixed_groups(0, 2, 4, eos_id())), total_steps=1)
    batch = backend.transform_to_backend_batch(state)
    wide = torch.nn.functional.pad(batch.input_ids, (0, 5), value=backend.tokenizer.pad_token_id)
    batch.input_ids, batch.attention_mask = wide, torch.nn.functional.pad(batch.attention_mask, (0, 5))
    batch.response_mask = torch.nn.functional.pad(batch.response_mask, (0, 5))
    widths = []
    backend.critic.model.register_forward_hook(
        lambda _m, args, kwargs, _out: widths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    values = backend.critic.values(batch, [torch.arange(batch.input_ids.shape[0])])
    real = int(batch.attention_mask.sum(-1).max())
    assert widths == [real] and values.shape == wide.shape and not values[:, real:].any()
    with torch.no_grad():
        full = token_values(backend.critic.model, batch.input_ids, batch.attention_mask) * batch.response_mask
    torch.testing.assert_close(values, full, rtol=0, atol=1e-6)


def test_the_sequence_ratio_and_the_dual_clip_reach_the_backends_loss(monkeypatch):
    """Two epochs on one batch (so the second sees ρ != 1). Every loss the backend optimises is the
    pure ``policy_loss`` of its inputs with GSPO's sequence ratio (not the token ratio, which gives
    another value in the second epoch), and the dual clip's cap is what ``actor/clip_fraction_lower``
    reports."""
    from rllm_torch.core.losses import BuiltinLoss, policy_loss

    calls = []
    compute = BuiltinLoss.compute

    def recording_compute(self, ctx):  # the real loss, its inputs kept (the one way the update calls a loss)
        loss, stats = compute(self, ctx)
        tensors = [t.detach().clone() for t in (ctx.logp_curr, ctx.logp_old, ctx.advantages, ctx.action_mask)]
        aggregation = {"loss_agg_mode": ctx.aggregate.mode, "normaliser": ctx.aggregate.normaliser}
        calls.append((self.name, tensors, dict(ctx.params) | aggregation, loss.detach(), stats))
        return loss, stats

    monkeypatch.setattr(BuiltinLoss, "compute", recording_compute)
    _, token_metrics, _, _ = _backend_step(["backend.ppo_epochs=2"])
    assert "actor/clip_fraction_lower" not in token_metrics
    calls.clear()
    _backend_step(["backend.ppo_epochs=2", "rllm.algorithm.importance_sampling_level=sequence"])
    assert len(calls) == 2 and all(options["importance_sampling_level"] == "sequence" for _, _, options, _, _ in calls)
    name, tensors, options, loss, _ = calls[1]  # the second epoch: the policy moved since sampling
    calls.clear()  # policy_loss calls the loss the same way: the calls below are not the backend's
    assert loss == policy_loss(name, *tensors, **options)[0]
    token_level = policy_loss(name, *tensors, **(options | {"importance_sampling_level": "token"}))[0]
    assert abs(loss - token_level) > 1e-7
    calls.clear()
    _, capped, _, _ = _backend_step(["backend.ppo_epochs=2", "backend.clip_ratio_c=1.0001"])
    assert len(calls) == 2 and all(options["clip_ratio_c"] == 1.0001 for _, _, options, _, _ in calls)
    fractions = [float(stats["clip_fraction_lower"]) for _, _, _, _, stats in calls]
    assert fractions[0] == 0.0 and 0 < fractions[1] < 1  # ρ = 1 in the first epoch: nothing to cap
    assert capped["actor/clip_fraction_lower"] == pytest.approx(sum(fractions) / 2, rel=1e-6)
