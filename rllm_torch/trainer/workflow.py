"""What a workflow is (rLLM's ``rllm.workflows.workflow``): a :class:`Workflow` turns a task into
an :class:`~rllm_torch.rllm.types.Episode`, sampling completions (:class:`ModelOutput`) from a
:class:`RolloutEngine` (a backend's sampler, :mod:`~rllm_torch.trainer.rollout_engine`). The tasks and workflows of each domain are in
:mod:`rllm_torch.rollouts`; :mod:`~rllm_torch.trainer.workflow_engine` runs many at once.

A workflow either returns its :class:`Episode` from :meth:`Workflow.run` (this package's
workflows), or, as rLLM's do, commits trajectories (:meth:`Workflow.commit`) and ends by raising
:class:`TerminationEvent` with a reason; :meth:`Workflow.run_with_termination_handling` turns
either into an episode (:meth:`Workflow.postprocess_episode`: trajectory rewards, correctness,
metrics, termination reason)."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Executor
from copy import deepcopy
from functools import partial
from typing import Any

from rllm_torch.core.errors import ConfigError
from rllm_torch.rllm.types import Episode, TerminationReason, Trajectory
from rllm_torch.trainer.reward_threads import MAX_REWARD, REWARD_THREADS, RewardOutput, RewardThreads, call_reward
from rllm_torch.trainer.rollout_engine import PROMPT_KEYS, SAMPLED_VERSIONS, ModelOutput, RolloutEngine, task_messages

__all__ = [
    "ModelOutput",
    "RolloutEngine",
    "Workflow",
    "BaseAgent",
    "TerminationEvent",
    "RewardOutput",
    "RewardThreads",
    "MAX_REWARD",
    "REWARD_THREADS",
    "SAMPLED_VERSIONS",
    "PROMPT_KEYS",
    "task_messages",
]


class TerminationEvent(Exception):
    """Raised by a workflow's ``run`` to end its episode with ``reason`` (rLLM's)."""

    def __init__(self, reason: TerminationReason = TerminationReason.UNKNOWN) -> None:
        super().__init__(f"Terminated: {reason}")
        self.reason = reason


class BaseAgent(ABC):
    """rLLM's agent base: an object with a :attr:`trajectory` that a workflow resets before each
    task and collects after it (:meth:`Workflow.collect_trajectories` finds the workflow's
    agents among its attributes)."""

    @property
    @abstractmethod
    def trajectory(self) -> Trajectory:
        """The trajectory this agent builds."""

    def reset(self) -> None:
        """Start a new trajectory."""

    def update_from_model(self, *args: Any, **kwargs: Any) -> Any:
        """Take the model's response (rLLM's hook; nothing by default)."""

    def update_from_env(self, *args: Any, **kwargs: Any) -> Any:
        """Take the environment's reply (rLLM's hook; nothing by default)."""


class Workflow(ABC):
    """Base of workflows (rLLM's ``Workflow``). Built once per slot of the engine's pool as
    ``workflow_cls(rollout_engine=..., executor=..., **workflow_args)`` and reused across tasks.

    ``run(task, uid)`` returns the episode, or (rLLM's style) returns None / raises
    :class:`TerminationEvent` after committing trajectories; the engine then sets the episode's
    ``task_id``, ``rollout_idx``, ``id`` and ``task``. Any other exception marks the attempt as
    failed (the engine retries it).

    Args:
        rollout_engine: where completions come from.
        executor: rLLM's thread pool for :meth:`run_in_executor` (None: the loop's default).
        timeout: seconds a ``run`` may take before its episode ends with ``TIMEOUT`` (rLLM's;
            ``1e6``: no limit).
        gamma: rLLM's per-step discount of :meth:`adjust_step_rewards` (0: none).
        reward_bonus_coeff: rLLM's reward shaping of :meth:`adjust_step_rewards` (0: none).
        store: rLLM's cross-episode store, kept as given.
    """

    reward_timeout_s: float | None = None
    """The limit of :meth:`call_reward` in seconds (None: none); the engine sets it from
    ``rllm.workflow.reward_timeout_s`` on every workflow it builds."""

    def __init__(
        self,
        rollout_engine: RolloutEngine,
        executor: Executor | None = None,
        timeout: float = 1e6,
        gamma: float = 0.0,
        reward_bonus_coeff: float = 0.0,
        store: Any = None,
        **kwargs: Any,
    ) -> None:
        self.rollout_engine, self.executor, self.store = rollout_engine, executor, store
        self.timeout, self.gamma, self.reward_bonus_coeff = float(timeout), gamma, reward_bonus_coeff
        self.task, self.uid = None, None
        self._completed_trajectories: list[Trajectory] = []

    async def call_reward(self, fn: Callable[..., Any], *args: Any, name: str = "reward_fn", uid: str = "") -> float:
        """``fn(*args)``, a reward, as a float, within :attr:`reward_timeout_s`
        (:func:`~rllm_torch.trainer.reward_threads.call_reward`: a number, a bool or a
        ``RewardOutput``; its errors)."""
        return await call_reward(fn, *args, timeout_s=self.reward_timeout_s, name=name, uid=uid)

    @abstractmethod
    async def run(self, task: dict, uid: str, **kwargs: Any) -> Episode | None:
        """Run the workflow on ``task``; ``uid`` is ``"{task_id}:{rollout_idx}"`` (a label)."""

    async def run_with_termination_handling(self, task: dict, uid: str, **kwargs: Any) -> Episode:
        """:meth:`run`, its outcome as an episode: a returned episode as it is; None, a
        :class:`TerminationEvent` or ``timeout`` seconds passed: the committed trajectories
        through :meth:`postprocess_episode` with ``UNKNOWN``, the event's reason or ``TIMEOUT``.
        Other exceptions propagate (the engine retries the attempt)."""
        try:
            coro = self.run(task, uid, **kwargs)
            output = await (coro if self.timeout >= 1e6 else asyncio.wait_for(coro, timeout=self.timeout))
            if isinstance(output, Episode):
                return output
            reason = TerminationReason.UNKNOWN
        except asyncio.TimeoutError:
            reason = TerminationReason.TIMEOUT
        except TerminationEvent as event:
            reason = event.reason
        return self.postprocess_episode(self.collect_trajectories(), reason)

    def commit(
        self,
        name: str | None = None,
        agent: BaseAgent | None = None,
        trajectory: Trajectory | None = None,
        reset: bool = False,
    ) -> None:
        """Keep a trajectory for training (rLLM's): ``agent``'s or the given ``trajectory``, named
        ``name`` if given; ``reset``: start the agent's next trajectory.

        Raises:
            ConfigError: neither or both of ``agent`` and ``trajectory``.
        """
        if (agent is None) == (trajectory is None):
            raise ConfigError("Workflow.commit takes an agent or a trajectory (one of the two).")
        traj = agent.trajectory if agent is not None else trajectory
        if name:
            traj.name = name
        if traj.steps:
            self._completed_trajectories.append(deepcopy(traj))
        if agent is not None and reset:
            agent.reset()

    def _agents(self) -> list[BaseAgent]:
        return [v for k, v in vars(self).items() if not k.startswith("_") and isinstance(v, BaseAgent)]

    def collect_trajectories(self) -> Episode:
        """An episode of the committed trajectories and those the workflow's agents still hold."""
        episode = Episode(trajectories=list(self._completed_trajectories))
        committed = {t.uid for t in self._completed_trajectories}
        for agent in self._agents():
            if agent.trajectory.uid not in committed and agent.trajectory.steps:
                episode.trajectories.append(deepcopy(agent.trajectory))
        return episode

    def compute_trajectory_reward(self, trajectory: Trajectory) -> None:
        """The trajectory's reward: the sum of its steps' rewards (rLLM's default)."""
        trajectory.reward = float(sum(step.reward for step in trajectory.steps))

    def adjust_step_rewards(self, trajectory: Trajectory) -> None:
        """rLLM's step reward shaping (``reward_bonus_coeff``) and discounted returns (``gamma``);
        nothing with both 0 (the default)."""
        if self.reward_bonus_coeff > 0.0:
            raw = [step.reward for step in trajectory.steps]
            for i in range(1, len(raw)):
                trajectory.steps[i].reward += self.reward_bonus_coeff * (raw[i] - raw[i - 1])
        if self.gamma > 0.0:
            ret = 0.0
            for step in reversed(trajectory.steps):
                ret = step.reward + self.gamma * ret
                step.reward = ret

    def assign_episode_correctness(self, episode: Episode) -> None:
        """Correct when the trajectories' rewards add up to more than 0 (rLLM's default)."""
        episode.is_correct = sum(t.reward or 0.0 for t in episode.trajectories) > 0

    def collect_metrics(self, episode: Episode) -> None:
        """``{name}_acc``: each trajectory name's mean reward (rLLM's default)."""
        rewards = defaultdict(list)
        for traj in episode.trajectories:
            rewards[traj.name].append(traj.reward or 0.0)
        episode.metrics = {f"{k}_acc": sum(v) / len(v) for k, v in rewards.items()}

    def postprocess_episode(
        self, episode: Episode, termination_reason: TerminationReason | None = None, error: dict | None = None
    ) -> Episode:
        """rLLM's finishing of an episode: its id and task, each trajectory's reward (a last
        step without a conversation dropped; rewards adjusted for several steps), correctness,
        metrics, ``error`` in ``info``, and the termination reason (None: ``UNKNOWN``)."""
        episode.id, episode.task = self.uid or episode.id, self.task
        if self.uid:
            episode.task_id = str(self.uid).split(":")[0]
        for trajectory in episode.trajectories:
            last = trajectory.steps[-1] if trajectory.steps else None
            if last is not None and not last.chat_completions and not last.response_ids:
                trajectory.steps.pop()  # rLLM: a step opened by the environment, never answered
            self.compute_trajectory_reward(trajectory)
            if len(trajectory.steps) > 1:
                self.adjust_step_rewards(trajectory)
        self.assign_episode_correctness(episode)
        self.collect_metrics(episode)
        if error is not None:
            episode.info["error"] = error
        episode.termination_reason = termination_reason or TerminationReason.UNKNOWN
        return episode

    def reset(self, task: dict | None = None, uid: str | None = None) -> None:
        """Called before each task: remember it, forget committed trajectories, reset the agents."""
        self.task, self.uid, self._completed_trajectories = task, uid, []
        for agent in self._agents():
            agent.reset()
            agent.trajectory.task = task

    def is_multithread_safe(self) -> bool:
        """rLLM's check of its environments; True here (no environment objects are shared)."""
        return True

    async def run_in_executor(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` in :attr:`executor` (rLLM's)."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, partial(fn, *args, **kwargs))
