"""A task of the user's own through ``task=file``, as a new user writes it: the reverse-word task
with a partial-credit reward learns with no length setting (the response length comes from the
answers and the summary says so; the old default of 2 tokens could never write a 4-letter answer),
a length that cuts the answers is said once, naming the setting, and a reward returning
``resp == ans`` trains."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import warnings
from pathlib import Path

from hydra import compose, initialize_config_module

from rllm_torch.cli.command_line import register_configs
from rllm_torch.cli.train_command import run

PARTIAL = '''def score(task, response):
    """The share of the answer's letters in their place, over the longer of answer and response."""
    answer, response = task["answer"], response.strip()
    longest = max(len(answer), len(response))
    return sum(a == b for a, b in zip(answer, response)) / longest if longest else 1.0


def exact(task, response):
    return response.strip() == task["answer"]
'''


def reverse_words(tmp_path: Path, monkeypatch, count: int = 2048) -> list[str]:
    """4-letter words over abcd and their reverse (``{"prompt": "abcd=", "answer": "dcba"}``), and
    the rewards module; returns the file task's overrides."""
    rng = random.Random(0)
    words = ["".join(rng.choice("abcd") for _ in range(4)) for _ in range(count)]
    (tmp_path / "words.jsonl").write_text(
        "".join(json.dumps({"prompt": f"{w}=", "answer": w[::-1]}) + "\n" for w in words)
    )
    (tmp_path / "my_rewards.py").write_text(PARTIAL)
    monkeypatch.syspath_prepend(str(tmp_path))
    return ["task=file", f"task.train_path={tmp_path / 'words.jsonl'}", "task.reward_fn=my_rewards:score"]


def compose_train(*overrides: str):
    register_configs()
    with initialize_config_module(config_module="rllm_torch.configs", version_base=None):
        return compose(config_name="train", overrides=list(overrides))


def metric_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_reverse_word_task_with_a_partial_credit_reward_learns_with_no_length_setting(
    tmp_path, monkeypatch, capsys
):
    task = reverse_words(tmp_path, monkeypatch)
    run_dir = tmp_path / "run"
    run(
        compose_train(
            *task,
            "rllm.trainer.total_batches=30",
            "rllm.trainer.logger=[jsonl]",
            f"rllm.trainer.default_local_dir={run_dir}",
        )
    )
    out = capsys.readouterr().out
    assert "responses      at most 8 tokens (twice the longest answer's tokens (" in out  # 4 letters, said where from
    assert "character tokenizer (7 tokens: every character of the tasks' prompts and answers)" in out
    steps = [r for r in metric_rows(run_dir) if "batch/reward" in r]
    assert len(steps) == 30
    assert max(r["batch/reward"] for r in steps) > 0.2, [round(r["batch/reward"], 3) for r in steps]
    assert max(r["reward/solver/max"] for r in steps) == 1.0  # whole answers written: 2 tokens never could


def test_a_length_that_cuts_every_answer_is_said_once_naming_the_setting(tmp_path, monkeypatch):
    task = reverse_words(tmp_path, monkeypatch, count=64)
    overrides = [*task, "rllm.rollout.max_new_tokens=2", "data.train_batch_size=16", "rllm.trainer.total_batches=6"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(
            compose_train(
                *overrides, "rllm.trainer.logger=[jsonl]", f"rllm.trainer.default_local_dir={tmp_path / 'run'}"
            )
        )
    said = [str(w.message) for w in caught if "max_new_tokens" in str(w.message)]
    assert len(said) == 1, said
    assert (
        said[0].startswith("rllm.rollout.max_new_tokens=2: ")
        and "of the responses of the first 4 steps ended" in said[0]
    )
    assert "the longest answer (" in said[0] and "has 4 tokens; raise rllm.rollout.max_new_tokens" in said[0]


def test_a_new_users_reward_returning_resp_equals_ans_trains(tmp_path, monkeypatch):
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(5) for b in range(5)] * 4
    (tmp_path / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "my_rewards.py").write_text(PARTIAL)
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"} | {"PYTHONPATH": str(tmp_path)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rllm_torch.train",
            "task=file",
            f"task.train_path={tmp_path / 'sums.jsonl'}",
            f"task.val_path={tmp_path / 'sums.jsonl'}",
            "task.reward_fn=my_rewards:exact",  # return response.strip() == task["answer"]
            "data.train_batch_size=20",
            "rllm.trainer.total_batches=8",
            "rllm.trainer.logger=[jsonl]",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [r for r in metric_rows(tmp_path / "run") if "batch/reward" in r]
    assert len(steps) == 8 and max(r["reward/solver/max"] for r in steps) == 1.0  # True scored as 1.0
    assert "val/sums/pass@1" in done.stdout
