"""``UnifiedWorkflowEngine``: runs a workflow over many tasks at once, with retries and
optional JSONL episode logging."""

from __future__ import annotations

import asyncio
import inspect
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rllm_torch.core.errors import ConfigError, OutOfMemoryError, RewardTimeoutError, WorkflowError
from rllm_torch.rllm.types import Episode, TerminationReason
from rllm_torch.trainer.user_errors import FAILED_STEPS_LIMIT, describe_error
from rllm_torch.trainer.workflow import SAMPLED_VERSIONS, Workflow

__all__ = ["UnifiedWorkflowEngine", "EpisodeLogger"]


@dataclass
class EpisodeLogger:
    """Appends episodes as JSON lines to ``{base_dir}/{subdirectory}/{mode}_step_{step}.jsonl``."""

    base_dir: str
    subdirectory: str = "episodes"

    def log(self, episodes: list[Episode], step: int, mode: str) -> Path:
        path = Path(self.base_dir) / self.subdirectory / f"{mode}_step_{step}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            for e in episodes:
                reason = e.termination_reason.value if e.termination_reason is not None else None
                trajs = [
                    {"name": t.name, "reward": t.reward, "responses": [s.model_response for s in t.steps]}
                    for t in e.trajectories
                ]
                row = {
                    "id": e.id,
                    "task_id": e.task_id,
                    "rollout_idx": e.rollout_idx,
                    "task": e.task,
                    "is_correct": e.is_correct,
                    "termination_reason": reason,
                    "metrics": e.metrics,
                    "info": e.info,
                    "trajectories": trajs,
                }
                f.write(json.dumps(row, default=str) + "\n")
        return path


