"""rLLM's behaviours of issue 48 items 5 and 6, each pinned to the rLLM code it comes from (rLLM main
9beb6e0f): the defaults of its dataclasses, its deprecation warnings, the verl loss names of its
(estimator, loss) pairs and a config that disagrees with a keyword."""

from __future__ import annotations

import warnings

import pytest
from omegaconf import OmegaConf

from rllm_torch import AlgorithmConfig, RolloutCorrectionConfig
from rllm_torch.trainer.config_checks import typed_algorithm_config
from rllm_torch.trainer.schema import TrainConfig

# tis_cap: rllm/trainer/algorithms/config.py: the dataclass says 5.0 (line 238), from_config reads an
# absent key as 2.0 (line 322), and rllm/trainer/config/rllm/base.yaml (line 92) sets 2.0.


def test_rollout_correction_config_built_bare_caps_the_weight_at_five_as_rllms_dataclass_does():
    assert RolloutCorrectionConfig().tis_cap == 5.0
    assert AlgorithmConfig().rollout_correction.tis_cap == 5.0


def test_from_config_without_tis_cap_reads_two_as_rllms_from_config_does():
    section_without = AlgorithmConfig.from_config({"adv_estimator": "grpo"})
    section_mode_only = AlgorithmConfig.from_config(
        {"adv_estimator": "grpo", "rollout_correction": {"tis_mode": "token"}}
    )
    assert section_without.rollout_correction.tis_cap == 2.0
    assert section_mode_only.rollout_correction.tis_cap == 2.0
    assert section_mode_only.rollout_correction.tis_mode == "token"
    given = AlgorithmConfig.from_config({"adv_estimator": "grpo", "rollout_correction": {"tis_cap": 3.0}})
    assert given.rollout_correction.tis_cap == 3.0


def test_a_run_config_left_alone_caps_at_two_as_rllms_base_yaml_does():
    config = OmegaConf.structured(TrainConfig)
    assert config.rllm.algorithm.rollout_correction.tis_cap == 2.0
    assert typed_algorithm_config(config).rollout_correction.tis_cap == 2.0
    assert isinstance(OmegaConf.to_object(config).rllm.algorithm.rollout_correction, RolloutCorrectionConfig)


def test_a_whole_rllm_config_without_a_rollout_correction_section_reads_two():
    config = OmegaConf.create({"rllm": {"algorithm": {"adv_estimator": "rloo"}}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert AlgorithmConfig.from_config(config).rollout_correction.tis_cap == 2.0
