"""Per-role policy losses (rLLM's ``(estimator, loss)`` pairs in ``estimator_map``, and its
``loss_fn_map``): the config splits the pairs, a bad pair stops the run at start-up naming the
role, and one update trains each role's rows with its own loss over the mini-batch's one
normaliser: the micro-batch loss equals the sum of each loss on its role's rows, and a map that
gives every role the run's loss is the run without a map, bit for bit."""

from __future__ import annotations

import pytest
import torch
from trainer_fakes import make_config
from trainer_rank_tasks import ALPHABET, _groups, backend_config, eos_id, fixed_groups

from rllm_torch import AlgorithmConfig, rLLMAdvantageEstimator
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
    updater._row_losses = updater.row_losses(batch)
    assert [name for name, _ in updater._row_losses] == ["cross_entropy", "ppo"]
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
    assert "nll" in stats and "clip_fraction" in stats  # each loss's diagnostics, over its rows


def test_a_map_that_gives_every_role_the_runs_loss_is_the_run_without_a_map():
    plain, batch = _backend_and_batch()
    mapped, _ = _backend_and_batch("rllm.algorithm.loss_fn_map={teacher: ppo, solver: ppo}")
    rows = torch.arange(batch.input_ids.shape[0])
    for updater in (plain.updater, mapped.updater):
        updater._row_losses = updater.row_losses(batch)
    assert mapped.updater._row_losses == [("ppo", None)]
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
        updater._row_losses = updater.row_losses(batch)
    assert mapped.updater._row_losses == [("cispo", None)]  # not the run's ppo
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
