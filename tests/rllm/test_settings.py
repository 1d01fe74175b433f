"""One declaration per setting (:mod:`rllm_torch.rllm.settings`): every setting of the run config
is declared with its help; what the schema, ``AlgorithmConfig``, the estimators' run-wide options
and the resume tables hold is read from those declarations; a value is checked against its
declaration with one message format."""

from __future__ import annotations

import dataclasses
import inspect
import math

import pytest
from omegaconf import OmegaConf

from rllm_torch import AlgorithmConfig, compute_advantages
from rllm_torch.core.errors import ConfigError
from rllm_torch.rllm.config import RUN_OPTIONS
from rllm_torch.rllm.registry import builtin_estimator_options
from rllm_torch.rllm.settings import UNSET, check_value, declared, default_of, schema_section, setting, walk
from rllm_torch.trainer.runtime import fingerprint
from rllm_torch.trainer.schema import TrainConfig


def test_every_setting_of_the_run_config_is_declared_with_a_help_line():
    undeclared = [key for key, s, _ in walk(TrainConfig) if s is None or not s.help.strip()]
    assert not undeclared, undeclared


def test_the_schema_takes_the_algorithm_settings_from_algorithm_config():
    schema = OmegaConf.structured(TrainConfig)
    for field in dataclasses.fields(AlgorithmConfig):
        s = field.metadata["setting"]
        if field.name == "estimator_options":  # the schema lists the built-ins' own options
            expected = builtin_estimator_options()
        elif s.schema_default is not UNSET:
            expected = s.schema_default
        else:
            expected = default_of(field)
        value = OmegaConf.select(schema, s.key)
        plain = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
        if dataclasses.is_dataclass(expected):  # a section (rollout_correction), its fields' schema defaults
            expected = dataclasses.asdict(schema_section(type(expected))())
        assert plain == getattr(expected, "value", expected), s.key


def test_the_run_wide_options_are_the_run_wide_declarations_and_compute_advantages_takes_them():
    assert RUN_OPTIONS == ("norm_adv_by_std_in_grpo", "epsilon", "std_correction", "gamma", "lam")
    parameters = inspect.signature(compute_advantages).parameters
    assert [p for p in parameters if p in RUN_OPTIONS] == list(RUN_OPTIONS)
    assert parameters["epsilon"].default == AlgorithmConfig().epsilon
    assert set(AlgorithmConfig().estimator_kwargs) == set(RUN_OPTIONS)


def test_the_resume_tables_are_the_declarations_resumable_facts():
    resumable = {key for key, s, _ in walk(TrainConfig) if s.resumable}
    assert set(fingerprint.RESUMABLE_KEYS) == resumable
    assert set(fingerprint.FINGERPRINT_KEYS) == {key for key, _, _ in walk(TrainConfig)} - resumable
    assert "rllm.algorithm.lr_schedule" in resumable  # declared in AlgorithmConfig, resumable there


@dataclasses.dataclass
class Section:
    n: int = setting(8, "rollouts", minimum=1)
    top_p: float = setting(1.0, "nucleus", minimum=0, maximum=1, exclusive_minimum=True)
    mode: str | None = setting(None, "a mode", choices=("a", "b"), note="'c' is 'b'")
    w: float = setting(1.0, "a weight", finite=True)
    even: int = setting(
        2, "an even number", check=lambda v: v if v % 2 == 0 else (_ for _ in ()).throw(ValueError(f"{v} is odd"))
    )


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("n", 0, r"k=0 is out of range; it must be >= 1 \(e.g. k=8\)"),
        ("n", True, r"k=True is out of range"),
        ("top_p", 0.0, r"k=0.0 is out of range; it must be in \(0, 1\]"),
        ("top_p", math.nan, r"k=nan is out of range"),
        ("mode", "c", r"k='c' is not one of \('a', 'b'\) \('c' is 'b'\)"),
        ("w", math.inf, r"k must be a finite number, got inf"),
        ("even", 3, r"k: 3 is odd"),
    ],
)
def test_a_value_is_checked_against_its_declaration_with_one_message_format(name, value, message):
    with pytest.raises(ConfigError, match=message):
        check_value(value, declared(Section)[name], "k", example=8)


def test_none_and_values_inside_their_declaration_pass():
    for name, value in [("n", 1), ("top_p", 1.0), ("mode", None), ("mode", "a"), ("w", -3.0), ("even", 4)]:
        assert check_value(value, declared(Section)[name], "k") == value
