"""What a workflow is and what it samples from: a :class:`Workflow` turns a task into an
:class:`~rllm_torch.rllm.types.Episode`, sampling completions (:class:`ModelOutput`) from a
:class:`RolloutEngine` (a backend's sampler). The tasks and workflows of each domain are in
:mod:`rllm_torch.rollouts`; :mod:`~rllm_torch.trainer.workflow_engine` runs many at once."""

from __future__ import annotations

import asyncio
import contextvars
import math
import numbers
import os
import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rllm_torch.core.errors import InvalidRewardsError, InvalidRewardTypeError, RewardTimeoutError
from rllm_torch.rllm.types import Episode, Step

__all__ = ["ModelOutput", "RolloutEngine", "Workflow", "RewardThreads", "MAX_REWARD", "SAMPLED_VERSIONS"]

SAMPLED_VERSIONS: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "rllm_torch_sampled_versions", default=None
)
"""The policy versions of the completions one episode sampled, in order (one per ``generate``
call): the workflow engine sets a fresh list in each episode's task, and a rollout engine whose
weights carry a version (async training's sampler) appends it; None outside an episode."""

MAX_REWARD = 1e15
"""The largest reward magnitude :meth:`Workflow.call_reward` accepts: far beyond any reward scale in
use, and far below where the estimators' float32 group statistics overflow (a squared deviation of
1e30, summed over a group, is still finite; one of 1e20 is not: the group's advantages would all be 0)."""


class RewardThreads:
    """Daemon threads that run reward calls for the event loop (:meth:`Workflow.call_reward`).

    Not the loop's default executor: its threads are joined when ``asyncio.run`` ends and when
    the interpreter exits, so one reward that never returns would hang the run at its end.
    These are daemon threads; a call past its time limit keeps its thread, and
    :meth:`replace_stuck` starts another so the pool keeps ``size`` free workers.

    Args:
        size: worker threads (default: the default executor's ``min(32, cores + 4)``).
    """

    def __init__(self, size: int | None = None) -> None:
        self.size = size or min(32, (os.cpu_count() or 1) + 4)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._started = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], *args: Any) -> tuple[asyncio.Future, asyncio.Future]:
        """Queue ``fn(*args)`` for a worker. Returns two futures of the running loop: the first is
        done when a worker starts the call (a time limit counts from then, not from the queue),
        the second holds its result. A call whose result future is cancelled before a worker
        reaches it is skipped."""
        with self._lock:
            while self._started < self.size:
                self._start()
        loop = asyncio.get_running_loop()
        started, future = loop.create_future(), loop.create_future()
        self._jobs.put((loop, started, future, fn, args))
        return started, future

    def replace_stuck(self) -> None:
        """A worker is held by a call that timed out: start one more."""
        with self._lock:
            self._start()

    def _start(self) -> None:
        threading.Thread(target=self._work, name=f"rllm-reward-{self._started}", daemon=True).start()
        self._started += 1

    def _work(self) -> None:
        while True:
            loop, started, future, fn, args = self._jobs.get()
            if future.cancelled():
                continue
            try:
                loop.call_soon_threadsafe(_settle, started, started.set_result, None)
            except RuntimeError:  # the loop is closed: nobody waits for this call
                continue
            try:
                settle, value = future.set_result, fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting episode
                settle, value = future.set_exception, exc
            try:
                loop.call_soon_threadsafe(_settle, future, settle, value)
            except RuntimeError:  # the loop is closed: nobody waits for this result
                pass


def _settle(future: asyncio.Future, settle: Callable[[Any], None], value: Any) -> None:
    if not future.done():  # not cancelled by a time limit
        settle(value)


REWARD_THREADS = RewardThreads()


@dataclass
class ModelOutput:
    """One sampled completion.

    Attributes:
        text: the decoded response, without its final end token (other special tokens are kept).
        prompt_ids: prompt token ids.
        response_ids: sampled response token ids, ``T`` of them (including the end token if sampled).
        logprobs: ``T`` per-token sampling log-probs (nats) of the temperature-scaled distribution.
        finish_reason: ``"stop"`` (end token sampled) or ``"length"`` (``max_new_tokens`` reached).
        info: free-form; ``"policy_version"``: the version of the weights that sampled it (async training).
    """

    text: str
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    finish_reason: str = "stop"
    info: dict = field(default_factory=dict)

    def to_step(self, reward: float, **fields) -> Step:
        """The :class:`~rllm_torch.rllm.types.Step` of this completion (ids, log-probs, text) with
        ``reward``; ``fields`` sets other Step fields (``done``, ``observation``, ...)."""
        return Step(
            prompt_ids=self.prompt_ids,
            response_ids=self.response_ids,
            logprobs=self.logprobs,
            reward=reward,
            model_response=self.text,
            **fields,
        )


