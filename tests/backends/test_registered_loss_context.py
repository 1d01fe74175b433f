"""What a loss registered with ``register_loss`` receives in a real update of the torch backend
(issue 50): ``rllm.algorithm.loss_params`` (with rLLM's ``eps_clip``, ``eps_clip_high`` and
``kl_beta``) in ``LossContext.params``, an all-zero ``obs_mask``, the reference policy's
log-probs when it declares ``needs=("logp_ref",)``, and an ``action_mask`` less the tokens the
run's filters (``backend.top_entropy_quantile``, ``rollout_correction.off_policy_mask_threshold``)
leave out, as for a built-in loss. A recording loss keeps each context; the expected tensors come
from a plain full forward of each row (float64 ``log_softmax``) and from the fixed episodes."""

from __future__ import annotations

import asyncio

import pytest
import torch
import trainer_rank_tasks as tasks
from transformers import AutoModelForCausalLM

from rllm_torch import LossContext, register_loss
from rllm_torch.backends.torch_backend import TorchBackend
from rllm_torch.trainer.state import TrainerState

SEEN: list[dict] = []


def _record(ctx: LossContext) -> None:
    SEEN.append(
        {
            name: (value.detach().clone() if isinstance(value, torch.Tensor) else value)
            for name, value in vars(ctx).items()
            if name != "aggregate"
        }
    )


@register_loss("test_ctx_recording_with_ref", needs=("logp_ref",))
def _recording_with_ref(ctx: LossContext):
    _record(ctx)
    return ctx.aggregate(-ctx.advantages * ctx.logp_curr, ctx.action_mask), {}


@register_loss("test_ctx_recording_nll")
def _recording_nll(ctx: LossContext):
    """cross_entropy's -A log pi, on the tokens the context says to train."""
    _record(ctx)
    return ctx.aggregate(-ctx.advantages * ctx.logp_curr, ctx.action_mask), {}


@register_loss("test_ctx_icepop_metrics")
def _icepop_metrics(ctx: LossContext):
    """cross_entropy's -A log pi, with constant metrics: one keyed like rLLM's IcePop, one bare."""
    return ctx.aggregate(-ctx.advantages * ctx.logp_curr, ctx.action_mask), {
        "icepop/mask_frac": 0.25,
        "ratio_mean": torch.tensor(1.5),
    }


GROUPS = tasks.fixed_groups(seed=11, num_groups=3, n=4, eos=tasks.eos_id())


def full_forward(model, ids_RT, mask_RT) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row alone through the whole model, float64: ``(log_probs, entropy)`` ``[R, T]``,
    column t the distribution predicting token t (0 at column 0 and on padding)."""
    logp, entropy = torch.zeros(ids_RT.shape, dtype=torch.float64), torch.zeros(ids_RT.shape, dtype=torch.float64)
    with torch.no_grad():
        for r in range(ids_RT.shape[0]):
            n = int(mask_RT[r].sum())
            dist = model(input_ids=ids_RT[r : r + 1, :n]).logits[0, :-1].double().log_softmax(-1)
            logp[r, 1:n] = dist.gather(1, ids_RT[r, 1:n, None]).squeeze(1)
            entropy[r, 1:n] = -(dist.exp() * dist).sum(-1)
    return logp, entropy


def one_update(config) -> tuple[TorchBackend, TrainerState, dict, list[dict]]:
    """One real update on :data:`GROUPS`: the backend, its state, the batch's inputs as they were
    before the update (with each row's full-forward log-probs and entropies under the initial
    weights), and the contexts the loss saw."""
    backend = TorchBackend(config, alphabet=tasks.ALPHABET)
    backend.init_rollout_engine()
    state = TrainerState(trajectory_groups=tasks._groups(GROUPS), total_steps=1)
    state.backend_batch = batch = backend.transform_to_backend_batch(state)
    logp, entropy = full_forward(backend.model, batch.input_ids, batch.attention_mask)
    before = {"logp": logp, "entropy": entropy}
    grads = {}
    backend.actor.optimizer.register_step_pre_hook(
        lambda *_: grads.update({n: p.grad.clone() for n, p in backend.model.named_parameters()})
    )

    async def step():
        await backend.process_backend_batch(state)
        await backend.compute_advantages(state, tasks.AlgorithmConfigFrom(config))
        await backend.update_policy(state)

    SEEN.clear()
    asyncio.run(step())
    before["grads"] = grads
    return backend, state, before, list(SEEN)


def rows_of(ctx: dict, batch) -> torch.Tensor:
    """The batch row of each of the context's rows (a mini-batch is a shuffle of the batch's rows):
    found by the sampler's log-probs, distinct random numbers in every row."""
    matches = (ctx["logp_rollout"][:, None, :] == batch.rollout_log_probs[None, :, :]).all(-1)
    assert (matches.sum(1) == 1).all()
    return matches.float().argmax(1)