class UnifiedWorkflowEngine:
    """Runs ``workflow_cls`` on tasks, ``n_parallel_tasks`` at a time.

    Args:
        workflow_cls: a :class:`Workflow` subclass, built ``n_parallel_tasks`` times (the pool).
        workflow_args: keyword arguments of each workflow.
        rollout_engine: given to every workflow.
        n_parallel_tasks: how many episodes run at once (>= 1).
        retry_limit: attempts per episode (>= 1); an attempt that raises is retried until then,
            except for an :class:`~rllm_torch.core.errors.OutOfMemoryError`, which stops the run at once.
        raise_on_error: after the last failed attempt, raise :class:`WorkflowError` (True) or
            record an episode with ``termination_reason=ERROR`` (``TIMEOUT`` when the last attempt's
            reward did not return in time), no trajectory and the error in ``info["error"]`` (False;
            :func:`~rllm_torch.trainer.user_errors.describe_error`: the type, the message and the
            place in the user's code).
        reward_timeout_s: the limit of each reward call (:meth:`Workflow.call_reward`), None: none.
        episode_logger: when given, every batch of episodes is appended to a JSONL file.

    Raises:
        ValueError: ``n_parallel_tasks`` or ``retry_limit`` below 1.
        ConfigError: ``reward_timeout_s`` not > 0.
    """

    def __init__(
        self,
        workflow_cls: type[Workflow],
        workflow_args: dict | None,
        rollout_engine: Any,
        config: Any = None,
        *,
        n_parallel_tasks: int = 64,
        retry_limit: int = 3,
        raise_on_error: bool = True,
        reward_timeout_s: float | None = None,
        episode_logger: EpisodeLogger | None = None,
    ) -> None:
        if reward_timeout_s is not None and not reward_timeout_s > 0:
            raise ConfigError(
                f"rllm.workflow.reward_timeout_s={reward_timeout_s}: give a number of seconds > 0, or null for no limit."
            )
        self.reward_timeout_s = reward_timeout_s
        if n_parallel_tasks < 1 or retry_limit < 1:
            raise ValueError(
                f"n_parallel_tasks and retry_limit must be >= 1, got {n_parallel_tasks} and {retry_limit}."
            )
        self.workflow_cls, self.workflow_args, self.rollout_engine, self.config = (
            workflow_cls,
            dict(workflow_args or {}),
            rollout_engine,
            config,
        )
        self.n_parallel_tasks, self.retry_limit, self.raise_on_error = n_parallel_tasks, retry_limit, raise_on_error
        self.episode_logger = episode_logger
        self.step, self.mode, self.epoch = 0, "train", 0
        self._pool: asyncio.Queue | None = None
        self._pool_loop: asyncio.AbstractEventLoop | None = None
        self._executor: ThreadPoolExecutor | None = None

    async def initialize_pool(self) -> None:
        """Build the ``n_parallel_tasks`` workflows (idempotent), each given rLLM's ``executor``
        (a thread pool shared by the pool's workflows) when its class takes one."""
        if self._pool is not None and self._pool_loop is asyncio.get_running_loop():
            return
        self._pool, self._pool_loop = asyncio.Queue(), asyncio.get_running_loop()
        extra = {}
        if _takes(self.workflow_cls, "executor") and "executor" not in self.workflow_args:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=min(self.n_parallel_tasks, 32))
            extra["executor"] = self._executor
        for _ in range(self.n_parallel_tasks):
            workflow = self.workflow_cls(rollout_engine=self.rollout_engine, **extra, **self.workflow_args)
            workflow.reward_timeout_s = self.reward_timeout_s
            self._pool.put_nowait(workflow)

    def set_training_step(self, step: int, mode: str = "train", epoch: int = 0) -> None:
        """Where the next episodes belong (for the episode log)."""
        self.step, self.mode, self.epoch = step, mode, epoch

    async def _run_one(self, task: dict, task_id: str, rollout_idx: int) -> Episode:
        uid = f"{task_id}:{rollout_idx}"
        workflow = await self._pool.get()
        try:
            last_error: BaseException | None = None
            for _attempt in range(self.retry_limit):
                workflow.reset(task=task, uid=uid)
                versions: list[int] = []  # this attempt's completions' policy versions (this task's context)
                SAMPLED_VERSIONS.set(versions)
                try:
                    episode = await workflow.run_with_termination_handling(task, uid)
                    break
                except OutOfMemoryError:  # a retry would fail the same way: stop the run with its advice
                    raise
                except Exception as exc:  # noqa: BLE001 - any other workflow failure is retried
                    last_error = exc
            else:
                if self.raise_on_error:
                    raise WorkflowError(
                        f"episode {uid!r} failed {self.retry_limit} time(s); last error: {describe_error(last_error)}. "
                        "Fix it, or set rllm.workflow.raise_on_error=false to record such failures and go on (a run "
                        f"whose every episode fails for {FAILED_STEPS_LIMIT} steps in a row stops all the same)."
                    ) from last_error
                episode = Episode(
                    termination_reason=TerminationReason.TIMEOUT
                    if isinstance(last_error, RewardTimeoutError)
                    else TerminationReason.ERROR,
                    info={"error": describe_error(last_error), "data_source": task.get("data_source", "unknown")},
                )
        finally:
            self._pool.put_nowait(workflow)
        episode.task_id, episode.rollout_idx, episode.id, episode.task = task_id, rollout_idx, uid, task
        if versions:  # sampled by versioned weights (async training): each turn's, and the oldest
            episode.info["policy_versions"], episode.info["policy_version"] = list(versions), min(versions)
        return episode

    async def execute_tasks(
        self, tasks: list[dict], task_ids: list[str], rollout_indices: list[int] | None = None
    ) -> list[Episode]:
        """Run one episode per task (in order). Tasks with the same id are rollouts of one task.

        Raises:
            WorkflowError: an episode failed every attempt and ``raise_on_error`` is set.
        """
        await self.initialize_pool()
        rollout_indices = rollout_indices if rollout_indices is not None else [0] * len(tasks)
        jobs = [
            asyncio.ensure_future(self._run_one(t, i, r))
            for t, i, r in zip(tasks, task_ids, rollout_indices, strict=True)
        ]
        try:
            episodes = list(await asyncio.gather(*jobs))
        except BaseException:
            for job in jobs:
                job.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)
            raise
        if self.episode_logger is not None:
            self.episode_logger.log(episodes, self.step, self.mode)
        return episodes

    def shutdown(self) -> None:
        """Drop the pool (and its executor)."""
        self._pool = None
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


def _takes(cls: type, name: str) -> bool:
    """Whether ``cls(...)`` accepts the keyword ``name`` (by name or through ``**kwargs``)."""
    params = inspect.signature(cls).parameters.values()
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
