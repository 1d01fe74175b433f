"""Per-role policy losses (rLLM's ``(estimator, loss)`` pairs in ``estimator_map``, and its
``loss_fn_map``): the config splits the pairs, a bad pair stops the run at start-up naming the
role, and one update trains each role's rows with its own loss over the mini-batch's one
normaliser: the micro-batch loss equals the sum of each loss on its role's rows, and a map that
gives every role the run's loss is the run without a map, bit for bit. A loss that pins its own
aggregation (gspo, a registered one) divides by its own mode's count over the mini-batch."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
from trainer_fakes import make_config
from trainer_rank_tasks import ALPHABET, AlgorithmConfigFrom, _groups, backend_config, eos_id, fixed_groups

from rllm_torch import AlgorithmConfig, register_loss, rLLMAdvantageEstimator
from rllm_torch.backends.torch_backend.backend import TorchBackend
from rllm_torch.core.errors import ConfigError
from rllm_torch.core.losses import policy_loss
from rllm_torch.trainer.config_checks import check_run_config
from rllm_torch.trainer.state import TrainerState


def test_estimator_map_pairs_split_into_the_estimators_and_the_losses():
    config = AlgorithmConfig(
        estimator_map={"teacher": ("reinforce", "cross_entropy"), "judge": ["rloo", "cispo"], "solver": "grpo"},
        loss_fn="ppo",
    )
    assert config.estimator_map == {
        "teacher": rLLMAdvantageEstimator.REINFORCE,
        "judge": rLLMAdvantageEstimator.RLOO,
        "solver": rLLMAdvantageEstimator.GRPO,
    }
    assert config.loss_fn_map == {"teacher": "cross_entropy", "judge": "cispo"}
    assert [config.loss_fn_for(r) for r in ("teacher", "judge", "solver", "other")] == [
        "cross_entropy",
        "cispo",
        "ppo",
        "ppo",
    ]


@pytest.mark.parametrize(
    "estimator_map, loss_fn_map, message",
    [
        ({"solver": ["grpo", "gmpo"]}, {}, r"role 'solver': policy loss 'gmpo' is not one of"),
        ({"solver": ["grpo"]}, {}, r"estimator_map\['solver'\]=\['grpo'\]: a pair is \[estimator, loss_fn\]"),
        ({"solver": ["grpo", "ppo", "x"]}, {}, r"a pair is \[estimator, loss_fn\]"),
        ({"solver": ["grpo", "ppo"]}, {"solver": "cispo"}, r"names loss 'ppo' but loss_fn_map\['solver'\]='cispo'"),
        ({}, {"judge": "nonsense"}, r"role 'judge': policy loss 'nonsense'"),
    ],
)
def test_a_bad_pair_or_loss_names_the_role(estimator_map, loss_fn_map, message):
    with pytest.raises(ConfigError, match=message):
        AlgorithmConfig(estimator_map=estimator_map, loss_fn_map=loss_fn_map)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["rllm.algorithm.estimator_map={solver:[grpo,nonsense]}"], r"role 'solver': policy loss 'nonsense'"),
        (
            ["rllm.algorithm.estimator_map={solver:[grpo,luspo]}"],
            r"rllm.algorithm.loss_fn_map\['solver'\]=luspo: luspo weights each sequence's loss",
        ),
        (
            ["rllm.algorithm.loss_fn_map={solver: cross_entropy}", "backend.clip_ratio_c=3"],
            r"backend.clip_ratio_c=3.0 is a ratio cap .*loss_fn_map\['solver'\]='cross_entropy' has none",
        ),
    ],
)
def test_a_run_config_with_a_bad_role_loss_stops_at_start_up(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        check_run_config(make_config(tmp_path, *overrides))


def _backend_and_batch(*dotlist: str):
    """The real torch backend and a token batch of 4 groups, the first two of role ``teacher``,
    the others ``solver``, with advantages and old log-probs set."""
    backend = TorchBackend(backend_config(*dotlist), alphabet=ALPHABET)
    backend.init_rollout_engine()
    groups = _groups(fixed_groups(0, 4, 3, eos_id()))
    for group in groups[:2]:
        group.group_role = "teacher"
    state = TrainerState(trajectory_groups=groups, total_steps=1)
    batch = backend.transform_to_backend_batch(state)
    gen = torch.Generator().manual_seed(1)
    batch.advantages = torch.randn(batch.response_mask.shape, generator=gen) * batch.response_mask
    batch.old_log_probs = batch.rollout_log_probs.clone()
    return backend, batch


def test_each_roles_rows_take_their_own_loss_over_the_mini_batchs_one_normaliser():
    backend, batch = _backend_and_batch("rllm.algorithm.estimator_map={teacher:[reinforce,cross_entropy]}")
    updater, rows = backend.updater, torch.arange(batch.input_ids.shape[0])
    updater._row_losses = updater.row_losses(batch, updater.plan)
    assert [loss.name for loss, _ in updater._row_losses] == ["cross_entropy", "ppo"]
    teacher_R = updater._row_losses[0][1]
    assert teacher_R.tolist() == [True] * 6 + [False] * 6  # groups 0 and 1: 3 rows each
    normaliser = updater.global_normaliser(batch.response_mask)
    with torch.no_grad():
        got, stats = updater.micro_batch_loss(batch, rows, normaliser)
        log_probs = backend.actor.train_model(batch.input_ids, batch.attention_mask, batch.response_mask > 0, True)
        log_probs = log_probs.log_probs
        mask = batch.response_mask
        want = sum(
            policy_loss(
                name, log_probs, batch.old_log_probs, batch.advantages, mask * of_R[:, None], normaliser=normaliser
            )[0]
            for name, of_R in ((n, teacher_R if n == "cross_entropy" else ~teacher_R) for n in ("cross_entropy", "ppo"))
        )
    torch.testing.assert_close(got, want)
    assert "actor/nll" in stats and "actor/clip_fraction" in stats  # each loss's diagnostics, over its rows


def test_a_map_that_gives_every_role_the_runs_loss_is_the_run_without_a_map():
    plain, batch = _backend_and_batch()
    mapped, _ = _backend_and_batch("rllm.algorithm.loss_fn_map={teacher: ppo, solver: ppo}")
    rows = torch.arange(batch.input_ids.shape[0])
    for updater in (plain.updater, mapped.updater):
        updater._row_losses = updater.row_losses(batch, updater.plan)
    assert [(loss.name, rows) for loss, rows in mapped.updater._row_losses] == [("ppo", None)]
    normaliser = plain.updater.global_normaliser(batch.response_mask)
    with torch.no_grad():
        a, _ = plain.updater.micro_batch_loss(batch, rows, normaliser)
        b, _ = mapped.updater.micro_batch_loss(batch, rows, normaliser)
    assert torch.equal(a, b)


def test_a_non_finite_gradient_stops_the_update_before_the_step_and_keeps_the_weights():
    from rllm_torch.core.errors import NonFiniteGradientError

    backend, _ = _backend_and_batch()
    actor = backend.actor
    before = [p.detach().clone() for p in actor.parameters]
    for p in actor.parameters:
        p.grad = torch.zeros_like(p)
    actor.parameters[0].grad[0] = float("nan")
    with pytest.raises(NonFiniteGradientError, match=r"gradient norm is nan .* the optimizer step was not taken"):
        actor.step()
    assert all(torch.equal(a, b) for a, b in zip(before, actor.parameters, strict=True))
    assert all(p.grad is None for p in actor.parameters)


def test_a_role_map_entry_no_group_has_is_named_at_the_first_batch(tmp_path):
    from tiny_runs import TINY_STEPS

    from rllm_torch.cli.train_command import run

    distill = ("task.name=distill", "task.mix_rl=true", "rllm.algorithm.use_precomputed_advantage=true")
    config = make_config(tmp_path, *TINY_STEPS, *distill, "rllm.algorithm.loss_fn_map={solvr: dro}")
    with pytest.warns(
        UserWarning,
        match=r"name role\(s\) \['solvr'\] that no group of the first batch has \(its roles: \['distill', 'solver'\]\)",
    ):
        run(config)


def test_a_map_that_gives_every_role_one_loss_other_than_the_runs_trains_with_that_loss():
    mapped, batch = _backend_and_batch("rllm.algorithm.loss_fn_map={teacher: cispo, solver: cispo}")
    plain, _ = _backend_and_batch("rllm.algorithm.loss_fn=cispo")
    rows = torch.arange(batch.input_ids.shape[0])
    for updater in (plain.updater, mapped.updater):
        updater._row_losses = updater.row_losses(batch, updater.plan)
    assert [(loss.name, rows) for loss, rows in mapped.updater._row_losses] == [("cispo", None)]  # not the run's ppo
    normaliser = plain.updater.global_normaliser(batch.response_mask)
    with torch.no_grad():
        a, _ = plain.updater.micro_batch_loss(batch, rows, normaliser)
        b, _ = mapped.updater.micro_batch_loss(batch, rows, normaliser)
    assert torch.equal(a, b)


def test_the_trainers_pairs_and_the_configs_loss_fn_map_naming_one_role_must_agree(tmp_path):
    from trainer_fakes import make_config

    config = make_config(tmp_path, "rllm.algorithm.loss_fn_map={solver: cispo}")
    agreed = check_run_config(config, estimator_map={"solver": ("rloo", "cispo")}).algorithm_config
    assert (agreed.estimator_for("solver").value, agreed.loss_fn_for("solver")) == ("rloo", "cispo")
    with pytest.raises(ConfigError, match=r"names loss 'ppo' but loss_fn_map\['solver'\]='cispo'"):
        check_run_config(config, estimator_map={"solver": ("rloo", "ppo")})


@register_loss("test_seq_mean_nll", agg_mode="seq-mean-token-mean")
def _seq_mean_nll(ctx):
    """cross_entropy's -A log pi, its aggregation pinned to each sequence's token mean."""
    return ctx.aggregate(-ctx.advantages * ctx.logp_curr, ctx.action_mask), {}


@pytest.mark.parametrize("pinned_loss", ["gspo", "test_seq_mean_nll"])
def test_a_loss_that_pins_its_aggregation_divides_by_its_own_modes_count_over_the_whole_mini_batch(pinned_loss):
    """The teacher's loss pins seq-mean-token-mean in a token-mean run: its part of the loss is
    divided by the mini-batch's number of sequences (12), the solver's ppo by its number of tokens,
    in every micro-batch (micro_batch_tokens makes several). The gradient, before the optimizer
    step, against autograd of the hand-written loss on a copy of the initial model."""
    config = backend_config(
        f"rllm.algorithm.loss_fn_map={{teacher: {pinned_loss}}}",
        "rllm.algorithm.adv_estimator=reinforce",  # advantage = reward (0 or 1) on every token
        "backend.grad_clip=1e9",  # no clip: the gradient is the loss's
        "backend.micro_batch_tokens=16",
    )
    backend = TorchBackend(config, alphabet=ALPHABET)
    backend.init_rollout_engine()
    groups = _groups(fixed_groups(0, 4, 3, eos_id()))
    for group in groups[:2]:
        group.group_role = "teacher"
    state = TrainerState(trajectory_groups=groups, total_steps=1)
    state.backend_batch = batch = backend.transform_to_backend_batch(state)
    initial = copy.deepcopy(backend.model)
    grads = {}
    backend.actor.optimizer.register_step_pre_hook(
        lambda *_: grads.update({n: p.grad.clone() for n, p in backend.model.named_parameters()})
    )

    async def step():
        await backend.process_backend_batch(state)
        await backend.compute_advantages(state, AlgorithmConfigFrom(config))
        await backend.update_policy(state)

    asyncio.run(step())
    assert len(backend.updater.micro.split(batch, torch.arange(12), collective=True)) > 1
    # on-policy (one epoch, one mini-batch: ratio 1, nothing clipped) both losses have the gradient of
    # sum_i sum_t -A[i,t] log pi[i,t] / L_i / 12 over the teacher's rows (gspo's and the pinned nll's alike)
    # plus sum_i sum_t -A[i,t] log pi[i,t] / (all trained tokens) over the solver's rows (ppo, token-mean)
    mask, adv = batch.response_mask.double(), batch.advantages.double()
    teacher = torch.tensor([True] * 6 + [False] * 6)  # groups 0 and 1 of 3 rows each
    assert (mask.sum(-1) > 0).all() and adv.abs().sum() > 0 and (adv * mask)[teacher].abs().sum() > 0
    logits = initial(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.double()
    logp = torch.zeros_like(mask)
    logp[:, 1:] = logits[:, :-1].log_softmax(-1).gather(2, batch.input_ids[:, 1:, None]).squeeze(2)
    per_token = -adv * logp * mask
    want = (per_token[teacher].sum(-1) / mask[teacher].sum(-1)).sum() / 12 + per_token[~teacher].sum() / mask.sum()
    want.backward()
    for name, param in initial.named_parameters():
        torch.testing.assert_close(grads[name], param.grad.float(), rtol=1e-4, atol=1e-6, msg=name)
