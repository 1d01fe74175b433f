"""The command line's answer to a key of rLLM's backends names a key that exists here and means
the same (issue 50): ``trainer.total_training_steps`` (rLLM/verl: how many training steps) is
``rllm.trainer.total_batches`` (steps, each one batch), not ``total_epochs``; and every hint's
target is a setting the command line accepts; in a ported ``@hydra.main`` script too."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf, open_dict

from rllm_torch.cli.command_line import check_command_line
from rllm_torch.core.errors import ConfigError
from rllm_torch.rllm.settings import walk
from rllm_torch.trainer.rllm_settings import RLLM_BACKEND_KEYS, drop_rllm_backend_keys, key_hint, resolve_rllm_settings
from rllm_torch.trainer.schema import TrainConfig

SETTINGS = {key for key, _, _ in walk(TrainConfig)}


def test_rllms_total_training_steps_is_answered_with_total_batches_which_counts_steps():
    with pytest.raises(ConfigError, match=r"did you mean rllm\.trainer\.total_batches\?") as refused:
        check_command_line(["trainer.total_training_steps=3"])
    assert "total_epochs" not in str(refused.value)
    assert "rllm.trainer.total_batches" in SETTINGS
    help_text = dict((k, s) for k, s, _ in walk(TrainConfig))["rllm.trainer.total_batches"].help
    assert "steps" in help_text  # it counts training steps, as rLLM's key does
    check_command_line(["rllm.trainer.total_batches=3"])  # and the hint's key is accepted as given


def _targets(text: str) -> list[str]:
    """The setting keys a hint names (``a / b``, a parenthesised note, or a command's flag)."""
    return [t.split(" (")[0] for t in text.split(" / ") if re.fullmatch(r"[a-z_]+(\.[a-z_0-9]+)+", t.split(" (")[0])]


@pytest.mark.parametrize("theirs", sorted(RLLM_BACKEND_KEYS))
def test_every_hint_names_a_setting_that_exists_here(theirs):
    text = RLLM_BACKEND_KEYS[theirs]
    if text.startswith("rllm-torch-torchrun"):  # a launcher's flag, not a setting
        return
    targets = _targets(text)
    assert targets, f"{theirs}: hint {text!r} names no setting"
    for key in targets:
        assert key in SETTINGS, f"{theirs}: hint names {key!r}, not a setting of the schema"


@pytest.mark.parametrize("prefix", ["", "+", "++", "~"])
@pytest.mark.parametrize(("theirs", "ours"), sorted(RLLM_BACKEND_KEYS.items())[:12])
def test_an_rllm_backend_key_gets_the_hint_naming_ours_with_any_of_hydras_prefixes(prefix, theirs, ours):
    hint = key_hint(f"{prefix}{theirs}=1")
    assert hint.startswith(f" (did you mean {ours}? {theirs} is a key of rLLM's backends")


def test_a_key_of_neither_gets_no_hint():
    assert key_hint("+backend.lrr=0.1") == "" and key_hint("actor_rollout_ref.actor.optim") == ""


# In a ported @hydra.main script (rLLM's examples: config_path="pkg://rllm_torch.compat.rllm.trainer.config"),
# Hydra composes the overrides before any of our code runs: a key of rLLM's backends gets the same hint as from
# rllm-torch-train, not Hydra's "Could not override" (issue 48).

ROOT = Path(__file__).resolve().parents[2]
COMPAT_CONFIGS = "rllm_torch.compat.rllm.trainer.config"


def _compose(config_name: str, *overrides: str):
    from hydra import compose, initialize_config_module

    from rllm_torch.cli.command_line import register_configs

    register_configs()
    with initialize_config_module(config_module=COMPAT_CONFIGS, version_base=None):
        return compose(config_name=config_name, overrides=list(overrides))


@pytest.mark.parametrize("config_name", ["unified", "agent_ppo_trainer"])
@pytest.mark.parametrize(
    ("override", "ours"),
    [
        ("training.learning_rate=2e-5", "backend.lr"),  # rLLM's tinker key
        ("+training.learning_rate=2e-5", "backend.lr"),
        ("model.lora_rank=32", "model.lora.r"),  # below a section of ours
        ("actor_rollout_ref.actor.optim.lr=1e-6", "backend.lr"),  # verl's
        ("rllm.backend=tinker", "backend.name"),
    ],
)
def test_a_ported_scripts_rllm_backend_key_composes_and_is_refused_with_the_hint_naming_ours(
    config_name, override, ours
):
    config = _compose(config_name, override)
    with pytest.raises(ConfigError, match=rf"did you mean {re.escape(ours)}\?") as refused:
        drop_rllm_backend_keys(config)
    key = override.lstrip("+").split("=")[0]
    assert str(refused.value).startswith(f"`{key}=") and "\n" not in str(refused.value)


@pytest.mark.parametrize("config_name", ["unified", "agent_ppo_trainer"])
def test_a_ported_scripts_config_without_them_is_the_run_config_once_their_places_are_dropped(config_name):
    from rllm_torch.cli.command_line import check_known_keys

    config = _compose(config_name, "rllm.rollout.n=4")
    assert config.rllm.get("backend", "torch") == "torch"  # the solver-judge cookbook's read of rLLM's key
    drop_rllm_backend_keys(config)
    check_known_keys(config)  # every key left is a setting
    assert "training" not in config and "lora_rank" not in config.model and "backend" not in config.rllm
    assert config.rllm.rollout.n == 4


def test_a_run_config_given_a_backend_key_by_other_means_is_refused_when_checked():
    config = OmegaConf.structured(TrainConfig)
    with open_dict(config):
        config.training = {"learning_rate": 2e-5}
    with pytest.raises(ConfigError, match=r"`training\.learning_rate=2e-05` .*did you mean backend\.lr\?"):
        resolve_rllm_settings(config)


def test_rllms_countdown_example_given_training_learning_rate_stops_with_the_hint_not_hydras_error(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "rllm_countdown" / "train_countdown_unified.py"),
            f"hydra.run.dir={tmp_path}",
            "training.learning_rate=2e-5",
        ],
        env={**os.environ, "RLLM_HOME": str(tmp_path / "rllm_home")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    assert "did you mean backend.lr?" in done.stderr and "Could not override" not in done.stderr
