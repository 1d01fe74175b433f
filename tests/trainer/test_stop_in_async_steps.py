"""A SIGTERM during an async step loses nothing (issue 50): the producer samples the next batch
with the sampler's generator while the trainer updates, so a stop that abandoned the step without
putting back the producer's batches and versions would checkpoint a generator already past them,
and the resumed run would sample other episodes. Whatever the guard does with the step (finish
it, or abandon it and put everything back), the stopped-and-resumed run must log, metric for
metric, what the uninterrupted run logs, and end with the same weights. A real signal, sent by
the run's own update at step 2, in process (the run installs its SIGTERM handler)."""

from __future__ import annotations

import functools
import json
import os
import signal
from pathlib import Path

import pytest
from tiny_runs import TINY_STEPS
from trainer_fakes import make_config

from rllm_torch.backends.torch_backend.update import PolicyUpdater
from rllm_torch.cli.train_command import run
from rllm_torch.trainer.runtime.stop import TrainingStopped

ASYNC = (
    *TINY_STEPS,
    "rllm.trainer.total_batches=4",
    "backend.num_threads=1",
    "rllm.trainer.save_freq=0",  # every checkpoint of the stopped run is the one its stop wrote
    "backend.entropy_coeff=0.01",  # the weights move even where a group's rewards are all equal
)


def _rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def test_a_sigterm_in_an_async_update_then_the_same_run_again_is_the_uninterrupted_run(tmp_path, monkeypatch):
    settings = (*ASYNC, "rllm.async_training.enable=true", "rllm.async_training.staleness_threshold=0")
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    run(make_config(whole, *settings))

    original = PolicyUpdater.update

    @functools.wraps(original)
    async def update(self, state):
        if state.global_step == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # recorded by the run's handler; honoured at a safe place
        return await original(self, state)

    monkeypatch.setattr(PolicyUpdater, "update", update)
    with pytest.raises(TrainingStopped) as stop:
        run(make_config(stopped, *settings))
    assert stop.value.step in (1, 2) and stop.value.checkpoint is not None
    monkeypatch.setattr(PolicyUpdater, "update", original)
    run(make_config(stopped, *settings))

    trained = [r["step"] for r in _rows(stopped) if "actor/loss" in r]
    assert trained == [1, 2, 3, 4]  # nothing twice, nothing skipped
    assert [r for r in _rows(stopped) if "actor/loss" in r] == [r for r in _rows(whole) if "actor/loss" in r]
    weights = [(d / "checkpoints" / "final" / "model.safetensors").read_bytes() for d in (whole, stopped)]
    assert weights[0] == weights[1]
