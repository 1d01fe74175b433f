"""A stop inside an update of several optimizer steps (issue 52), and Ctrl-C as SIGTERM (issue 49):
real processes, real signals (sent by the run itself at a chosen moment, ``sigterm_at.py``), every
wait with a timeout. Each stopped run is started again with the same command and must end with the
metrics and exported weights of a run never stopped.

The runs: a tiny model, 3 steps of 8 rows (4 prompts, 2 rollouts) in mini-batches of 4 rows for 2
epochs, so each update takes 2 x 2 = 4 AdamW steps; no periodic checkpoint (every checkpoint of a
stopped run is the one its stop wrote).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_resume_after_kill import checkpoint_steps, metric_rows

HERE = Path(__file__).resolve().parent
TIMEOUT_S = 240
STOP_WITHIN_S = 60  # from the signal to the process's exit, on 2 loaded cores
OPTIMIZER_STEPS_PER_UPDATE = 4  # ceil(8 rows / mini_batch_size 4) mini-batches x 2 ppo_epochs
SETTINGS = [
    "model.num_layers=2",
    "model.hidden_size=32",
    "model.num_heads=2",
    "task.train_size=12",
    "task.val_size=0",
    "data.train_batch_size=4",
    "rllm.rollout.n=2",
    "rllm.trainer.total_batches=3",
    "rllm.trainer.save_freq=0",
    "rllm.trainer.logger=[jsonl]",
    "backend.num_threads=1",
    "backend.mini_batch_size=4",
    "backend.ppo_epochs=2",
    "backend.entropy_coeff=0.01",  # a gradient even when a group's rewards are all equal
    "imports=[sigterm_at]",
]


def command(run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "rllm_torch.train", *SETTINGS, f"hydra.run.dir={run_dir}"]


def environment(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH")]))
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, **extra}


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("whole")
    done = subprocess.run(command(run_dir), capture_output=True, text=True, timeout=TIMEOUT_S, env=environment())
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def stopped_run(run_dir: Path, stamp: Path, where: str, signal_name: str, times: int = 1) -> tuple[int, str]:
    """Run until the run's own signal ends it; (exit status, standard error)."""
    env = environment(SIGTERM_AT=where, SIGTERM_SIGNAL=signal_name, SIGTERM_TIMES=str(times), SIGTERM_STAMP=str(stamp))
    victim = subprocess.Popen(command(run_dir), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        _, err = victim.communicate(timeout=TIMEOUT_S)
    finally:
        victim.kill()
    assert time.time() - float(stamp.read_text()) < STOP_WITHIN_S
    return victim.returncode, err


def trained_steps(run_dir: Path) -> list[int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if "actor/loss" in r]


def assert_resumes_as_never_stopped(run_dir: Path, whole: Path, checkpoint: int) -> None:
    resumed = subprocess.run(command(run_dir), capture_output=True, text=True, timeout=TIMEOUT_S, env=environment())
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"from {run_dir / 'checkpoints' / f'step_{checkpoint:06d}'}" in resumed.stdout
    assert metric_rows(run_dir) == metric_rows(whole)  # every step once, with the same values
    assert files(run_dir / "checkpoints" / "final") == files(whole / "checkpoints" / "final")


def test_sigterm_after_the_first_of_several_optimizer_steps_finishes_the_update_and_checkpoints_the_step(
    whole, tmp_path
):
    """The weights, AdamW's moments and the schedule moved at the first step: the update runs to its
    end and its step is checkpointed as done (it was abandoned, its moved weights checkpointed as
    step 1, and the resumed run trained step 2 again on top of them)."""
    run_dir, stamp = tmp_path / "run", tmp_path / "signalled"
    status, err = stopped_run(run_dir, stamp, "optimizer_step:2", "SIGTERM")
    assert status == 143, err[-3000:]
    assert "Traceback" not in err
    assert Path(f"{stamp}.steps").read_text() == str(OPTIMIZER_STEPS_PER_UPDATE)  # the whole update ran
    assert checkpoint_steps(run_dir) == [2]
    assert trained_steps(run_dir) == [1, 2]
    assert err.strip().splitlines()[-1] == (
        f"rllm-torch-train: stopped by SIGTERM after step 2, checkpoint {run_dir / 'checkpoints' / 'step_000002'}; "
        "the same command continues from it (exit 143)"
    )
    assert_resumes_as_never_stopped(run_dir, whole, 2)


def test_ctrl_c_during_training_checkpoints_the_trained_weights_exits_130_and_the_rerun_continues_exactly(
    whole, tmp_path
):
    """Issue 49: Ctrl-C threw away every step since the last checkpoint; now it stops as SIGTERM does.
    The signal comes at the start of step 3's update: the step is abandoned, step 2 checkpointed."""
    run_dir, stamp = tmp_path / "run", tmp_path / "signalled"
    status, err = stopped_run(run_dir, stamp, "update:3", "SIGINT")
    assert status == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert checkpoint_steps(run_dir) == [2]  # written by the stop (no periodic checkpoint)
    assert trained_steps(run_dir) == [1, 2]
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-2:] == [
        "rllm-torch-train: SIGINT received; stopping: the trained weights are written first, within seconds "
        "(Ctrl-C again ends the run at once, losing what was trained since the newest checkpoint)",
        f"rllm-torch-train: stopped by SIGINT after step 2, checkpoint {run_dir / 'checkpoints' / 'step_000002'}; "
        "the same command continues from it (exit 130)",
    ]
    assert_resumes_as_never_stopped(run_dir, whole, 2)


def test_a_second_ctrl_c_ends_the_run_at_once_saying_what_is_lost(tmp_path):
    """The second SIGINT comes 10 ms after the first, at the start of step 3's update, before the
    stop reached a safe place: no checkpoint is written, and the line says what is lost."""
    run_dir, stamp = tmp_path / "run", tmp_path / "signalled"
    status, err = stopped_run(run_dir, stamp, "update:3", "SIGINT", times=2)
    assert status == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert checkpoint_steps(run_dir) == [] and trained_steps(run_dir) == [1, 2]  # two steps lost, as it says
    assert not list((run_dir / "checkpoints").glob(".tmp-*")) if (run_dir / "checkpoints").is_dir() else True
    assert err.strip().splitlines()[-1] == (
        "rllm-torch-train: interrupted again before the checkpoint was written: what was trained since the newest "
        "checkpoint is lost; the same command starts the run again from step 0 (no checkpoint yet)"
    )