def test_a_registered_loss_gets_the_params_the_masks_and_the_reference_log_probs(tmp_path):
    # the reference: another model (model.ref_path), so its log-probs are neither the policy's nor the old ones
    TorchBackend(tasks.backend_config("backend.seed=5"), alphabet=tasks.ALPHABET).model.save_pretrained(tmp_path)
    reference = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    config = tasks.backend_config(
        "rllm.algorithm.loss_fn=test_ctx_recording_with_ref",
        f"model.ref_path={tmp_path}",
        "backend.clip_ratio_low=0.15",
        "backend.clip_ratio_high=0.27",
        "rllm.algorithm.adv_estimator=reinforce",
    )
    config.rllm.algorithm.loss_params = {"alpha": 0.5, "tag": "mine"}
    backend, state, before, seen = one_update(config)
    batch = state.backend_batch
    assert len(seen) == 1  # one mini-batch, one micro-batch
    ctx = seen[0]
    rows = rows_of(ctx, batch)
    assert sorted(rows.tolist()) == list(range(batch.input_ids.shape[0]))
    mask = batch.response_mask[rows]
    assert mask.sum() == sum(len(m["response"]) for g in GROUPS for m in g["members"])

    assert ctx["params"] == {"eps_clip": 0.15, "eps_clip_high": 0.27, "kl_beta": 0.0, "alpha": 0.5, "tag": "mine"}
    assert ctx["backend"] == "torch"
    assert ctx["obs_mask"].shape == mask.shape and not ctx["obs_mask"].any()  # observations are never responses
    torch.testing.assert_close(ctx["action_mask"], mask, rtol=0, atol=0)
    want_ref = full_forward(reference, batch.input_ids, batch.attention_mask)[0][rows] * mask
    assert ctx["logp_ref"] is not None
    torch.testing.assert_close(ctx["logp_ref"].double(), want_ref, rtol=0, atol=2e-5)
    want_policy = before["logp"][rows] * mask  # one update: its forward runs on the initial weights
    assert (want_ref - want_policy).abs().max() > 0.1  # another model indeed
    torch.testing.assert_close(ctx["logp_curr"].double(), want_policy, rtol=0, atol=2e-5)
    torch.testing.assert_close(ctx["logp_old"].double(), want_policy, rtol=0, atol=2e-5)
    # the sampler's log-probs, where the episodes put them: row by row, at the response tokens
    sampled = {tuple(m["logprobs"]) for g in GROUPS for m in g["members"]}
    assert {tuple(row[m > 0].tolist()) for row, m in zip(ctx["logp_rollout"], mask, strict=True)} == {
        tuple(torch.tensor(s).tolist()) for s in sampled
    }
    # reinforce: each row's advantage is its reward, on each of its response tokens
    rewards = {tuple(torch.tensor(m["logprobs"]).tolist()): m["reward"] for g in GROUPS for m in g["members"]}
    for row, logp_row, m in zip(ctx["advantages"], ctx["logp_rollout"], mask, strict=True):
        reward = rewards[tuple(logp_row[m > 0].tolist())]
        assert row[m > 0].tolist() == [reward] * int(m.sum()) and not row[m == 0].any()


def test_a_loss_that_needs_no_reference_keeps_none_and_gets_none():
    backend, _, _, seen = one_update(tasks.backend_config("rllm.algorithm.loss_fn=test_ctx_recording_nll"))
    assert backend.actor.ref_model is None and not backend.actor.has_reference
    assert seen and all(ctx["logp_ref"] is None for ctx in seen)
    assert all(ctx["params"] == {"eps_clip": 0.2, "eps_clip_high": 0.2, "kl_beta": 0.0} for ctx in seen)


