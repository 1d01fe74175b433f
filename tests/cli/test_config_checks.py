"""Start-up checks of the composed training config: values out of range and task keys the task
ignores stop the run before anything is built, naming the key."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException

from rllm_torch import AlgorithmConfig
from rllm_torch.cli.command_line import register_configs
from rllm_torch.core.errors import ConfigError
from rllm_torch.trainer.config_checks import check_run_config


def compose_train(*overrides: str):
    register_configs()
    with initialize_config_module(config_module="rllm_torch.configs", version_base=None):
        return compose(config_name="train", overrides=list(overrides))


def test_the_default_config_and_every_shipped_task_pass_the_checks():
    for task in ("arithmetic", "chain", "distill", "reasoning_gym"):
        check_run_config(compose_train(f"task={task}"))
    check_run_config(compose_train("task=file", "task.train_path=x.jsonl", "task.reward_fn=pkg.mod:score"))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("rllm.rollout.top_p=0", r"rllm.rollout.top_p=0.0 is out of range; it must be in \(0, 1\]"),
        ("rllm.rollout.top_p=5", r"rllm.rollout.top_p=5.0 is out of range; it must be in \(0, 1\]"),
        ("rllm.rollout.val_top_p=-0.5", r"rllm.rollout.val_top_p=-0.5 is out of range"),
        ("rllm.rollout.temperature=-1", r"rllm.rollout.temperature=-1.0 is out of range; it must be >= 0"),
        ("rllm.rollout.max_new_tokens=0", r"rllm.rollout.max_new_tokens=0 is out of range; it must be >= 1"),
        ("rllm.rollout.n_val=0", r"rllm.rollout.n_val=0 is out of range; it must be >= 1"),
        (
            "data.train_batch_size=0",
            r"data.train_batch_size=0 is out of range; it must be >= 1 \(e.g. data.train_batch_size=64\)",
        ),
        ("backend.lr=-1", r"backend.lr=-1.0 is out of range; it must be > 0 \(e.g. backend.lr=null\)"),
        ("backend.lr=nan", r"backend.lr=nan is out of range; it must be > 0"),
        ("backend.lr=0", r"backend.lr=0.0 is out of range; it must be > 0"),
        ("backend.grad_clip=0", r"backend.grad_clip=0.0 is out of range; it must be > 0"),
        ("backend.mini_batch_size=0", r"backend.mini_batch_size=0 is out of range"),
        ("backend.ppo_epochs=0", r"backend.ppo_epochs=0 is out of range"),
        ("backend.clip_ratio_c=1", r"backend.clip_ratio_c=1.0 is out of range; it must be > 1"),
    ],
)
def test_a_numeric_setting_out_of_range_is_refused_naming_its_key_and_range(override, message):
    with pytest.raises(ConfigError, match=message):
        check_run_config(compose_train(override))


def test_greedy_decoding_and_top_p_of_one_are_allowed():
    check_run_config(
        compose_train("rllm.rollout.temperature=0", "rllm.rollout.top_p=1", "backend.mini_batch_size=null")
    )


@pytest.mark.parametrize(
    "override",
    [
        "task.train_path=/nonexistent.jsonl",
        "task.reward_fn=nonexistent:score",
        "task.val_path=v.jsonl",
        "task.prompt_key=question",
    ],
)
def test_a_file_task_key_given_to_the_arithmetic_task_is_refused_naming_key_and_task(override):
    key = override.split("=")[0]
    with pytest.raises(
        ConfigError, match=rf"{key}=.* is not used by task.name='arithmetic' \(only task=file reads it\); add task=file"
    ):
        check_run_config(compose_train(override))


def test_the_loss_options_are_checked_against_the_loss():
    check_run_config(compose_train("backend.clip_ratio_c=3", "rllm.algorithm.importance_sampling_level=sequence"))
    with pytest.raises(
        ConfigError,
        match=r"backend.clip_ratio_c=3.0 is a ratio cap \(dual-clip PPO, DPPO\), and rllm.algorithm.loss_fn='cispo' has none",
    ):
        check_run_config(compose_train("backend.clip_ratio_c=3", "rllm.algorithm.loss_fn=cispo"))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"importance_sampling_level": "sentence"},
            r"importance_sampling_level='sentence' is not one of \('token', 'sequence'\)",
        ),
        ({"importance_sampling_level": "sequence", "loss_fn": "dro"}, r"loss_fn='dro' has none"),
        ({"importance_sampling_level": "sequence", "loss_fn": "cross_entropy"}, r"loss_fn='cross_entropy' has none"),
    ],
)
def test_a_bad_importance_sampling_level_stops_the_run_at_start_up(settings, message):
    overrides = [f"rllm.algorithm.{k}={v}" for k, v in settings.items()]
    with pytest.raises(ConfigError, match=message):
        check_run_config(compose_train(*overrides))


def test_dynamic_sampling_runs_on_several_processes_and_its_cap_must_be_positive():
    config = compose_train("rllm.algorithm.filter_groups.enable=true")
    check_run_config(config, world_size=1)
    check_run_config(config, world_size=2)  # each rank fills its share (tests/cli/test_torchrun.py)
    with pytest.raises(ConfigError, match=r"max_num_gen_batches=0 is out of range; it must be >= 1"):
        check_run_config(compose_train("rllm.algorithm.filter_groups.max_num_gen_batches=0"))


def test_role_maps_are_set_from_the_command_line_without_a_plus():
    # the maps' keys are the user's roles: the schema leaves these two maps open (not struct)
    config = compose_train(
        "rllm.algorithm.estimator_map={solver:[rloo,ppo],judge:reinforce}",
        "rllm.algorithm.loss_fn_map={distill:cross_entropy}",
    )
    check_run_config(config)
    algorithm = AlgorithmConfig.from_config(config)
    assert algorithm.estimator_map == {"solver": "rloo", "judge": "reinforce"}
    assert algorithm.loss_fn_map == {"distill": "cross_entropy", "solver": "ppo"}
    with pytest.raises(ConfigCompositionException):  # a typo in a fixed key still stops Hydra
        compose_train("rllm.algorithm.loss_fn_mapp={distill:cross_entropy}")


@pytest.mark.parametrize(
    ("kl_terms", "refused"),
    [
        ((), True),  # no KL term reads the reference: the path is unused
        (("rllm.algorithm.use_kl_loss=true",), False),
        (("rllm.algorithm.use_kl_in_reward=true",), False),
        (("rllm.algorithm.use_kl_loss=true", "rllm.algorithm.use_kl_in_reward=true"), False),
    ],
)
def test_a_reference_model_is_accepted_with_either_kl_term_and_refused_with_none(tmp_path, kl_terms, refused):
    config = compose_train(f"model.ref_path={tmp_path}", *kl_terms)
    if refused:
        with pytest.raises(ConfigError, match=r"model.ref_path=.* is set but no KL term uses a reference policy"):
            check_run_config(config)
    else:
        check_run_config(config)
