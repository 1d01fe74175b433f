"""UnifiedWorkflowEngine and SingleTurnWorkflow with a fake rollout engine."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import numpy as np
import pytest
import torch

from rllm_torch import TerminationReason, WorkflowError
from rllm_torch.core import GroupedRewards, grpo
from rllm_torch.core.errors import ConfigError
from rllm_torch.rollouts import SingleTurnWorkflow
from rllm_torch.trainer import EpisodeLogger, ModelOutput, RolloutEngine, UnifiedWorkflowEngine, unbiased_pass_at_k
from rllm_torch.trainer.logs.step_metrics import workflow_metrics
from rllm_torch.trainer.workflow import MAX_REWARD, REWARD_THREADS


class EchoEngine(RolloutEngine):
    """Answers every prompt with its last character; records the peak number of waiting calls."""

    def __init__(self):
        self.active = self.peak = 0

    async def generate(self, prompt):
        self.active += 1
        self.peak = max(self.peak, self.active)
        await asyncio.sleep(0)
        self.active -= 1
        return ModelOutput(
            text=prompt[-1], prompt_ids=[1], completion_ids=[2, 0], logprobs=[-0.5, -0.1], finish_reason="stop"
        )


def exact(task, response):
    return float(response == task["answer"])


def run(engine, tasks):
    return asyncio.run(engine.execute_tasks(tasks, [f"t{i}" for i in range(len(tasks))]))


def test_single_turn_episodes_carry_reward_correctness_ids_and_data_source():
    engine = UnifiedWorkflowEngine(SingleTurnWorkflow, {"reward_fn": exact}, EchoEngine(), n_parallel_tasks=2)
    episodes = run(engine, [{"prompt": "a7", "answer": "7", "data_source": "s"}, {"prompt": "a7", "answer": "8"}])
    assert [e.is_correct for e in episodes] == [True, False]
    assert [e.trajectories[0].reward for e in episodes] == [1.0, 0.0]
    assert episodes[0].id == "t0:0" and episodes[0].info["data_source"] == "s"
    assert episodes[0].termination_reason is TerminationReason.ENV_DONE


def test_no_more_than_n_parallel_tasks_episodes_run_at_once():
    rollout = EchoEngine()
    engine = UnifiedWorkflowEngine(SingleTurnWorkflow, {"reward_fn": exact}, rollout, n_parallel_tasks=3)
    run(engine, [{"prompt": "x1", "answer": "1"}] * 10)
    assert rollout.peak == 3


def test_a_reward_function_that_raises_is_retried_then_raised():
    calls = []

    def broken(task, response):
        calls.append(1)
        raise KeyError("no answer")

    engine = UnifiedWorkflowEngine(SingleTurnWorkflow, {"reward_fn": broken}, EchoEngine(), retry_limit=3)
    with pytest.raises(WorkflowError, match="failed 3 time") as info:
        run(engine, [{"prompt": "x1"}])
    assert isinstance(info.value.__cause__, KeyError) and len(calls) == 3


def test_a_reward_function_that_raises_is_recorded_as_an_error_episode_when_not_raising():
    engine = UnifiedWorkflowEngine(
        SingleTurnWorkflow, {"reward_fn": lambda t, r: 1 / 0}, EchoEngine(), retry_limit=2, raise_on_error=False
    )
    (episode,) = run(engine, [{"prompt": "x1"}])
    assert episode.termination_reason is TerminationReason.ERROR and not episode.trajectories
    assert "ZeroDivisionError" in episode.info["error"] and episode.task_id == "t0"


def test_a_reward_that_is_not_a_number_fails_the_episode():
    engine = UnifiedWorkflowEngine(SingleTurnWorkflow, {"reward_fn": lambda t, r: "yes"}, EchoEngine(), retry_limit=1)
    with pytest.raises(WorkflowError, match="return a float"):
        run(engine, [{"prompt": "x1"}])


@pytest.mark.parametrize(
    ("returned", "reward"),
    [
        (lambda t, r: r == t["answer"], 1.0),  # the most common first reward: `return resp == ans`
        (lambda t, r: r != t["answer"], 0.0),
        (lambda t, r: np.array([1, 7])[0] == 1, 1.0),  # numpy's bool
        (lambda t, r: np.False_, 0.0),
        (lambda t, r: np.int64(1), 1.0),
        (lambda t, r: np.float32(0.5), 0.5),
        (lambda t, r: 1, 1.0),
    ],
)
def test_a_reward_returning_a_bool_or_a_numpy_number_scores_it_as_a_float(returned, reward):
    engine = UnifiedWorkflowEngine(SingleTurnWorkflow, {"reward_fn": returned}, EchoEngine(), retry_limit=1)
    (episode,) = run(engine, [{"prompt": "a7", "answer": "7"}])
    value = episode.trajectories[0].reward
    assert type(value) is float and value == reward and episode.is_correct == (reward == 1.0)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 1e30, -2e15])
def test_a_reward_that_is_not_finite_or_too_large_for_float32_statistics_fails_the_episode_naming_it(value):
    engine = UnifiedWorkflowEngine(SingleTurnWorkflow, {"reward_fn": lambda t, r: value}, EchoEngine(), retry_limit=1)
    with pytest.raises(
        WorkflowError, match=r"reward_fn returned .* for task 't0:0'; rewards must be finite and at most 1e\+15"
    ):
        run(engine, [{"prompt": "x1"}])


def test_a_reward_of_the_largest_accepted_magnitude_trains_and_keeps_its_group_statistics_finite():
    engine = UnifiedWorkflowEngine(SingleTurnWorkflow, {"reward_fn": lambda t, r: MAX_REWARD}, EchoEngine())
    assert run(engine, [{"prompt": "x1"}])[0].trajectories[0].reward == MAX_REWARD
    rewards_GK = torch.tensor([[MAX_REWARD, -MAX_REWARD, 0.0, 1.0] * 64])  # a group of 256 at the bound
    advantages, _ = grpo(GroupedRewards.from_padded(rewards_GK))
    assert torch.isfinite(advantages).all() and advantages[0] > 1 and advantages[1] < -1
    over, _ = grpo(GroupedRewards.from_padded(rewards_GK * 1e5))  # 1e20: float32 statistics overflow
    assert not (over.abs() > 0).any()  # every advantage 0 (or NaN): why the bound exists


def test_a_reward_past_its_time_limit_fails_the_attempt_is_retried_and_then_raised_naming_the_setting():
    calls, release = [], threading.Event()

    def hangs(task, response):
        calls.append(1)
        release.wait(30)  # "forever", but a test must end: released below
        return 1.0

    engine = UnifiedWorkflowEngine(
        SingleTurnWorkflow, {"reward_fn": hangs}, EchoEngine(), retry_limit=2, reward_timeout_s=0.05
    )
    try:
        with pytest.raises(WorkflowError, match=r"failed 2 time.*rllm.workflow.reward_timeout_s=0.05 s"):
            run(engine, [{"prompt": "x1", "answer": "1"}])
    finally:
        release.set()
    assert len(calls) == 2


def test_the_time_limit_counts_from_when_a_worker_starts_the_call_not_from_the_queue():
    calls = []

    def quick(task, response):  # 0.1 s, far inside the limit; 60 at once queue for the few workers
        calls.append(1)
        time.sleep(0.1)
        return 1.0

    engine = UnifiedWorkflowEngine(
        SingleTurnWorkflow, {"reward_fn": quick}, EchoEngine(), n_parallel_tasks=64, retry_limit=1, reward_timeout_s=0.5
    )
    episodes = run(engine, [{"prompt": "x1", "answer": "1"}] * (10 * REWARD_THREADS.size))
    assert {e.termination_reason for e in episodes} == {TerminationReason.ENV_DONE}  # none timed out in the queue
    assert len(calls) == 10 * REWARD_THREADS.size  # each called once: no retries, no stray queued calls


def test_with_raise_on_error_false_a_timed_out_reward_is_a_timeout_episode_counted_in_the_metrics():
    release = threading.Event()

    def slow_on_b(task, response):
        if task["prompt"] == "b1":
            release.wait(30)
        return exact(task, response)

    engine = UnifiedWorkflowEngine(
        SingleTurnWorkflow,
        {"reward_fn": slow_on_b},
        EchoEngine(),
        retry_limit=1,
        raise_on_error=False,
        reward_timeout_s=0.05,
    )
    try:
        episodes = run(engine, [{"prompt": "a1", "answer": "1"}, {"prompt": "b1", "answer": "1"}])
    finally:
        release.set()
    assert [e.termination_reason for e in episodes] == [TerminationReason.ENV_DONE, TerminationReason.TIMEOUT]
    assert "reward_timeout_s" in episodes[1].info["error"] and episodes[0].trajectories[0].reward == 1.0
    metrics = workflow_metrics(episodes, prefix="batch")
    assert metrics["batch/termination_reason/timeout"] == 0.5 and metrics["batch/termination_reason/error"] == 0.0


def test_rewards_run_in_threads_so_a_waiting_verifier_does_not_block_the_others():
    both = threading.Barrier(2, timeout=10)  # passes only when two calls wait at once

    def waits_for_the_other(task, response):
        both.wait()
        return exact(task, response)

    engine = UnifiedWorkflowEngine(SingleTurnWorkflow, {"reward_fn": waits_for_the_other}, EchoEngine())
    episodes = run(engine, [{"prompt": "a1", "answer": "1"}, {"prompt": "b2", "answer": "2"}])
    assert [e.trajectories[0].reward for e in episodes] == [1.0, 1.0]


@pytest.mark.parametrize("limit", [0, -1.0, float("nan")])
def test_a_reward_time_limit_that_is_not_positive_is_refused(limit):
    with pytest.raises(ConfigError, match="rllm.workflow.reward_timeout_s"):
        UnifiedWorkflowEngine(SingleTurnWorkflow, {"reward_fn": exact}, EchoEngine(), reward_timeout_s=limit)


def test_episodes_are_logged_as_json_lines(tmp_path):
    engine = UnifiedWorkflowEngine(
        SingleTurnWorkflow, {"reward_fn": exact}, EchoEngine(), episode_logger=EpisodeLogger(str(tmp_path))
    )
    engine.set_training_step(3, mode="train")
    run(engine, [{"prompt": "x1", "answer": "1"}] * 2)
    rows = [json.loads(line) for line in (tmp_path / "episodes" / "train_step_3.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["t0:0", "t1:0"] and rows[0]["trajectories"][0]["reward"] == 1.0


def test_pass_at_k_is_the_unbiased_estimator():
    assert unbiased_pass_at_k(5, 0, 2) == 0.0 and unbiased_pass_at_k(5, 5, 1) == 1.0
    assert unbiased_pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    with pytest.raises(ValueError):
        unbiased_pass_at_k(1, 0, 2)
