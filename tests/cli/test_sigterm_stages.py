"""A scheduler's SIGTERM at any stage of a pretrained model's run (a GGUF ``model.path``, its chat
template, the pretrained defaults): the trained weights are checkpointed first, the process exits
143 within seconds, and the same command finishes the run as if it had never stopped (issue 43).
Real processes and real signals, sent by the run itself at the start of the chosen stage
(``sigterm_at.py``); every wait has a timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gguf_files import write_llama_gguf
from test_resume_after_kill import checkpoint_steps, metric_rows

from rllm_torch.backends.torch_backend.pretrained import pretrained_dir

pytestmark = pytest.mark.skipif(
    any(__import__("importlib").util.find_spec(m) is None for m in ("gguf", "accelerate")),
    reason="the GGUF loader needs the gguf extra",
)

HERE = Path(__file__).resolve().parent
TIMEOUT_S = 240
STOP_WITHIN_S = 60  # the bound on 2 cores, from the signal to the process's exit
# 3 steps, validation at 0, 2 and 3 (the end of the run), no periodic checkpoint: every checkpoint
# of a stopped run is the one its stop wrote. Two prompts per generate call: a stop can land between calls.
SETTINGS = [
    "task=word_addition",
    "task.min_digits=1",
    "task.max_digits=1",
    "task.train_size=12",
    "task.val_size=4",
    "data.train_batch_size=4",
    "rllm.rollout.n=2",
    "rllm.rollout.n_val=1",
    "rllm.rollout.max_new_tokens=3",
    "backend.rollout_batch_size=2",
    "rllm.trainer.total_batches=3",
    "rllm.trainer.test_freq=2",
    "rllm.trainer.save_freq=0",
    "rllm.trainer.logger=[jsonl]",
    "backend.num_threads=1",
    "backend.micro_batch_tokens=64",  # several micro-batches: the update has places to stop at
    "backend.entropy_coeff=0.01",  # a gradient even when a group's rewards are all equal
    "imports=[sigterm_at]",
]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> list[str]:
    folder = tmp_path_factory.mktemp("gguf")
    write_llama_gguf(folder / "tiny-llama.gguf")
    # converted here, once: every run then loads the same directory (a run that converts in-process
    # computes its first steps' entropy a few float32 roundings apart, from another memory layout)
    pretrained_dir(folder / "tiny-llama.gguf", cache_dir=folder / "cache")
    return [f"model.path={folder / 'tiny-llama.gguf'}", f"model.gguf_cache_dir={folder / 'cache'}"]


def command(run_dir: Path, model: list[str]) -> list[str]:
    return [sys.executable, "-m", "rllm_torch.train", *SETTINGS, *model, f"hydra.run.dir={run_dir}"]


def environment(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, **extra}


@pytest.fixture(scope="module")
def whole(model, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("whole")
    done = subprocess.run(command(run_dir, model), capture_output=True, text=True, timeout=TIMEOUT_S, env=environment())
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


@pytest.mark.parametrize(
    ("where", "times", "checkpoint"),
    [
        ("sampling:3", 2, 2),  # the last step's sampling, two signals (a scheduler's second): step 2's weights
        ("update:3", 1, 2),  # the last step's update, before its optimizer step
        ("validation:2", 1, 2),  # a validation during the run: step 2 is trained, its validation redone
        ("validation:3", 1, 3),  # the final validation
        ("export", 2, 3),  # the checkpoints/final export
    ],
)
def test_sigterm_at_a_stage_checkpoints_the_trained_weights_exits_143_and_the_rerun_finishes_exactly(
    model, whole, tmp_path, where, times, checkpoint
):
    stamp = tmp_path / "signalled"
    run_dir = tmp_path / "run"
    victim = subprocess.Popen(
        command(run_dir, model),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(SIGTERM_AT=where, SIGTERM_TIMES=str(times), SIGTERM_STAMP=str(stamp)),
    )
    _, err = victim.communicate(timeout=TIMEOUT_S)
    ended = time.time()
    assert victim.returncode == 143, err[-3000:]
    assert ended - float(stamp.read_text()) < STOP_WITHIN_S
    assert "Traceback" not in err
    assert ("SIGTERM received; already stopping: the trained weights are being written" in err) is (times == 2)
    assert checkpoint_steps(run_dir) == [checkpoint]  # the stop wrote it (no periodic checkpoint)
    assert err.strip().splitlines()[-1] == (
        f"rllm-torch-train: stopped by SIGTERM after step {checkpoint}, checkpoint "
        f"{run_dir / 'checkpoints' / f'step_{checkpoint:06d}'}; the same command continues from it (exit 143)"
    )
    assert not (run_dir / "checkpoints" / "final").exists()
    assert not list((run_dir / "checkpoints").glob(".tmp-*"))
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in logged if "actor/loss" in r) == checkpoint  # nothing of an abandoned step

    resumed = subprocess.run(
        command(run_dir, model), capture_output=True, text=True, timeout=TIMEOUT_S, env=environment()
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"from {run_dir / 'checkpoints' / f'step_{checkpoint:06d}'}" in resumed.stdout
    assert metric_rows(run_dir) == metric_rows(whole)  # every step and validation once, with the same values
    assert files(run_dir / "checkpoints" / "final") == files(whole / "checkpoints" / "final")