def test_a_loss_params_key_named_like_a_trainer_default_is_the_users_value():
    # loss_params are the loss's own parameters: the user's eps_clip / eps_clip_high / kl_beta win
    # over the ones the trainer fills in from backend.clip_ratio_low / _high (0.15, 0.27) and 0
    config = tasks.backend_config(
        "rllm.algorithm.loss_fn=test_ctx_recording_nll", "backend.clip_ratio_low=0.15", "backend.clip_ratio_high=0.27"
    )
    config.rllm.algorithm.loss_params = {"eps_clip": 0.31, "eps_clip_high": 0.42, "kl_beta": 0.05, "alpha": 2}
    _, _, _, seen = one_update(config)
    assert seen and all(
        ctx["params"] == {"eps_clip": 0.31, "eps_clip_high": 0.42, "kl_beta": 0.05, "alpha": 2} for ctx in seen
    )
    # one key given, the others still the trainer's
    config.rllm.algorithm.loss_params = {"eps_clip_high": 0.42}
    _, _, _, seen = one_update(config)
    assert seen and all(ctx["params"] == {"eps_clip": 0.15, "eps_clip_high": 0.42, "kl_beta": 0.0} for ctx in seen)


QUANTILE, THRESHOLD = 0.2, 1.4


def expected_filters(before: dict, batch) -> torch.Tensor:
    """The tokens the filters keep, in float64 from the full forward: the trained tokens whose
    entropy is at least the (1 - ρ) quantile of every trained token's (linear interpolation), in
    the rows not left out as off-policy (negative advantage and a mean log π_rollout - log π over
    the row's trained tokens above the threshold)."""
    trained = batch.response_mask > 0
    values = before["entropy"][trained].sort().values
    position = (1 - QUANTILE) * (len(values) - 1)
    low, frac = int(position), position - int(position)
    cut = values[low] + frac * (values[min(low + 1, len(values) - 1)] - values[low])
    assert (values - cut).abs().min() > 1e-4  # no token on the edge, where float32 could round either way
    keep = trained & (before["entropy"] >= cut)
    m = batch.response_mask.double()
    kl = ((batch.rollout_log_probs.double() - before["logp"]) * m).sum(-1) / m.sum(-1)
    negative = (batch.advantages.double() * m).sum(-1) < 0
    off = negative & (kl > THRESHOLD)
    assert 0 < int(off.sum()) < int(negative.sum())  # some rows out, others kept: the rule is exercised
    return (keep & ~off[:, None]).to(batch.response_mask.dtype)


def test_the_token_filters_reach_a_registered_losss_action_mask_as_they_reach_the_built_in():
    filters = (
        f"backend.top_entropy_quantile={QUANTILE}",
        f"rllm.algorithm.rollout_correction.off_policy_mask_threshold={THRESHOLD}",
    )
    config = tasks.backend_config(*filters, "rllm.algorithm.loss_fn=test_ctx_recording_nll")
    _, state, before, seen = one_update(config)
    batch = state.backend_batch
    (ctx,) = seen
    rows = rows_of(ctx, batch)
    want = expected_filters(before, batch)
    assert 0 < want.sum() < 0.6 * batch.response_mask.sum()
    torch.testing.assert_close(ctx["action_mask"], want[rows], rtol=0, atol=0)
    # the built-in loss it re-implements, with the same filters: the same gradient
    _, builtin_state, builtin, _ = one_update(tasks.backend_config(*filters, "rllm.algorithm.loss_fn=cross_entropy"))
    assert before["grads"].keys() == builtin["grads"].keys()
    for name, grad in builtin["grads"].items():
        torch.testing.assert_close(before["grads"][name], grad, rtol=1e-5, atol=1e-7, msg=name)
    assert state.metrics["actor/entropy_masked"] == pytest.approx(builtin_state.metrics["actor/entropy_masked"])
    assert state.metrics["actor/off_policy_masked"] > 0


def test_a_registered_losss_metric_keyed_with_a_slash_is_logged_under_actor_as_it_is_and_a_bare_one_under_its_name():
    # one mini-batch, one micro-batch, one loss on every row: each metric's token-weighted mean
    # over the step is the constant the loss returned (0.25 * tokens / tokens)
    _, state, _, _ = one_update(tasks.backend_config("rllm.algorithm.loss_fn=test_ctx_icepop_metrics"))
    assert state.metrics["actor/icepop/mask_frac"] == pytest.approx(0.25)
    assert state.metrics["actor/test_ctx_icepop_metrics/ratio_mean"] == pytest.approx(1.5)
    assert not [k for k in state.metrics if "test_ctx_icepop_metrics/icepop" in k]
