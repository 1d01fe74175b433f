"""Reward calls off the event loop: :class:`RewardThreads` runs a workflow's reward function
in a worker thread, with a time limit, and :func:`call_reward` checks what it returned (a
number, a bool, or rLLM's :class:`RewardOutput`) before the reward reaches the estimators."""

from __future__ import annotations

import asyncio
import math
import numbers
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rllm_torch.core.errors import InvalidRewardsError, InvalidRewardTypeError, RewardTimeoutError

__all__ = ["RewardThreads", "REWARD_THREADS", "MAX_REWARD", "RewardOutput", "call_reward", "reward_value"]


@dataclass
class RewardOutput:
    """What an rLLM reward function returns (``rllm.rewards.reward_types.RewardOutput``): the
    ``reward``, free-form ``metadata`` and whether the response is correct (None: not judged)."""

    reward: float
    metadata: dict = field(default_factory=dict)
    is_correct: bool | None = None


MAX_REWARD = 1e15
"""The largest reward magnitude :func:`call_reward` accepts: far beyond any reward scale in
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


async def call_reward(
    fn: Callable[..., Any], *args: Any, timeout_s: float | None = None, name: str = "reward_fn", uid: str = ""
) -> float:
    """``fn(*args)``, a reward, as a float: run in a worker thread (:class:`RewardThreads`), so
    the event loop runs other episodes meanwhile (a verifier that waits on a sandbox or a
    server does not stall the step), for at most ``timeout_s`` seconds from the moment a worker
    starts it (the wait for a free worker does not count; None: no limit).

    ``fn`` may return a real number (a Python or numpy int or float), a bool (numpy's too:
    ``True`` is 1.0, as in ``return response == answer``) or rLLM's :class:`RewardOutput`
    (its ``reward``).

    Raises:
        RewardTimeoutError: ``fn`` did not return in time. Python cannot stop a thread: the
            call goes on in its (daemon) thread and its result is dropped; a new thread takes
            its place, and a call that never returns does not keep the process from ending.
        InvalidRewardTypeError: ``fn`` returned something else (None, a string, a list...).
        InvalidRewardsError: it returned NaN, an infinity, or a magnitude above
            :data:`MAX_REWARD` (the estimators' float32 statistics would overflow and zero the
            group's advantages without a word).
        Exception: whatever ``fn`` raises.
    """
    started, future = REWARD_THREADS.submit(fn, *args)
    try:
        await started  # waiting for a free worker is not the call's time
        done, _ = await asyncio.wait({future}, timeout=timeout_s)
    except asyncio.CancelledError:  # the episode was cancelled: the queued call is dropped too
        future.cancel()
        raise
    if not done:
        future.cancel()
        REWARD_THREADS.replace_stuck()
        raise RewardTimeoutError(
            f"{name} did not return within rllm.workflow.reward_timeout_s={timeout_s} s; raise the "
            "limit, or make the function return (e.g. a timeout of its own on what it waits for)."
        )
    return reward_value(future.result(), name=name, uid=uid)


def reward_value(reward: Any, *, name: str = "reward_fn", uid: str = "") -> float:
    """What a reward function returned, as a float (see :func:`call_reward`).

    Raises:
        InvalidRewardTypeError / InvalidRewardsError: see :func:`call_reward`.
    """
    where = f" for task {uid!r}" if uid else ""
    if isinstance(reward, RewardOutput):
        reward = reward.reward
    if isinstance(reward, (bool, np.bool_)):
        return float(reward)
    if not isinstance(reward, numbers.Real):
        raise InvalidRewardTypeError(
            f"{name} returned {reward!r} ({type(reward).__name__}){where}; return a float (or a bool: True is 1.0)."
        )
    if not math.isfinite(reward) or abs(reward) > MAX_REWARD:
        raise InvalidRewardsError(
            f"{name} returned {reward!r}{where}; rewards must be finite and at most {MAX_REWARD:g} in magnitude "
            "(the estimators' float32 statistics overflow beyond that); rescale the reward."
        )
    return float(reward)