class RolloutEngine(ABC):
    """Samples completions. ``validation`` switches to the validation sampling settings."""

    validation: bool = False

    @abstractmethod
    async def generate(self, prompt: str) -> ModelOutput:
        """Sample one completion of ``prompt``."""


class Workflow(ABC):
    """Base of workflows (rLLM's ``Workflow``). Built as ``workflow_cls(rollout_engine=...,
    **workflow_args)`` once per slot of the engine's pool and reused across tasks.

    ``run`` returns the episode; the engine then sets its ``task_id``, ``rollout_idx``, ``id``
    and ``task``. An exception in ``run`` marks the attempt as failed (the engine retries it).
    """

    reward_timeout_s: float | None = None
    """The limit of :meth:`call_reward` in seconds (None: none); the engine sets it from
    ``rllm.workflow.reward_timeout_s`` on every workflow it builds."""

    def __init__(self, rollout_engine: RolloutEngine, **kwargs: Any) -> None:
        self.rollout_engine = rollout_engine

    async def call_reward(self, fn: Callable[..., Any], *args: Any, name: str = "reward_fn", uid: str = "") -> float:
        """``fn(*args)``, a reward, as a float: run in a worker thread (:class:`RewardThreads`), so
        the event loop runs other episodes meanwhile (a verifier that waits on a sandbox or a
        server does not stall the step), for at most :attr:`reward_timeout_s` seconds from the
        moment a worker starts it (the wait for a free worker does not count).

        Raises:
            RewardTimeoutError: ``fn`` did not return in time. Python cannot stop a thread: the
                call goes on in its (daemon) thread and its result is dropped; a new thread takes
                its place, and a call that never returns does not keep the process from ending.
            InvalidRewardTypeError: ``fn`` returned something other than a real number or a bool
                (Python's or numpy's: ``True`` / ``False`` score 1.0 / 0.0).
            InvalidRewardsError: it returned NaN, an infinity, or a magnitude above
                :data:`MAX_REWARD` (the estimators' float32 statistics would overflow and zero the
                group's advantages without a word).
            Exception: whatever ``fn`` raises.
        """
        started, future = REWARD_THREADS.submit(fn, *args)
        try:
            await started  # waiting for a free worker is not the call's time
            done, _ = await asyncio.wait({future}, timeout=self.reward_timeout_s)
        except asyncio.CancelledError:  # the episode was cancelled: the queued call is dropped too
            future.cancel()
            raise
        if not done:
            future.cancel()
            REWARD_THREADS.replace_stuck()
            raise RewardTimeoutError(
                f"{name} did not return within rllm.workflow.reward_timeout_s={self.reward_timeout_s} s; raise the "
                "limit, or make the function return (e.g. a timeout of its own on what it waits for)."
            )
        reward = future.result()
        where = f" for task {uid!r}" if uid else ""
        if not isinstance(reward, numbers.Real | np.bool_):  # `return resp == ans` scores 1.0 / 0.0
            raise InvalidRewardTypeError(
                f"{name} returned {reward!r} ({type(reward).__name__}){where}; return a float (an int or a bool counts too)."
            )
        if not math.isfinite(reward) or abs(reward) > MAX_REWARD:
            raise InvalidRewardsError(
                f"{name} returned {reward!r}{where}; rewards must be finite and at most {MAX_REWARD:g} in magnitude "
                "(the estimators' float32 statistics overflow beyond that); rescale the reward."
            )
        return float(reward)

    @abstractmethod
    async def run(self, task: dict, uid: str) -> Episode:
        """Run the workflow on ``task``; ``uid`` is ``"{task_id}:{rollout_idx}"`` (a label)."""

    def reset(self) -> None:
        """Called before each task; clear per-task state here."""
