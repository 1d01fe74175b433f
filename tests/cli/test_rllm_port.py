"""rLLM code ported by changing its imports (rLLM's examples: tests/cli/test_rllm_examples.py): a
user's loss registered with ``@register_loss`` trains from the command line (and gives the numbers
of the built-in loss it re-implements), a bad one stops at start-up naming it, and rLLM's config
keys are accepted with rLLM's meaning or answered with ours."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_runs import TINY_STEPS
from trainer_fakes import make_config

from rllm_torch.cli.command_line import check_command_line
from rllm_torch.cli.train_command import run
from rllm_torch.core.errors import ConfigError
from rllm_torch.trainer.config_checks import check_run_config

ROOT = Path(__file__).resolve().parents[2]


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if "actor/loss" in line]


LOSS_MODULE = '''
from rllm_torch import LossContext, register_loss


@register_loss("my_weighted_nll")
def my_weighted_nll(ctx: LossContext):
    """cross_entropy's -A log pi, written against rLLM's LossContext."""
    per_token = -ctx.advantages * ctx.logp_curr
    return ctx.aggregate(per_token, ctx.action_mask), {"tokens": float(ctx.action_mask.sum())}


@register_loss("my_broken_loss")
def my_broken_loss(ctx: LossContext):
    return 0.0, {}
'''


@pytest.fixture
def loss_module(tmp_path, monkeypatch):
    (tmp_path / "my_losses_for_test.py").write_text(LOSS_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_losses_for_test"


def test_a_users_loss_registered_by_decorator_trains_as_the_builtin_it_reimplements(tmp_path, loss_module):
    # several micro-batches a mini-batch: the loss must be normalised over the global mini-batch
    # (one-token answers: a random policy scores ~1/13, so the advantages, and the loss, are not all 0)
    micro = ("backend.micro_batch_tokens=24", "rllm.rollout.max_new_tokens=1", "rllm.rollout.n=8")
    common = (*TINY_STEPS, *micro, "rllm.algorithm.adv_estimator=reinforce", f"imports=[{loss_module}]")
    run(make_config(tmp_path / "mine", *common, "rllm.algorithm.loss_fn=my_weighted_nll"))
    run(make_config(tmp_path / "builtin", *common, "rllm.algorithm.loss_fn=cross_entropy"))
    mine, builtin = _rows(tmp_path / "mine"), _rows(tmp_path / "builtin")
    assert any(r["actor/grad_norm"] > 0 for r in mine)  # a step that trained
    assert [r["actor/loss"] for r in mine] == [r["actor/loss"] for r in builtin]  # the same update, bit for bit
    assert [r["actor/grad_norm"] for r in mine] == [r["actor/grad_norm"] for r in builtin]
    assert all(r["actor/my_weighted_nll/tokens"] > 0 for r in mine)  # its metrics are logged under its name


def test_a_users_loss_also_trains_one_role(tmp_path, loss_module):
    run(
        make_config(
            tmp_path,
            *TINY_STEPS,
            f"imports=[{loss_module}]",
            "rllm.algorithm.estimator_map={solver:[reinforce,my_weighted_nll]}",
        )
    )
    assert all("actor/my_weighted_nll/tokens" in r for r in _rows(tmp_path))


def test_a_bad_registered_loss_stops_the_run_at_start_up_naming_it(tmp_path, loss_module):
    config = make_config(tmp_path, *TINY_STEPS, f"imports=[{loss_module}]", "rllm.algorithm.loss_fn=my_broken_loss")
    with pytest.raises(
        ConfigError, match="loss 'my_broken_loss' .* must return \\(loss, metrics\\)|loss 'my_broken_loss'.*0-d tensor"
    ):
        run(config)
    assert not (tmp_path / "metrics.jsonl").exists()


def test_an_unregistered_loss_name_stops_at_start_up_with_the_way_to_register_one(tmp_path):
    with pytest.raises(ConfigError, match="'my_missing_loss' is not one of the policy losses .*@register_loss"):
        check_run_config(make_config(tmp_path, "rllm.algorithm.loss_fn=my_missing_loss"))


@pytest.mark.parametrize(
    "overrides, key, value",
    [
        (("data.max_response_length=5",), "rllm.rollout.max_new_tokens", 5),
        (("model.name=/some/model",), "model.path", "/some/model"),
        (("rllm.algorithm.eps_clip=0.28",), "backend.clip_ratio_low", 0.28),
        (("rllm.algorithm.eps_clip=0.28",), "backend.clip_ratio_high", 0.28),  # rLLM: symmetric without eps_clip_high
        (("rllm.algorithm.eps_clip=0.1", "rllm.algorithm.eps_clip_high=0.3"), "backend.clip_ratio_high", 0.3),
    ],
)
def test_rllm_keys_are_accepted_with_rllm_meaning(tmp_path, overrides, key, value):
    from omegaconf import OmegaConf

    config = make_config(tmp_path, *overrides)
    try:
        check_run_config(config)
    except ConfigError:  # model.path=/some/model is not there: checked later, by the backend
        pass
    assert OmegaConf.select(config, key) == value


@pytest.mark.parametrize(
    "overrides, message",
    [
        (("data.max_response_length=5", "rllm.rollout.max_new_tokens=7"), "are one setting here"),
        (("rllm.algorithm.kl_beta=0.01",), "use_kl_loss=true rllm.algorithm.kl_loss_coef=0.01"),
        (("rllm.algorithm.router_replay=R3",), "router_replay='R3' is not one of"),
    ],
)
def test_rllm_keys_that_disagree_or_do_not_apply_stop_with_one_line(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        check_run_config(make_config(tmp_path, *overrides))


@pytest.mark.parametrize(
    "override, ours",
    [
        ("actor_rollout_ref.actor.optim.lr=1e-5", "backend.lr"),
        ("training.learning_rate=2e-5", "backend.lr"),
        ("model.lora_rank=32", "model.lora.r"),
        ("training.group_size=8", "rllm.rollout.n"),
        ("sampling.train.temperature=1.0", "rllm.rollout.temperature"),
    ],
)
def test_keys_of_rllms_backends_are_answered_with_the_key_that_does_the_same(override, ours):
    with pytest.raises(ConfigError, match=f"did you mean {ours}\\?"):
        check_command_line([override])


def test_data_val_batch_size_batches_validation_and_rejects_zero(tmp_path):
    from rllm_torch.trainer.state import TrainerState

    with pytest.raises(ConfigError, match="data.val_batch_size: 0 is not a batch size"):
        check_run_config(make_config(tmp_path, "data.val_batch_size=0"))
    from trainer_rank_tasks import ALPHABET, backend_config

    from rllm_torch.backends.torch_backend.backend import TorchBackend

    backend = TorchBackend(backend_config("data.val_batch_size=3", "data.train_batch_size=8"), alphabet=ALPHABET)
    rows = [{"prompt": "1+1=", "answer": "2"}] * 7
    training, validating = TrainerState(), TrainerState(is_training=False)
    assert [len(b) for b in backend.get_dataloader(rows, training)] == [7]  # 8 prompts a step: one batch
    assert [len(b) for b in backend.get_dataloader(rows, validating)] == [3, 3, 1]
    whole = TorchBackend(backend_config("data.val_batch_size=-1", "data.train_batch_size=2"), alphabet=ALPHABET)
    assert [len(b) for b in whole.get_dataloader(rows, validating)] == [7]


def test_a_prompt_longer_than_data_max_prompt_length_stops_at_start_up():
    from trainer_rank_tasks import ALPHABET, backend_config

    from rllm_torch.backends.torch_backend.backend import TorchBackend

    backend = TorchBackend(backend_config("data.max_prompt_length=3"), alphabet=ALPHABET)
    backend.validate_prompts([{"prompt": "1+1="[:3], "answer": "2"}])  # 3 tokens: fits
    with pytest.raises(ConfigError, match=r"is 4 tokens, above data.max_prompt_length=3"):
        backend.validate_prompts([{"question": "1+1=", "answer": "2"}])  # rLLM's key
