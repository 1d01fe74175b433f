"""rLLM's keys that have another home here (``trainer/rllm_settings.py``): each given alone lands
in our key; given both ways with one value it is one setting (accepted); with two values it
stops naming both (the hints for rLLM's backend keys: tests/cli/test_rllm_key_hints.py)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from rllm_torch.core.errors import ConfigError
from rllm_torch.trainer.model_defaults import learning_rates
from rllm_torch.trainer.rllm_settings import resolve_rllm_settings
from rllm_torch.trainer.schema import TrainConfig

# (rLLM's key, ours, a value that is not the schema's default, another one)
ALIASES = [
    ("data.max_response_length", "rllm.rollout.max_new_tokens", 8, 9),
    ("model.name", "model.path", "org/model-a", "org/model-b"),
    ("rllm.algorithm.eps_clip", "backend.clip_ratio_low", 0.1, 0.15),
    ("rllm.algorithm.eps_clip_high", "backend.clip_ratio_high", 0.3, 0.35),
]


def config(*dotlist: str):
    return OmegaConf.merge(OmegaConf.structured(TrainConfig), OmegaConf.from_dotlist(list(dotlist)))


@pytest.mark.parametrize(("theirs", "ours", "value", "other"), ALIASES)
def test_rllms_key_alone_lands_in_ours(theirs, ours, value, other):
    run = config(f"{theirs}={value}")
    resolve_rllm_settings(run)
    assert OmegaConf.select(run, ours) == value


@pytest.mark.parametrize(("theirs", "ours", "value", "other"), ALIASES)
def test_rllms_key_and_ours_with_one_value_are_one_setting(theirs, ours, value, other):
    run = config(f"{theirs}={value}", f"{ours}={value}")
    resolve_rllm_settings(run)  # no error: the two agree
    assert OmegaConf.select(run, ours) == value
    resolve_rllm_settings(run)  # idempotent: a second check of the same config agrees again
    assert OmegaConf.select(run, ours) == value


@pytest.mark.parametrize(("theirs", "ours", "value", "other"), ALIASES)
def test_rllms_key_and_ours_with_two_values_stop_naming_both(theirs, ours, value, other):
    with pytest.raises(ConfigError, match=rf"{theirs}=.* \(rLLM's key\) and {ours}=.* are one setting here"):
        resolve_rllm_settings(config(f"{theirs}={value}", f"{ours}={other}"))


def test_eps_clip_alone_is_rllms_symmetric_clip():
    run = config("rllm.algorithm.eps_clip=0.1")
    resolve_rllm_settings(run)
    assert (run.backend.clip_ratio_low, run.backend.clip_ratio_high) == (0.1, 0.1)


@pytest.mark.parametrize(
    ("model_path", "dotlist", "want"),
    [
        # from scratch: 1e-3 for both; pretrained: 1e-5 for both (model_defaults.py)
        (None, [], {"backend.lr": 1e-3, "backend.critic.lr": 1e-3}),
        ("org/model", [], {"backend.lr": 1e-5, "backend.critic.lr": 1e-5}),
        # each rate is its own: the policy's given leaves the critic's at its default, and back
        (None, ["backend.lr=5e-4"], {"backend.lr": 5e-4, "backend.critic.lr": 1e-3}),
        ("org/model", ["backend.lr=2e-6"], {"backend.lr": 2e-6, "backend.critic.lr": 1e-5}),
        (None, ["backend.critic.lr=7e-4"], {"backend.lr": 1e-3, "backend.critic.lr": 7e-4}),
        ("org/model", ["backend.lr=2e-6", "backend.critic.lr=3e-6"], {"backend.lr": 2e-6, "backend.critic.lr": 3e-6}),
    ],
)
def test_each_learning_rate_is_its_own_value_or_its_own_default(model_path, dotlist, want):
    run = config(*dotlist, *([f"model.path={model_path}"] if model_path else []))
    assert learning_rates(run) == pytest.approx(want)
