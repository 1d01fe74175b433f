"""The command line's answer to a key of rLLM's backends names a key that exists here and means
the same (issue 50): ``trainer.total_training_steps`` (rLLM/verl: how many training steps) is
``rllm.trainer.total_batches`` (steps, each one batch), not ``total_epochs``; and every hint's
target is a setting the command line accepts."""

from __future__ import annotations

import re

import pytest

from rllm_torch.cli.command_line import check_command_line
from rllm_torch.core.errors import ConfigError
from rllm_torch.rllm.settings import walk
from rllm_torch.trainer.rllm_settings import RLLM_BACKEND_KEYS, key_hint
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
