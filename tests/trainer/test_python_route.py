"""The README's Python route, ``UnifiedTrainer(TorchBackend, cfg, SingleTurnWorkflow, train, val,
workflow_args={"reward_fn": fn}).fit()``, on a task of the user's own with letters: the tiny
model's vocabulary and the response length come from the tasks (the letters were ``<unk>`` with
the arithmetic alphabet, and every reward 0), the summary says so, and it learns."""

from __future__ import annotations

import json

from omegaconf import OmegaConf

from rllm_torch import UnifiedTrainer
from rllm_torch.backends.torch_backend import TorchBackend
from rllm_torch.rollouts import SingleTurnWorkflow

LETTERS = "abcdefgh"


def test_the_python_route_trains_letters_with_a_reward_returning_a_bool(tmp_path, capsys):
    train = [{"prompt": f"{c}>", "answer": c} for c in LETTERS] * 4  # copy the letter
    val = [{"prompt": f"{c}>", "answer": c} for c in LETTERS]
    cfg = OmegaConf.create(
        {
            "data": {"train_batch_size": 32},
            "backend": {"lr": 0.003},
            "rllm": {
                "rollout": {"n": 4, "n_val": 1},
                "trainer": {
                    "total_batches": 40,
                    "test_freq": 40,
                    "logger": ["jsonl"],
                    "default_local_dir": str(tmp_path),
                },
            },
        }
    )
    trainer = UnifiedTrainer(
        TorchBackend,
        cfg,
        SingleTurnWorkflow,
        train,
        val,
        workflow_args={"reward_fn": lambda task, resp: resp == task["answer"]},
    )
    trainer.fit()
    summary = capsys.readouterr().out
    assert "character tokenizer (11 tokens: every character of the tasks' prompts and answers)" in summary
    assert "at most 2 tokens (twice the longest answer's tokens ('a': 1)" in summary
    assert "32 training prompts of your own (no data_source: their metrics are val/unknown/...)" in summary
    rewards = [json.loads(line).get("batch/reward") for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rewards = [r for r in rewards if r is not None]
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert len(rewards) == 40 and last > 0.08 and last > 4 * first, (first, last)  # measured: 0.017 -> 0.13
    assert trainer.val_history[-1][1]["val/unknown/pass@1"] > 0
