"""rLLM's three examples of issue 48 train three steps on the tiny model with only the import prefix,
the Hydra config package, the backend name and the data changed: ``examples/countdown/unified_trainer/
train_countdown_unified_tinker.py``, ``examples/countdown/train_countdown.py`` and the solver-judge
workflow cookbook (``cookbooks/workflow/solver_judge/{train,solver_judge_flow}.py``), rLLM main 9beb6e0f.

Each port under examples/ is checked against rLLM's file: undoing those changes gives code whose
SHA-256 is that of rLLM's (recorded below from rLLM's files, module docstrings left out). The data is
rLLM's format and question text, registered by the ported ``prepare_countdown_data.py`` in rLLM's
registry layout under ``$RLLM_HOME``; rLLM's question (about 300 characters) does not fit the tiny
model's 32 positions, and the start-up error names ``model.max_positions`` with the value that fits."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: rLLM's file -> (its port here, SHA-256 of rLLM's code without its module docstring)
PORTS = {
    "examples/countdown/unified_trainer/train_countdown_unified_tinker.py": (
        "examples/rllm_countdown/train_countdown_unified.py",
        "afcb13587a1b412177d861e20f57404fd9a3b2c22a4505cece3b38ccd0da5dbf",
    ),
    "examples/countdown/train_countdown.py": (
        "examples/rllm_countdown/train_countdown.py",
        "62f8b7ab784d8c0f2ae3ad30cbd7fe40ac4fe573c7f7385c69e330a232b139e3",
    ),
    "cookbooks/workflow/solver_judge/train.py": (
        "examples/rllm_solver_judge/train.py",
        "0b8138a8534200d33d5dd92728b64cc5c363937b1985041853fb93880333fc46",
    ),
    "cookbooks/workflow/solver_judge/solver_judge_flow.py": (
        "examples/rllm_solver_judge/solver_judge_flow.py",
        "fc35824a7e1643a23a4d83b19577505c5a9d1399601d13e09eb13c51df54d1a8",
    ),
}

#: the tiny run: 3 steps of 4 prompts, short responses, the jsonl logger
TINY = [
    "rllm.trainer.total_batches=3",
    "rllm.rollout.max_new_tokens=12",
    "data.train_batch_size=4",
    "rllm.rollout.n_val=1",
    "rllm.trainer.logger=[jsonl]",
]


def _code(text: str) -> str:
    """A file's code under its module docstring."""
    return (text.split('"""', 2)[2] if text.startswith('"""') else text).lstrip("\n")


def _undo_port(text: str) -> str:
    """rLLM's text back from a port: the import prefix, the config package and the backend name."""
    return (
        text.replace("rllm_torch.compat.rllm.", "rllm.")
        .replace('backend="torch"', 'backend="tinker"')
        .replace('"backend", "torch"', '"backend", "tinker"')
    )


@pytest.mark.parametrize("theirs", sorted(PORTS))
def test_each_port_is_rllms_file_with_only_imports_config_package_and_backend_changed(theirs):
    ours, sha = PORTS[theirs]
    code = _code((ROOT / ours).read_text())
    assert "from rllm." not in code and "import rllm\n" not in code
    assert hashlib.sha256(_undo_port(code).encode()).hexdigest() == sha, f"{ours} differs from rLLM's {theirs}"


@pytest.fixture(scope="module")
def rllm_home(tmp_path_factory):
    """rLLM's home with the countdown splits registered by the ported prepare_countdown_data.py."""
    home = tmp_path_factory.mktemp("rllm_home")
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "rllm_countdown" / "prepare_countdown_data.py"), "64", "8"],
        env={**os.environ, "RLLM_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    registry = json.loads((home / "datasets" / "registry.json").read_text())
    assert {s: v["num_examples"] for s, v in registry["datasets"]["countdown"]["splits"].items()} == {
        "train": 64,
        "test": 8,
    }
    return home


def _train(script: str, home: Path, run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / script), f"hydra.run.dir={run_dir}", *overrides],
        cwd=(ROOT / script).parent,  # the solver-judge cookbook imports its flow module from its folder
        env={**os.environ, "RLLM_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if "actor/loss" in line]


def test_rllms_question_overflows_the_tiny_model_and_the_start_up_error_names_model_max_positions(rllm_home, tmp_path):
    done = _train("examples/rllm_countdown/train_countdown_unified.py", rllm_home, tmp_path, *TINY)
    assert done.returncode != 0 and not (tmp_path / "metrics.jsonl").exists()
    # rLLM's question for nums of one digit: 297 characters, one token each; + 12 new tokens = 309
    assert "model.max_positions=309 or more" in done.stderr


@pytest.mark.parametrize(
    "script",
    ["examples/rllm_countdown/train_countdown_unified.py", "examples/rllm_countdown/train_countdown.py"],
)
def test_rllms_countdown_examples_train_three_steps(rllm_home, tmp_path, script):
    done = _train(script, rllm_home, tmp_path, *TINY, "model.max_positions=320", "rllm.rollout.n=4")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = _rows(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["batch/termination_reason/error"] == 0.0 for r in rows)  # SimpleWorkflow's episodes ran
    assert all(r["groups/num_groups"] == 4.0 and r["groups/num_trajs_before_filter"] == 16.0 for r in rows)  # 4 x 4
    assert "val/countdown/pass@1" in done.stdout  # the rows' data_source names the validation metric


def test_rllms_solver_judge_cookbook_trains_three_steps_with_both_roles(rllm_home, tmp_path):
    done = _train(
        "examples/rllm_solver_judge/train.py",
        rllm_home,
        tmp_path,
        *TINY,
        "model.max_positions=1536",
        "rllm.rollout.n=2",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = _rows(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        # 4 tasks x 2 rollouts x (2 solver answers + 1 judge) = 24 trajectories, in 4 x 2 roles = 8 groups:
        # a solver group holds 2 x 2 = 4, a judge group 2 (average 24 / 8 = 3)
        assert (r["groups/num_trajs_before_filter"], r["groups/num_groups"]) == (24.0, 8.0)
        assert (r["groups/max_group_size"], r["groups/min_group_size"], r["groups/avg_group_size"]) == (4.0, 2.0, 3.0)
        assert "reward/solver/mean" in r and "reward/judge/mean" in r and "batch/judge_acc" in r


def test_a_dataset_the_registry_lacks_stops_at_start_up_naming_the_registry_and_how_to_fill_it(tmp_path):
    from trainer_fakes import make_config

    from rllm_torch.compat.rllm.data import DatasetRegistry
    from rllm_torch.compat.rllm.trainer import AgentTrainer
    from rllm_torch.compat.rllm.workflows.simple_workflow import SimpleWorkflow
    from rllm_torch.core.errors import ConfigError

    DatasetRegistry.set_dataset_dir(tmp_path / "datasets")
    try:
        train = DatasetRegistry.load_dataset("countdown", "train")  # None, as in rLLM
        with pytest.raises(ConfigError, match=rf"no training rows\. .*\({tmp_path / 'datasets'}\) lacks: register it"):
            AgentTrainer(config=make_config(tmp_path), workflow_class=SimpleWorkflow, train_dataset=train)
    finally:
        DatasetRegistry.set_dataset_dir(None)
