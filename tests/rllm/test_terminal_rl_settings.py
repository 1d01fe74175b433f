"""Three settings of rLLM's ``terminal-rl`` branch (a5fa9aa1, ``rllm/trainer/algorithms/config.py``), with
its meaning and defaults here or refused in one line (issue 48, item 3):

* ``CompactFilteringConfig.mask_{verifier_timeout, grading_error, sandbox_error, agent_setup_timeout,
  env_start_timeout, model_error}`` (config.py lines 142-150, read by ``should_mask``, lines 181-186):
  they mask the episodes that ended for the branch's infrastructure reasons, which no episode here ends
  for (its agent flows and sandboxes set them): False by default as in its dataclass; set with
  ``enable`` they mask nothing, and say so once;
* ``RejectionSamplingConfig.refill_filtered_uniform_groups`` (lines 234-240; read by its async buffer,
  ``rllm/trainer/buffer.py`` line 262): True in its dataclass, false in its ``base.yaml`` (line 141) as in
  the run config here; a group dropped as uniform is never replaced here, so ``true`` with
  ``filter_uniform_groups`` stops a run at start-up, naming the difference;
* ``AlgorithmConfig.loss_plugins`` (lines 340-342; ``load_loss_plugins``, rllm/trainer/algorithms/loss.py
  line 278): modules imported so that the losses they register can be named, before the loss is checked."""

from __future__ import annotations

import sys
import warnings

import pytest
from omegaconf import OmegaConf

from rllm_torch.compat.rllm.trainer.algorithms import (
    AlgorithmConfig,
    CompactFilteringConfig,
    RejectionSamplingConfig,
    load_loss_plugins,
)
from rllm_torch.core.errors import ConfigError
from rllm_torch.core.losses import registered_loss
from rllm_torch.core.losses import registry as loss_registry
from rllm_torch.rllm.types import TerminationReason
from rllm_torch.trainer.config_checks import check_run_config
from rllm_torch.trainer.schema import typed_run_config

INFRA_FLAGS = (
    "mask_verifier_timeout",
    "mask_grading_error",
    "mask_sandbox_error",
    "mask_agent_setup_timeout",
    "mask_env_start_timeout",
    "mask_model_error",
)


def test_the_six_infrastructure_flags_are_false_by_default_in_the_dataclass_and_the_run_config():
    bare, run = CompactFilteringConfig(), typed_run_config({}).rllm.compact_filtering
    assert [getattr(bare, f) for f in INFRA_FLAGS] == [False] * 6
    assert [run[f] for f in INFRA_FLAGS] == [False] * 6


def test_terminal_rls_base_yaml_section_builds_and_masks_what_the_same_section_without_the_six_masks():
    # rllm/trainer/config/rllm/base.yaml (terminal-rl) lines 118-133, with enable switched on
    theirs = {
        "enable": True,
        "mask_max_prompt_length_exceeded": True,
        "mask_max_response_length_exceeded": True,
        "mask_env_done": False,
        "mask_max_turns_exceeded": True,
        "mask_timeout": True,
        "mask_unknown": False,
        "mask_error": True,
        **dict.fromkeys(INFRA_FLAGS, True),
    }
    with pytest.warns(UserWarning) as warned:
        config = CompactFilteringConfig.from_config(OmegaConf.create(theirs))
    without = CompactFilteringConfig(**{k: v for k, v in theirs.items() if k not in INFRA_FLAGS})
    # every reason an episode here can end for is masked exactly as without the six flags
    assert [config.should_mask(r) for r in TerminationReason] == [without.should_mask(r) for r in TerminationReason]
    assert config.masked_reasons == without.masked_reasons
    assert len(warned) == 1 and "\n" not in str(warned[0].message)
    message = str(warned[0].message)
    assert all(f"rllm.compact_filtering.{f}" in message for f in INFRA_FLAGS) and "mask nothing" in message


def test_the_flags_warn_only_when_they_would_mask_something_in_rllm():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        CompactFilteringConfig(enable=False, mask_grading_error=True)  # enable off: rLLM masks nothing either
        CompactFilteringConfig(enable=True, mask_error=True)


