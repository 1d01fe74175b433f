"""A run killed with SIGKILL and started again with the same command continues from its last
checkpoint and logs exactly what an uninterrupted run logs (CPU, fixed seed, one torch thread)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

# 5 epochs of 8 batches (40 steps), a checkpoint every 3 steps, validation every 5: the epoch
# boundary, the shuffled order, validation's sampling and the optimizer all cross the restart.
OVERRIDES = [
    "task.train_size=64",
    "task.val_size=8",
    "data.train_batch_size=8",
    "rllm.rollout.n=4",
    "model.hidden_size=32",
    "rllm.trainer.total_epochs=5",
    "rllm.trainer.save_freq=3",
    "rllm.trainer.test_freq=5",
    "rllm.trainer.max_checkpoints_to_keep=2",
    "rllm.trainer.logger=[jsonl]",
    "backend.device=cpu",
    "backend.num_threads=1",
    "rllm.algorithm.lr_schedule=linear",
]


def train_command(run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "rllm_torch.train", *OVERRIDES, f"hydra.run.dir={run_dir}"]


def metric_rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl rows without the timing metrics (the only ones that may differ)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]


def checkpoint_steps(run_dir: Path) -> list[int]:
    root = run_dir / "checkpoints"
    return (
        sorted(int(p.name[5:]) for p in root.glob("step_*") if (p / "manifest.json").exists()) if root.is_dir() else []
    )


def test_a_run_killed_with_sigkill_resumes_and_logs_what_an_uninterrupted_run_logs(tmp_path):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    uninterrupted = subprocess.Popen(
        train_command(whole), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
    )
    victim = subprocess.Popen(train_command(killed), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 120
    while (
        not any(step >= 6 for step in checkpoint_steps(killed))
        and victim.poll() is None
        and time.monotonic() < deadline
    ):
        time.sleep(0.005)
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=30) == -signal.SIGKILL, "the run finished before it could be killed"
    saved = checkpoint_steps(killed)
    assert saved and saved[-1] < 40

    resumed = subprocess.run(train_command(killed), capture_output=True, text=True, timeout=180, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {killed / 'checkpoints' / f'step_{saved[-1]:06d}'}" in resumed.stdout
    assert uninterrupted.wait(timeout=180) == 0, uninterrupted.stderr.read()[-3000:]

    whole_rows, resumed_rows = metric_rows(whole), metric_rows(killed)
    assert [r["step"] for r in resumed_rows] == [r["step"] for r in whole_rows]  # no duplicates, nothing missing
    after = [(w, r) for w, r in zip(whole_rows, resumed_rows, strict=True) if w["step"] > saved[-1]]
    assert len(after) >= 30
    for whole_row, resumed_row in after:
        assert resumed_row == whole_row, f"step {whole_row['step']} differs after resuming"
    assert checkpoint_steps(killed) == checkpoint_steps(whole) == [39, 40]  # pruned to the newest two
    final_whole = torch.load(whole / "checkpoints" / "step_000040" / "backend.pt", weights_only=False)["model"]
    final_resumed = torch.load(killed / "checkpoints" / "step_000040" / "backend.pt", weights_only=False)["model"]
    assert all(torch.equal(final_whole[k], final_resumed[k]) for k in final_whole)
