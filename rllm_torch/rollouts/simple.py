"""rLLM's ``SimpleWorkflow``: one completion of the task's prompt, scored by a reward function.

The task is asked as rLLM asks it (:func:`~rllm_torch.trainer.workflow.task_messages`: its
``messages``, else ``question``, ``prompt`` or ``problem``); the reward function takes
``(task, action)`` and returns a number, a bool or a ``RewardOutput``. The episode ends with
``ENV_DONE``, or ``MAX_RESPONSE_LENGTH_EXCEEDED`` when the response hit the length limit; its
trajectory (the agent's, named ``default_traj_name`` until the transform names it) has one step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rllm_torch.rllm.types import Action, Step, TerminationReason, Trajectory
from rllm_torch.trainer.workflow import BaseAgent, RolloutEngine, TerminationEvent, Workflow, task_messages

__all__ = ["SimpleWorkflow", "SimpleAgent"]


class SimpleAgent(BaseAgent):
    """An agent that only holds the trajectory the workflow writes into (rLLM's)."""

    def __init__(self, **kwargs: Any) -> None:
        self._trajectory = Trajectory()

    def reset(self) -> None:
        self._trajectory = Trajectory()

    @property
    def trajectory(self) -> Trajectory:
        return self._trajectory


class SimpleWorkflow(Workflow):
    """Prompt → one completion → ``reward_function(task, action)`` (rLLM's ``SimpleWorkflow``).

    Args:
        rollout_engine: where completions come from.
        reward_function: ``fn(task: dict, action: Action) -> float | bool | RewardOutput``, called
            in a worker thread within ``rllm.workflow.reward_timeout_s`` (``Workflow.call_reward``).
        **kwargs: :class:`~rllm_torch.trainer.workflow.Workflow`'s (``executor``, ``timeout``, ...).
    """

    def __init__(self, rollout_engine: RolloutEngine, reward_function: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(rollout_engine, **kwargs)
        self.agent = SimpleAgent()
        self.reward_function = reward_function

    async def run(self, task: dict, uid: str, **kwargs: Any) -> None:
        self.reset(task, uid)
        asked = task_messages(task)
        messages = asked if isinstance(asked, list) else [{"role": "user", "content": asked}]
        output = await self.rollout_engine.get_model_response(messages, application_id=uid, **kwargs)
        action = Action(action=output.content)
        reward = await self.call_reward(self.reward_function, task, action, name="reward_function", uid=uid)
        self.agent.trajectory.steps.append(
            Step(
                chat_completions=[
                    *messages,
                    {"role": "assistant", "content": output.content, "reasoning": output.reasoning},
                ],
                thought=output.reasoning or "",
                action=action,
                reward=reward,
                model_output=output,
                observation=asked,
            )
        )
        self.commit(agent=self.agent, reset=True)
        if output.finish_reason == "length":
            raise TerminationEvent(TerminationReason.MAX_RESPONSE_LENGTH_EXCEEDED)
        raise TerminationEvent(TerminationReason.ENV_DONE)
