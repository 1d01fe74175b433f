"""rLLM's workflow surface: a workflow written rLLM's way (agents, ``commit``, ``TerminationEvent``,
``get_model_response``, ``Step(model_output=...)``) runs in the workflow engine and gives rLLM's
episode (trajectory rewards, correctness, metrics, termination reason); ``SimpleWorkflow`` reads
rLLM's task keys and reward outputs; a step whose episodes all failed says so every step."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from rllm_torch.core.errors import ConfigError, WorkflowError
from rllm_torch.rllm.types import Action, Episode, Step, TerminationReason, Trajectory
from rllm_torch.rollouts.simple import SimpleWorkflow
from rllm_torch.trainer.pipeline.step_warnings import FailedSteps
from rllm_torch.trainer.ranks import RunRanks
from rllm_torch.trainer.workflow import BaseAgent, ModelOutput, RewardOutput, RolloutEngine, TerminationEvent, Workflow
from rllm_torch.trainer.workflow_engine import UnifiedWorkflowEngine


class Scripted(RolloutEngine):
    """Answers with the next scripted text (its tokens: one per character), recording the prompts."""

    def __init__(self, answers, finish="stop"):
        self.answers, self.finish, self.prompts = list(answers), finish, []

    async def generate(self, prompt):
        self.prompts.append(list(prompt) if isinstance(prompt, list) else prompt)  # as it was asked
        text = self.answers[(len(self.prompts) - 1) % len(self.answers)]
        return ModelOutput(
            text=text,
            prompt_ids=[1, 2],
            completion_ids=[3] * len(text),
            logprobs=[-0.5] * len(text),
            finish_reason=self.finish,
        )


def run(engine: UnifiedWorkflowEngine, tasks):
    return asyncio.run(engine.execute_tasks(tasks, [f"t{i}" for i in range(len(tasks))], [0] * len(tasks)))


class TwoTurnAgent(BaseAgent):
    def __init__(self):
        self._trajectory = Trajectory(name="solver")

    def reset(self):
        self._trajectory = Trajectory(name="solver")

    @property
    def trajectory(self):
        return self._trajectory


class RllmStyleWorkflow(Workflow):
    """Two turns with step rewards 0.25 and 0.5, ended by a TerminationEvent (rLLM's style)."""

    def __init__(self, rollout_engine, **kwargs):
        super().__init__(rollout_engine, **kwargs)
        self.agent = TwoTurnAgent()

    async def run(self, task, uid, **kwargs):
        messages = [{"role": "user", "content": task["question"]}]
        for reward in (0.25, 0.5):
            output = await self.rollout_engine.get_model_response(messages, application_id=uid)
            messages.append({"role": "assistant", "content": output.content})
            self.agent.trajectory.steps.append(
                Step(chat_completions=list(messages), model_output=output, action=Action(output.content), reward=reward)
            )
        self.commit(agent=self.agent, reset=True)
        raise TerminationEvent(TerminationReason.ENV_DONE)


def test_a_workflow_written_rllm_way_gives_rllm_episode():
    engine = UnifiedWorkflowEngine(RllmStyleWorkflow, {}, Scripted(["ab", "c"]), n_parallel_tasks=2)
    (episode,) = run(engine, [{"question": "q?"}])
    (trajectory,) = episode.trajectories
    # rLLM's postprocess: the trajectory reward is the sum of its steps' (.75); correct when > 0
    assert trajectory.reward == 0.75 and episode.is_correct
    assert episode.termination_reason is TerminationReason.ENV_DONE
    assert episode.metrics == {"solver_acc": 0.75}
    assert (episode.id, episode.task_id) == ("t0:0", "t0")
    # the steps took their ids and log-probs from model_output; the chat reached the engine as messages
    assert [s.response_ids for s in trajectory.steps] == [[3, 3], [3]]
    assert [len(s.logprobs) for s in trajectory.steps] == [2, 1]
    assert engine.rollout_engine.prompts[0] == [{"role": "user", "content": "q?"}]


class ReturnsNone(Workflow):
    async def run(self, task, uid, **kwargs):
        self.commit(trajectory=Trajectory(name="s", steps=[Step(response_ids=[1], reward=1.0)]))


def test_a_run_that_returns_none_is_an_unknown_termination_of_what_was_committed():
    (episode,) = run(UnifiedWorkflowEngine(ReturnsNone, {}, Scripted(["x"])), [{"prompt": "p"}])
    assert episode.termination_reason is TerminationReason.UNKNOWN and episode.trajectories[0].reward == 1.0


def test_simple_workflow_reads_rllm_task_keys_and_reward_outputs():
    def reward(task, action):
        assert isinstance(action, Action)
        return RewardOutput(reward=float(action.action == task["ground_truth"]), is_correct=True)

    engine = UnifiedWorkflowEngine(
        SimpleWorkflow, {"reward_function": reward}, Scripted(["7", "8"]), n_parallel_tasks=1
    )
    tasks = [{"question": "3+4", "ground_truth": "7"}, {"problem": "4+4", "ground_truth": "7"}]
    first, second = run(engine, tasks)
    assert [first.trajectories[0].reward, second.trajectories[0].reward] == [1.0, 0.0]
    assert first.termination_reason is TerminationReason.ENV_DONE and first.is_correct and not second.is_correct
    step = first.trajectories[0].steps[0]
    assert step.chat_completions[-1]["content"] == "7" and step.model_response == "7"
    assert engine.rollout_engine.prompts == [[{"role": "user", "content": "3+4"}], [{"role": "user", "content": "4+4"}]]


def test_simple_workflow_ends_a_response_cut_at_the_length_limit_as_rllm():
    engine = UnifiedWorkflowEngine(
        SimpleWorkflow, {"reward_function": lambda t, a: 0.0}, Scripted(["1"], finish="length")
    )
    (episode,) = run(engine, [{"prompt": "p"}])
    assert episode.termination_reason is TerminationReason.MAX_RESPONSE_LENGTH_EXCEEDED


@pytest.mark.parametrize("value, expected", [(True, 1.0), (False, 0.0), (np.bool_(True), 1.0), (np.int64(3), 3.0)])
def test_a_reward_may_be_a_bool_or_a_numpy_number(value, expected):
    engine = UnifiedWorkflowEngine(SimpleWorkflow, {"reward_function": lambda t, a: value}, Scripted(["1"]))
    (episode,) = run(engine, [{"prompt": "p"}])
    assert episode.trajectories[0].reward == expected


def test_a_task_without_a_prompt_key_names_rllm_keys_and_the_task_keys():
    engine = UnifiedWorkflowEngine(
        SimpleWorkflow, {"reward_function": lambda t, a: 0.0}, Scripted(["1"]), retry_limit=1
    )
    with pytest.raises(Exception, match=r"messages, question, prompt, problem.*\['query'\]"):
        run(engine, [{"query": "p"}])


def test_get_model_response_refuses_per_call_sampling_settings():
    with pytest.raises(ConfigError, match="temperature"):
        asyncio.run(Scripted(["1"]).get_model_response([{"role": "user", "content": "p"}], temperature=0.5))


def test_every_failed_episode_of_a_step_is_said_with_the_first_error_and_three_in_a_row_stop():
    failed = [Episode(id=f"t:{i}", termination_reason="error", info={"error": "ValueError('bad')"}) for i in range(3)]
    mixed = [*failed, Episode(id="t:9", trajectories=[Trajectory()])]
    steps = FailedSteps(limit=3)
    warning = steps.observe(failed, RunRanks(), step=4)
    assert "step 4: all 3 episodes failed" in warning and "ValueError('bad')" in warning
    assert steps.observe(mixed, RunRanks(), 5) == ""  # one episode trained: the count starts again
    assert steps.observe(failed, RunRanks(), 6) != "" and steps.observe(failed, RunRanks(), 7) == ""  # said once
    with pytest.raises(WorkflowError, match=r"steps 6-8: every episode failed \(3 in the last\).*ValueError\('bad'\)"):
        steps.observe(failed, RunRanks(), 8)


@pytest.mark.parametrize(
    "episodes",
    [
        # an error or a timeout after a trajectory was recorded: that trajectory trains
        [
            Episode(id=f"t:{i}", termination_reason=r, trajectories=[Trajectory()])
            for i, r in enumerate(("error", "timeout"))
        ],
        # no trajectory, but ended normally (nothing to train, yet nothing failed)
        [Episode(id=f"t:{i}", termination_reason="env_done") for i in range(3)],
    ],
    ids=["failed with trajectories", "no trajectory but not failed"],
)
def test_a_step_is_all_failed_only_when_every_episode_has_no_trajectory_and_ended_in_error_or_timeout(episodes):
    steps = FailedSteps(limit=2)
    # the limit's worth of such steps in a row: neither a warning nor the stop
    assert [steps.observe(episodes, RunRanks(), step) for step in (1, 2, 3)] == ["", "", ""]
    # the same episodes with no trajectory and a failed ending are a failed step (a timeout is one too)
    failed = [Episode(id=f"t:{i}", termination_reason=r) for i, r in enumerate(("error", "timeout"))]
    assert steps.observe(failed, RunRanks(), 4).startswith("step 4: all 2 episodes failed")
