"""A single-turn workflow with a verifiable reward: one completion, scored by a reward function."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rllm_torch.rllm.types import Episode, TerminationReason, Trajectory
from rllm_torch.trainer.workflow import RolloutEngine, Workflow

__all__ = ["SingleTurnWorkflow", "RewardFn"]

RewardFn = Callable[[dict, str], float]
"""``reward_fn(task, response_text) -> float``; a task is a dict with at least ``"prompt"``."""


class SingleTurnWorkflow(Workflow):
    """Prompt → one completion → ``reward_fn(task, text)``.

    Args:
        rollout_engine: where completions come from.
        reward_fn: the verifier, called in a worker thread (:meth:`Workflow.call_reward`, within
            ``rllm.workflow.reward_timeout_s``); an exception in it fails the attempt (the engine retries).
        correct_threshold: the episode is correct when ``reward >= correct_threshold``.
        role: the trajectory name, which is the group role (picks the estimator).
        reward_components: named reward functions scored too (``Trajectory.reward_components``,
            in this order, for ``gdpo``; each also an episode metric ``reward/<name>``), or None.
    """

    def __init__(
        self,
        rollout_engine: RolloutEngine,
        reward_fn: RewardFn,
        correct_threshold: float = 1.0,
        role: str = "solver",
        reward_components: dict[str, RewardFn] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(rollout_engine, **kwargs)
        self.reward_fn, self.correct_threshold, self.role = reward_fn, correct_threshold, role
        self.reward_components = dict(reward_components or {})

    async def run(self, task: dict, uid: str) -> Episode:
        output = await self.rollout_engine.generate(task["prompt"])
        reward = await self.call_reward(self.reward_fn, task, output.text, uid=uid)
        components = {
            name: await self.call_reward(fn, task, output.text, name=name, uid=uid)
            for name, fn in self.reward_components.items()
        }
        step = output.to_step(
            reward, done=True, observation=task["prompt"]
        )  # the state it answered (GiGPO's step groups)
        reason = (
            TerminationReason.ENV_DONE
            if output.finish_reason == "stop"
            else TerminationReason.MAX_RESPONSE_LENGTH_EXCEEDED
        )
        trajectory = Trajectory(
            name=self.role, steps=[step], reward=reward, reward_components=list(components.values()) or None
        )
        return Episode(
            trajectories=[trajectory],
            is_correct=reward >= self.correct_threshold,
            termination_reason=reason,
            metrics={"reward": reward, "response_length": float(len(output.response_ids))}
            | {f"reward/{name}": value for name, value in components.items()},
            info={"data_source": task.get("data_source", "unknown")},
        )
