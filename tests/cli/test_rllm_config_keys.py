"""Keys of rLLM's own configs and launch scripts (issue 48, item 4): accepted with rLLM's meaning, or
refused with one line naming what to use. rLLM main 9beb6e0f reads ``rllm.stepwise_advantage.enable``
only in its verl trainer, ``rllm.workflow.use_workflow`` and ``rllm.rejection_sample.multiplier`` in
no trainer (``rllm/trainer/config/rllm/base.yaml`` declares them; ``examples/countdown/train_countdown.sh``
sets ``multiplier=1.0``), and ``rllm.async_training.fwd_bwd_group_size`` in its unified trainer's async
loop (``rllm/trainer/unified_trainer.py``). ``config_name="agent_ppo_trainer"`` (rLLM's
``examples/countdown/train_countdown.py``) composes rllm_torch's run config."""

from __future__ import annotations

import warnings

import pytest
from hydra import compose, initialize_config_module
from trainer_fakes import make_config

from rllm_torch.cli.command_line import check_command_line, register_configs
from rllm_torch.core.errors import ConfigError
from rllm_torch.trainer.config_checks import check_run_config
from rllm_torch.trainer.schema import prompts_per_step

#: the rllm.* keys of rLLM's examples/countdown/train_countdown.sh, as it gives them
COUNTDOWN_SH_RLLM_KEYS = [
    "rllm.compact_filtering.enable=False",
    "rllm.compact_filtering.mask_max_prompt_length_exceeded=True",
    "rllm.compact_filtering.mask_max_response_length_exceeded=True",
    "rllm.compact_filtering.mask_max_turns_exceeded=False",
    "rllm.compact_filtering.mask_timeout=True",
    "rllm.rejection_sample.enable=False",
    "rllm.rejection_sample.multiplier=1.0",
    "rllm.stepwise_advantage.enable=False",
    "rllm.stepwise_advantage.mode=per_step",
    "rllm.workflow.use_workflow=True",
]


def test_the_rllm_keys_of_rllms_countdown_launch_script_pass_the_command_line_and_the_start_up_checks(tmp_path):
    register_configs()
    check_command_line(COUNTDOWN_SH_RLLM_KEYS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # per_step is rLLM's deprecated mode: it warns, as rLLM does
        settings = check_run_config(make_config(tmp_path, *COUNTDOWN_SH_RLLM_KEYS))
    rllm = settings.config.rllm
    assert rllm.rejection_sample.multiplier == 1.0 and rllm.workflow.use_workflow is True
    assert rllm.stepwise_advantage.enable is False


def test_rllms_defaults_of_the_accepted_keys():
    register_configs()
    with initialize_config_module(config_module="rllm_torch.configs", version_base=None):
        config = compose(config_name="train")
    # rLLM's base.yaml: stepwise_advantage.enable False, workflow.use_workflow False, multiplier 1,
    # async_training.fwd_bwd_group_size / episode_offload_dir / trajectory_group_offload_dir null
    assert config.rllm.stepwise_advantage.enable is False and config.rllm.workflow.use_workflow is False
    assert config.rllm.rejection_sample.multiplier == 1
    section = config.rllm.async_training
    assert (section.fwd_bwd_group_size, section.episode_offload_dir, section.trajectory_group_offload_dir) == (
        None,
        None,
        None,
    )


@pytest.mark.parametrize("extra", [[], ["rllm.rejection_sample.enable=true"]])
def test_a_rejection_sample_multiplier_other_than_one_is_refused_naming_what_fills_a_step(tmp_path, extra):
    with pytest.raises(ConfigError, match=r"multiplier=2 is read by no trainer .*filter_groups\.enable=true"):
        check_run_config(make_config(tmp_path, "rllm.rejection_sample.multiplier=2", *extra))


ASYNC = ["rllm.async_training.enable=true", "rllm.async_training.mini_batch_size=4", "data.train_batch_size=4"]


@pytest.mark.parametrize("size", ["null", "4"])
def test_fwd_bwd_group_size_null_or_the_whole_step_is_one_pass_as_here(tmp_path, size):
    settings = check_run_config(make_config(tmp_path, *ASYNC, f"rllm.async_training.fwd_bwd_group_size={size}"))
    assert settings.async_training.fwd_bwd_group_size == 4  # rLLM: None becomes mini_batch_size


def test_fwd_bwd_group_size_that_splits_a_step_is_refused_naming_the_values_that_run(tmp_path):
    with pytest.raises(ConfigError, match=r"fwd_bwd_group_size=2: .*4 task batches .*set it to null or 4\."):
        check_run_config(make_config(tmp_path, *ASYNC, "rllm.async_training.fwd_bwd_group_size=2"))


def test_fwd_bwd_group_size_without_async_mode_is_refused_as_every_async_key_is(tmp_path):
    with pytest.raises(ConfigError, match=r"fwd_bwd_group_size=2 is read only in async mode"):
        check_run_config(make_config(tmp_path, "rllm.async_training.fwd_bwd_group_size=2"))


@pytest.mark.parametrize("name", ["episode_offload_dir", "trajectory_group_offload_dir"])
def test_an_offload_dir_warns_once_that_the_buffer_stays_in_memory(tmp_path, name):
    with pytest.warns(UserWarning, match=rf"rllm\.async_training\.{name}='/nvme/x': .*stays in memory") as caught:
        check_run_config(make_config(tmp_path, *ASYNC, f"rllm.async_training.{name}=/nvme/x"))
    assert sum(name in str(w.message) for w in caught) == 1


def test_async_steps_of_another_size_than_rllms_64_with_mini_batch_size_null_say_so_once(tmp_path):
    # rLLM's async step takes base.yaml's mini_batch_size=64 task batches, data.train_batch_size forced to 1
    on = ["rllm.async_training.enable=true"]
    with pytest.warns(
        UserWarning,
        match=r"mini_batch_size is null: an async step here takes data.train_batch_size=8 .*rLLM's takes 64",
    ) as caught:
        config = make_config(tmp_path, *on, "data.train_batch_size=8")
        check_run_config(config)
    assert prompts_per_step(config) == 8
    assert sum("mini_batch_size is null" in str(w.message) for w in caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_run_config(make_config(tmp_path, *on, "data.train_batch_size=64"))  # rLLM's step size
        check_run_config(make_config(tmp_path, *ASYNC))  # set: the user's own


def test_verls_algorithm_adv_estimator_is_answered_with_rllms_key():
    register_configs()
    with pytest.raises(ConfigError, match=r"did you mean rllm\.algorithm\.adv_estimator\?"):
        check_command_line(["algorithm.adv_estimator=grpo"])


def test_rllms_agent_ppo_trainer_config_name_composes_rllm_torchs_run_config():
    register_configs()
    with initialize_config_module(config_module="rllm_torch.compat.rllm.trainer.config", version_base=None):
        ppo = compose(config_name="agent_ppo_trainer", overrides=["rllm.rollout.n=2"])
        unified = compose(config_name="unified")
    assert ppo.rllm.rollout.n == 2 and ppo.rllm.trainer.experiment_name == "rllm_agent_ppo_trainer"
    # the same settings as `unified` but the run's directory name
    ppo.rllm.rollout.n, ppo.rllm.trainer.experiment_name = unified.rllm.rollout.n, unified.rllm.trainer.experiment_name
    assert ppo == unified
