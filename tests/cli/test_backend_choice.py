"""Choosing a backend on the command line (issue 51, item 4): ``backend.name=`` (a registered name,
or ``package.module:Class``) is read before Hydra composes, so the ``backend`` section is the chosen
backend's own settings: ``examples/minimal_backend.py`` trains the default job's tiny run with only
``backend.name`` changed, its ``backend.lr`` reaches its optimiser, and a misspelt key of its
section stops the run at start-up naming the nearest one."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from tiny_runs import TINY

from rllm_torch.cli.command_line import check_command_line, register_configs
from rllm_torch.cli.train_command import run
from rllm_torch.core.errors import ConfigError, UnknownBackendError
from rllm_torch.trainer import backend_registry
from rllm_torch.trainer.backend_registry import typed_backend_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "examples.minimal_backend:MinimalBackend"


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch):
    """The example is imported afresh into a copy of the registry, for each test alone."""
    monkeypatch.setattr(backend_registry, "_BACKENDS", dict(backend_registry._BACKENDS))
    monkeypatch.syspath_prepend(str(ROOT))
    for name in ("examples.minimal_backend", "examples"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield
    register_configs()  # Hydra's schema back to the torch backend's, for the next test file


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m rllm_torch.train *args`` in ``tmp_path``, with the repository on the Python path."""
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"} | {"PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "rllm_torch.train", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )


def test_the_example_backend_trains_with_only_backend_name_changed_and_reads_its_own_lr(tmp_path):
    done = cli(tmp_path, f"backend.name={EXAMPLE}", "backend.lr=0.0123", *TINY, "hydra.run.dir=run")
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / "run"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if "actor/pg_loss" in row]
    # TINY: 16 training prompts in batches of 8, one epoch: 2 steps
    assert [row["step"] for row in steps] == [1, 2]
    assert all(math.isfinite(row["actor/pg_loss"]) and math.isfinite(row["actor/grad_norm"]) for row in steps)
    assert [row["actor/lr"] for row in steps] == [0.0123, 0.0123]  # the override, read from the optimiser
    section = OmegaConf.load(run_dir / "config.yaml").backend  # the example's four settings, no torch key
    assert OmegaConf.to_container(section) == {"name": EXAMPLE, "lr": 0.0123, "optimizer": "adamw", "seed": 0}
    assert f"backend        {EXAMPLE} (MinimalBackend)" in done.stdout


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("backend.lrr=0.1", "`backend.lrr` (given on the command line) is not a setting of rllm-torch-train; did you "
         "mean `backend.lr`? A run reads only the keys of its schema (rllm_torch/trainer/schema.py; its backend "
         "section: examples.minimal_backend.MinimalSettings), so an unknown one would be ignored"),
        ("backend.ppo_epochs=2", "`backend.ppo_epochs` (given on the command line) is not a setting of "
         "rllm-torch-train"),  # the torch backend's key: not this section's
        ("backend.optimizer=adam", "backend.optimizer='adam' is not one of ('adamw', 'sgd')."),
    ],
)  # fmt: skip
def test_a_wrong_key_or_value_of_the_example_backends_section_stops_the_run_at_start_up(tmp_path, override, message):
    done = cli(tmp_path, f"backend.name={EXAMPLE}", override, *TINY, "hydra.run.dir=run")
    assert done.returncode == 2, done.stderr[-3000:]
    assert message in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_backend_registered_by_a_module_of_imports_is_chosen_by_its_name():
    with pytest.raises(UnknownBackendError, match=r"^backend.name='minimal' is not a registered backend\. "):
        check_command_line(["backend.name=minimal"])  # before the module that registers it is imported
    check_command_line(["backend.name=minimal", "imports=[examples.minimal_backend]", "backend.optimizer=sgd"])


def test_a_backend_named_in_a_config_file_finds_the_torch_section_and_says_to_name_it_on_the_command_line(tmp_path):
    register_configs()  # what a config file composes over: the torch backend's section
    with initialize_config_module(config_module="rllm_torch.configs", version_base=None):
        config = compose(config_name="train", overrides=[f"backend.name={EXAMPLE}", f"hydra.run.dir={tmp_path}"])
    with pytest.raises(ConfigError, match="the run config's backend section is typed BackendConfig and this "
                       "backend's settings are MinimalSettings: .* backend.name=... on the command line"):  # fmt: skip
        run(config)


def test_the_example_builds_its_optimiser_from_its_section_and_refuses_what_it_does_not_implement():
    from examples.minimal_backend import MinimalBackend

    tasks = [{"prompt": "1+2=", "answer": "3"}]
    config = typed_backend_config({"backend": {"optimizer": "sgd", "lr": 0.25}}, MinimalBackend)
    backend = MinimalBackend(config, tasks=tasks)
    assert isinstance(backend.optimizer, torch.optim.SGD) and backend.optimizer.param_groups[0]["lr"] == 0.25
    assert config.rllm.rollout.max_new_tokens == 2  # twice the one-character answer: the run records it
    backend.validate_config()
    refused = typed_backend_config(
        {"rllm": {"algorithm": {"loss_fn": "cispo"}, "rollout": {"top_p": 0.9}}}, MinimalBackend
    )
    with pytest.raises(ConfigError) as raised:
        MinimalBackend(refused, tasks=tasks).validate_config()
    assert str(raised.value) == (
        "the minimal backend does not implement rllm.algorithm.loss_fn (its loss is REINFORCE's); rllm.rollout.top_p / "
        "val_top_p below 1: use backend.name=torch."
    )
