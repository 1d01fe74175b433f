"""rLLM's own tests of its trainer (``tests/unified_trainer`` of rLLM main 9beb6e0f and of its branch
``terminal-rl`` a5fa9aa1), run against the compatibility package with only the import prefix changed
(issue 48, item 7).

The files that pass on rLLM's own code and here are kept verbatim under tests/rllm_upstream (pytest runs
them); undoing the prefix change gives rLLM's file, by its SHA-256. The others import a module or a name of
rLLM's that is not mirrored here: each such import raises an ``ImportError`` of one line that says what
does the same here (the verl / tinker / fireworks modules: tests/rllm/test_rllm_port_names.py). rLLM's
``echo`` estimator and loss (``terminal-rl``) are here: tests/backends/test_echo.py."""

from __future__ import annotations

import hashlib
import importlib
import re
from pathlib import Path

import pytest

from rllm_torch.trainer.config_checks import check_run_config
from rllm_torch.trainer.schema import typed_run_config

UPSTREAM = Path(__file__).resolve().parents[1] / "rllm_upstream"

#: rLLM's file (tests/unified_trainer) -> (the ref it is from, its SHA-256). The branch's
#: test_algorithm_config.py is main's with four ECHO tests more.
VERBATIM = {
    "test_algorithm_config.py": (
        "branch terminal-rl a5fa9aa1",
        "1c05fee7999d5c02bbc92a7ff58103ba247b5e27fe4d234e3223b0dd868d0193",
    ),
    "test_termination_metrics.py": (
        "main 9beb6e0f",
        "993e576ce016db964018c0bafad745e10c2fb9d1e36d925a06cae2ff6e2dccdc",
    ),
}


def _undo_port(text: str) -> str:
    """rLLM's text back from a kept copy: the licence note above it and the import prefix."""
    lines = text.splitlines(keepends=True)
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    if lines and lines[0] == "\n":
        lines.pop(0)
    return (
        "".join(lines)
        .replace("rllm_torch.compat.rllm.", "rllm.")
        .replace('"../../rllm_torch/compat/rllm/', '"../../rllm/')
    )


@pytest.mark.parametrize("name", sorted(VERBATIM))
def test_each_kept_file_is_rllms_with_only_the_import_prefix_changed_and_names_its_licence(name):
    text, (ref, sha) = (UPSTREAM / name).read_text(), VERBATIM[name]
    assert text.startswith(f"# rLLM's tests/unified_trainer/{name} (https://github.com/rllm-org/rllm, {ref})")
    assert "Apache License 2.0" in text.split("\n\n", 1)[0]
    assert not re.search(r"^\s*(from|import) rllm\b", text, re.M)  # every import is the compat package's
    assert hashlib.sha256(_undo_port(text).encode()).hexdigest() == sha, f"{name} differs from rLLM's"


def _one_line_import_error(statement: str) -> str:
    with pytest.raises(ImportError) as raised:
        exec(statement, {})
    message = str(raised.value)
    assert "\n" not in message and not isinstance(raised.value, ModuleNotFoundError)
    return message


@pytest.mark.parametrize(
    ("module", "says"),
    [
        # test_config_table.py (rLLM's console tables): the brief's "fail with the ImportError" case
        ("trainer.algorithms.visualization", "start-up summary"),
        # test_buffer_refill_filtered.py, test_buffer_reward_metrics.py: its async trainer's internals
        ("trainer.buffer", "rllm.async_training.enable=true"),
        ("trainer.sync_coordinator", "rllm.async_training.enable=true"),
        ("trainer.metrics_aggregator", "rllm.async_training.enable=true"),
    ],
)
def test_rllms_modules_that_are_not_mirrored_raise_one_line_saying_what_does_the_same_here(module, says):
    with pytest.raises(ImportError) as raised:
        importlib.import_module(f"rllm_torch.compat.rllm.{module}")
    message = str(raised.value)
    assert "\n" not in message and not isinstance(raised.value, ModuleNotFoundError)
    assert message.startswith(f"rLLM's rllm.{module} is not mirrored in rllm_torch: ") and says in message


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("_enforce_async_train_batch_size", "rllm.async_training.mini_batch_size"),  # test_async_batch_size_override.py
        ("_detached_warm_queue", "Workflow"),  # test_warm_queue_wiring.py: sandboxes of agent flows
    ],
)
def test_rllms_private_trainer_helpers_raise_one_line_naming_the_difference(name, says):
    message = _one_line_import_error(f"from rllm_torch.compat.rllm.trainer.unified_trainer import {name}")
    assert message.startswith(f"rLLM's rllm.trainer.unified_trainer.{name} is not mirrored in rllm_torch: ")
    assert says in message


#: what test_custom_loss.py (terminal-rl) imports from rllm.trainer.algorithms.loss beyond register_loss and LossContext
TERMINAL_RL_LOSS_NAMES = [
    "RLLM_LOSS_REGISTRY",
    "ResolvedLoss",
    "resolve_loss",
    "get_loss",
    "is_custom_loss",
    "native_loss_names",
    "DEFAULT_LOSS_AGG_MODE",
    "offpolicy_metrics",
    "ppo_clip",
    "dppo_tv",
    "icepop",
    "cispo",
    "gspo",
    "reinforce",
    "reinforce_kl",
]


@pytest.mark.parametrize("name", TERMINAL_RL_LOSS_NAMES)
def test_terminal_rls_loss_module_names_that_are_not_mirrored_raise_one_line_naming_what_to_use(name):
    message = _one_line_import_error(f"from rllm_torch.compat.rllm.trainer.algorithms.loss import {name}")
    assert message.startswith(f"rLLM's rllm.trainer.algorithms.loss.{name} (branch terminal-rl) is not mirrored")
    assert "rllm.algorithm.loss_fn" in message and "register_loss" in message


def test_the_loss_modules_mirrored_names_still_import_and_an_unknown_one_is_an_attribute_error():
    from rllm_torch.compat.rllm.trainer.algorithms import loss
    from rllm_torch.core.losses import LossContext, register_loss

    assert (loss.register_loss, loss.LossContext) == (register_loss, LossContext)
    with pytest.raises(AttributeError):
        loss.no_such_name  # noqa: B018


def test_terminal_rls_echo_runs_with_its_loss_and_the_loss_module_has_it():
    from rllm_torch.compat.rllm.trainer.algorithms.loss import echo
    from rllm_torch.core.losses import echo_loss

    config = typed_run_config({"rllm": {"algorithm": {"adv_estimator": "echo"}}})
    checked = check_run_config(config)
    assert checked.plan.role("solver").loss.name == "echo" and echo is echo_loss