def test_a_flag_that_is_not_a_bool_is_refused_naming_it():
    with pytest.raises(ConfigError, match="CompactFilteringConfig.mask_model_error must be a bool"):
        CompactFilteringConfig(mask_model_error="yes")


def test_refill_filtered_uniform_groups_defaults_are_terminal_rls_dataclass_and_base_yaml():
    assert RejectionSamplingConfig().refill_filtered_uniform_groups is True  # the dataclass
    section = typed_run_config({}).rllm.rejection_sample
    assert section.refill_filtered_uniform_groups is False  # base.yaml
    assert RejectionSamplingConfig.from_config(section).refill_filtered_uniform_groups is False
    given = typed_run_config({"rllm": {"rejection_sample": {"refill_filtered_uniform_groups": True}}})
    assert RejectionSamplingConfig.from_config(given.rllm.rejection_sample).refill_filtered_uniform_groups is True


def _rejection(**values):
    return typed_run_config({"rllm": {"rejection_sample": {"enable": True, **values}}})


def test_refilling_dropped_uniform_groups_stops_a_run_at_start_up_naming_the_difference():
    config = _rejection(filter_uniform_groups=True, refill_filtered_uniform_groups=True)
    with pytest.raises(ConfigError) as refused:
        check_run_config(config)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("rllm.rejection_sample.refill_filtered_uniform_groups=true: ")
    assert "not replaced" in message and "rllm.algorithm.filter_groups.enable=true" in message


def test_refill_is_accepted_where_rllm_does_not_read_it_and_false_is_what_happens_here():
    check_run_config(_rejection(filter_uniform_groups=False, refill_filtered_uniform_groups=True))
    settings = check_run_config(_rejection(filter_uniform_groups=True, refill_filtered_uniform_groups=False))
    assert settings.rs_config.refill_filtered_uniform_groups is False


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A module on the path that registers the loss ``plugin_nll`` when imported (not imported yet)."""
    name = "rllm_torch_test_loss_plugin"
    (tmp_path / f"{name}.py").write_text(
        "from rllm_torch import register_loss\n\n"
        "@register_loss('plugin_nll')\n"
        "def plugin_nll(ctx):\n"
        "    return ctx.aggregate(-ctx.advantages * ctx.logp_curr, ctx.action_mask), {}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)
    loss_registry._LOSSES.pop("plugin_nll", None)  # each test imports it afresh


def test_loss_plugins_are_imported_before_the_loss_is_checked(plugin):
    assert registered_loss("plugin_nll") is None
    with pytest.raises(ConfigError, match="plugin_nll"):
        AlgorithmConfig(loss_fn="plugin_nll")  # without the plugin: not a loss
    config = AlgorithmConfig(loss_plugins=[plugin], loss_fn="plugin_nll")
    assert config.loss_plugins == [plugin] and config.loss_fn == "plugin_nll"
    assert registered_loss("plugin_nll").fn.__module__ == plugin


def test_loss_plugins_default_to_none_and_are_read_from_rllms_section_and_a_run_config(plugin):
    assert AlgorithmConfig().loss_plugins == []
    section = AlgorithmConfig.from_config({"adv_estimator": "grpo", "loss_fn": "plugin_nll", "loss_plugins": [plugin]})
    assert section.loss_fn == "plugin_nll"
    run = typed_run_config({"rllm": {"algorithm": {"loss_fn": "plugin_nll", "loss_plugins": [plugin]}}})
    assert check_run_config(run).algorithm_config.loss_fn_for("any_role") == "plugin_nll"


def test_a_loss_plugin_that_cannot_be_imported_is_refused_naming_the_key_and_the_module():
    with pytest.raises(ConfigError, match=r"rllm\.algorithm\.loss_plugins: cannot import 'no_such_plugin_module'"):
        AlgorithmConfig(loss_plugins=["no_such_plugin_module"])
    with pytest.raises(ConfigError, match="list of module names"):
        load_loss_plugins("one_module_not_in_a_list")
