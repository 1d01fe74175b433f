"""SIGTERM, what schedulers and torchrun send before a kill: the run checkpoints the step it is in,
says so in one line, exits 143, and the same command continues it exactly (issue 29). Real
processes and real signals; every wait has a timeout."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from test_resume_after_kill import OVERRIDES, checkpoint_steps, metric_rows
from test_torchrun import ENV, LAUNCH_TIMEOUT_S, _workers, train

# a checkpoint every 16 steps: the one SIGTERM writes is not a periodic one
STOPPABLE = [o for o in OVERRIDES if not o.startswith("rllm.trainer.save_freq")] + ["rllm.trainer.save_freq=16"]


def command(run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "rllm_torch.train", *STOPPABLE, f"hydra.run.dir={run_dir}"]


def trained_steps(run_dir: Path) -> int:
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        return 0
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.endswith("}")]
    return max((r["step"] for r in rows if "actor/loss" in r), default=0)


def wait_for_step(process: subprocess.Popen, run_dir: Path, step: int) -> None:
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    while trained_steps(run_dir) < step and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert process.poll() is None, "the run ended before the signal"


def assert_continues_exactly(stopped_dir: Path, whole_dir: Path, stopped_at: int) -> None:
    whole_rows, resumed_rows = metric_rows(whole_dir), metric_rows(stopped_dir)
    assert [r["step"] for r in resumed_rows] == [r["step"] for r in whole_rows]  # nothing twice, nothing missing
    for whole_row, resumed_row in zip(whole_rows, resumed_rows, strict=True):
        assert resumed_row == whole_row, f"step {whole_row['step']} differs (stopped at {stopped_at})"


def test_sigterm_checkpoints_the_current_step_says_so_in_one_line_and_the_rerun_continues_exactly(tmp_path):
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    uninterrupted = subprocess.Popen(
        command(whole), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV
    )
    victim = subprocess.Popen(command(stopped), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
    wait_for_step(victim, stopped, 3)
    victim.send_signal(signal.SIGTERM)
    _, err = victim.communicate(timeout=60)
    assert victim.returncode == 143, err[-3000:]
    step = checkpoint_steps(stopped)[-1]
    assert 3 <= step < 16 and checkpoint_steps(stopped) == [step]  # not a periodic one: the stop wrote it
    assert trained_steps(stopped) == step  # the step it was in, nothing after it
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"rllm-torch-train: stopped by SIGTERM after step {step}, checkpoint "
        f"{stopped / 'checkpoints' / f'step_{step:06d}'}; the same command continues from it (exit 143)"
    )
    assert "SIGTERM received; stopping: the trained weights are written first, within seconds" in err

    resumed = subprocess.run(command(stopped), capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, env=ENV)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {stopped / 'checkpoints' / f'step_{step:06d}'}" in resumed.stdout
    assert uninterrupted.wait(timeout=LAUNCH_TIMEOUT_S) == 0, uninterrupted.stderr.read()[-3000:]
    assert_continues_exactly(stopped, whole, step)


def test_a_second_sigterm_does_not_cost_the_checkpoint_the_first_one_asked_for(tmp_path):
    """A scheduler that signals again (or twice at once) still gets the trained weights and 143
    (issue 43: the second signal used to end the process at once, losing every step since the last
    periodic checkpoint)."""
    victim = subprocess.Popen(command(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
    wait_for_step(victim, tmp_path, 17)  # past the periodic checkpoint of step 16
    victim.send_signal(signal.SIGTERM)
    victim.send_signal(signal.SIGTERM)
    _, err = victim.communicate(timeout=60)
    assert victim.returncode == 143, err[-3000:]
    step = checkpoint_steps(tmp_path)[-1]
    assert step > 16 and trained_steps(tmp_path) == step  # not the periodic one: every trained step is kept


def test_sigterm_to_torchrun_stops_every_rank_at_the_same_step_with_its_checkpoint(tmp_path):
    stopped = tmp_path / "stopped"
    launch = train(stopped, "rllm.trainer.save_freq=16", "rllm.trainer.total_epochs=2")  # 16 steps
    victim = subprocess.Popen(launch, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
    wait_for_step(victim, stopped, 3)
    assert len(_workers(victim.pid)) == 2
    victim.send_signal(signal.SIGTERM)  # torchrun passes it to both ranks and waits 30 s before SIGKILL
    output, _ = victim.communicate(timeout=90)
    assert victim.returncode != 0
    step = checkpoint_steps(stopped)[-1]
    assert 3 <= step < 16 and trained_steps(stopped) == step, output[-3000:]
    assert f"stopped by SIGTERM after step {step}" in output, output[-3000:]
    assert "SIGKILL" not in output  # both ranks ended within torchrun's grace period

    resumed = subprocess.run(launch, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, env=ENV)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {stopped / 'checkpoints' / f'step_{step:06d}'}" in resumed.stdout
