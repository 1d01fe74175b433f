"""Async training at the edges of a run, with real processes and signals: kill -9, then the same
command (at staleness 0: what an uninterrupted run logs, exactly; at staleness 2: every step
once, none skipped), SIGTERM (the step it is in, its checkpoint, exit 143), and two ranks under
torchrun. Every wait has a timeout."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from test_resume_after_kill import OVERRIDES, checkpoint_steps, metric_rows
from test_sigterm import trained_steps, wait_for_step
from test_torchrun import ENV, LAUNCH_TIMEOUT_S, train

ASYNC = ["rllm.async_training.enable=true"]
AHEAD = [*ASYNC, "rllm.async_training.staleness_threshold=2"]


def command(run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "rllm_torch.train", *OVERRIDES, *extra, f"hydra.run.dir={run_dir}"]


def kill_after_checkpoint(run_dir: Path, *extra: str) -> int:
    victim = subprocess.Popen(command(run_dir, *extra), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    while not any(s >= 6 for s in checkpoint_steps(run_dir)) and victim.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=30) == -signal.SIGKILL, "the run finished before it could be killed"
    saved = checkpoint_steps(run_dir)
    assert saved and saved[-1] < 40
    return saved[-1]


def resume(run_dir: Path, step: int, *extra: str) -> None:
    resumed = subprocess.run(
        command(run_dir, *extra), capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, env=ENV
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {run_dir / 'checkpoints' / f'step_{step:06d}'}" in resumed.stdout


def test_kill_9_at_staleness_0_resumes_to_exactly_the_uninterrupted_run(tmp_path):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    uninterrupted = subprocess.Popen(
        command(whole, *ASYNC), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV
    )
    step = kill_after_checkpoint(killed, *ASYNC)
    resume(killed, step, *ASYNC)
    assert uninterrupted.wait(timeout=LAUNCH_TIMEOUT_S) == 0, uninterrupted.stderr.read()[-3000:]
    assert metric_rows(killed) == metric_rows(whole)


def test_kill_9_while_sampling_ahead_resumes_with_every_step_trained_once(tmp_path):
    step = kill_after_checkpoint(tmp_path, *AHEAD)
    # the checkpoint's data position is the batches trained (8 a epoch), not the ones sampled ahead
    saved = torch.load(tmp_path / "checkpoints" / f"step_{step:06d}" / "trainer.pt", weights_only=False)
    assert (saved["epoch"], saved["batch_in_epoch"]) == ((step - 1) // 8, (step - 1) % 8 + 1)
    resume(tmp_path, step, *AHEAD)
    rows = metric_rows(tmp_path)
    trained = [r for r in rows if "actor/loss" in r]
    assert [r["step"] for r in trained] == list(range(1, 41))  # nothing twice, nothing skipped
    assert all(r["async/staleness_max"] <= 2 for r in trained)
    assert all(r["groups/num_groups"] == 8 for r in trained)  # every batch's prompts, once
    assert max(r["async/staleness_max"] for r in trained) >= 1  # it did sample ahead


def test_sigterm_in_async_mode_checkpoints_the_step_it_is_in_and_the_rerun_finishes(tmp_path):
    extra = [*AHEAD, "rllm.trainer.save_freq=16"]
    victim = subprocess.Popen(
        command(tmp_path, *extra), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV
    )
    wait_for_step(victim, tmp_path, 3)
    victim.send_signal(signal.SIGTERM)
    _, err = victim.communicate(timeout=60)
    assert victim.returncode == 143, err[-3000:]
    step = checkpoint_steps(tmp_path)[-1]
    assert 3 <= step < 16 and trained_steps(tmp_path) == step and "Traceback" not in err
    resume(tmp_path, step, *extra)
    assert [r["step"] for r in metric_rows(tmp_path) if "actor/loss" in r] == list(range(1, 41))


def test_two_ranks_train_asynchronously_within_the_bound(tmp_path):
    done = subprocess.run(
        train(tmp_path / "run", *AHEAD, "rllm.trainer.total_epochs=2"),
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT_S,
        env=ENV,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "actor/loss" in r]
    assert [r["step"] for r in trained] == list(range(1, 17))
    assert all(r["groups/num_groups"] == 8 for r in trained)  # both ranks' shares, every step
    assert all(r["async/staleness_max"] <= 2 for r in trained)
    assert all(sum(r[f"async/staleness/{k}"] for k in range(3)) == 8 for r in trained)


def test_two_ranks_fill_a_dynamic_sampling_step_from_the_buffer(tmp_path):
    extra = ("rllm.algorithm.filter_groups.enable=true", "rllm.trainer.total_batches=3", "rllm.trainer.test_freq=0")
    done = subprocess.run(
        train(tmp_path / "run", *AHEAD, *extra), capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, env=ENV
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "actor/loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert max(r["batch/dynamic_sampling/gen_batches"] for r in steps) >= 2  # a step drew more batches
    for r in steps:  # 8 prompts a step, 4 per rank, the ranks drawing the same number of batches
        trained = 8 - r["batch/dynamic_sampling/prompts_short"]
        assert r["groups/num_groups"] == trained and r["batch/dynamic_sampling/prompts_with_signal"] >= trained
        drawn = sum(r[f"async/staleness/{k}"] for k in range(3))  # every group drawn, with signal or not
        assert drawn == 8 * r["batch/dynamic_sampling/gen_batches"] and r["async/staleness_max"] <= 2
