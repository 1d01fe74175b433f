"""A stop request that reaches one rank only (a scheduler that signals one process, an operator's
``kill`` of one worker): every rank stops after the same step, with one checkpoint, and none is
left waiting at a collective. Real processes under torchrun; every wait has a timeout."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from test_resume_after_kill import checkpoint_steps
from test_sigterm import trained_steps, wait_for_step
from test_torchrun import ENV, LAUNCH_TIMEOUT_S, _workers, train


def _rank_of(pid: int) -> int:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return int(next(v for v in environ if v.startswith(b"RANK=")).split(b"=", 1)[1])


def test_sigterm_to_one_rank_stops_every_rank_at_the_same_step_with_its_checkpoint(tmp_path):
    stopped = tmp_path / "stopped"
    launch = train(stopped, "rllm.trainer.save_freq=16", "rllm.trainer.total_epochs=2")  # 16 steps
    victim = subprocess.Popen(launch, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
    try:
        wait_for_step(victim, stopped, 3)
        workers = {_rank_of(pid): pid for pid in _workers(victim.pid)}
        assert sorted(workers) == [0, 1]
        os.kill(workers[1], signal.SIGTERM)  # rank 1 alone: not the launcher, which would signal both
        output, _ = victim.communicate(timeout=90)  # a rank left at a collective would hang past this
    finally:
        victim.kill()
    step = checkpoint_steps(stopped)[-1]
    assert 3 <= step < 16 and checkpoint_steps(stopped) == [step], output[-3000:]  # the stop's checkpoint
    assert trained_steps(stopped) == step, output[-3000:]  # rank 0 logged no step after it
    assert f"stopped by SIGTERM after step {step}" in output, output[-3000:]
    assert "SIGKILL" not in output and "Timed out" not in output, output[-3000:]

    resumed = subprocess.run(launch, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, env=ENV)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {stopped / 'checkpoints' / f'step_{step:06d}'}" in resumed.stdout
