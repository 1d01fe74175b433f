"""A reward function that hangs, in a real training run: with ``rllm.workflow.reward_timeout_s``
the run goes on (``raise_on_error=false``) and its metrics count the timed-out episodes, or it
stops with one error naming the setting; it does not stall in silence (issue 29)."""

from __future__ import annotations

import json

import pytest
from tiny_runs import TINY
from trainer_fakes import make_config

from rllm_torch.cli.train_command import run
from rllm_torch.core.errors import WorkflowError

REWARDS = """
import time

def hangs_on_sevens(task, response):
    if "7" in task["prompt"]:
        time.sleep(600)  # a verifier stuck on a dead server
    return float(response.strip() == task["answer"])
"""


@pytest.fixture
def hanging_task(tmp_path, monkeypatch):
    (tmp_path / "hanging_rewards.py").write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4, 8)]  # 4 of 16 hang
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [
        "task.name=file",
        f"task.train_path={tmp_path / 'train.jsonl'}",
        "task.val_size=0",
        "task.reward_fn=hanging_rewards:hangs_on_sevens",
        "rllm.rollout.max_new_tokens=2",
        "rllm.workflow.reward_timeout_s=0.2",
        "rllm.workflow.retry_limit=1",
        "rllm.trainer.total_batches=2",
    ]


def test_a_hung_reward_is_a_counted_timeout_episode_and_the_run_goes_on(tmp_path, hanging_task, capsys):
    run(make_config(tmp_path / "run", *TINY, *hanging_task, "rllm.workflow.raise_on_error=false"))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "batch/termination_reason/timeout" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert [r["batch/termination_reason/timeout"] for r in steps] == [0.25, 0.25]  # the 2 of 8 prompts with a 7
    assert (tmp_path / "run" / "checkpoints" / "final" / "config.json").is_file()


def test_a_hung_reward_stops_the_run_with_an_error_naming_the_setting(tmp_path, hanging_task):
    with pytest.raises(WorkflowError, match=r"reward_fn did not return within rllm.workflow.reward_timeout_s=0.2 s"):
        run(make_config(tmp_path / "run", *TINY, *hanging_task))
