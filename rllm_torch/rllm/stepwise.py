"""Credit across the steps of a multi-step trajectory: rLLM's ``rllm.stepwise_advantage``
settings, with the turn-level schemes of :mod:`rllm_torch.core.turns`, for both callers (the
collector on trajectory objects, the trainer on its token batch).

Modes (``rllm.stepwise_advantage.mode``):

* ``broadcast`` (default, rLLM's): the trajectory's advantage on every step; with
  ``normalize_by_steps`` divided by the trajectory's number of steps (rLLM's meaning).
  ``per_step`` is rLLM's deprecated name and becomes ``broadcast`` (with a warning, as in rLLM).
* ``turn_level``: each step gets the role's estimator on its return-to-go among the members of
  its group still running at that turn (:func:`~rllm_torch.core.turns.turn_level_advantages`;
  unbiased with ``rloo``).
* ``mt_grpo``: MT-GRPO's per-turn-index normalisation summed over the trajectory's own turns
  (:func:`~rllm_torch.core.turns.per_turn_index_advantages`; biased when turn counts vary).
* ``gigpo``: GiGPO (:func:`~rllm_torch.core.turns.gigpo_advantages`), step groups by ``Step.observation``.

**Turn rewards.** The trajectory's reward (else its last step's, rLLM's rule) is its return.
Every step before the last earns its own ``Step.reward``; the last step earns the rest,
``trajectory.reward - sum(earlier steps' rewards)``. So the turn rewards always add up to the
reward broadcast trains on (switching mode changes the credit, not the objective); a workflow
that sets only the trajectory's reward (steps at 0.0) credits it to the last turn, and one whose
step rewards are bonuses on top of an outcome sets the trajectory reward to their sum.
"""

from __future__ import annotations

import math
from enum import Enum

import numpy as np
import torch
from torch import Tensor

from rllm_torch.core.checks import check_reward
from rllm_torch.core.errors import ConfigError, InvalidRewardsError, InvalidTrajectoryError
from rllm_torch.core.estimators.turns import (
    broadcast_advantages,
    gigpo_advantages,
    per_turn_index_advantages,
    turn_level_advantages,
)
from rllm_torch.core.turns import GroupedTurns
from rllm_torch.rllm.bound_estimator import BoundEstimator
from rllm_torch.rllm.config import TURN_MODES, AlgorithmConfig, rLLMAdvantageEstimator
from rllm_torch.rllm.metrics import summary_metrics
from rllm_torch.rllm.registry import registration
from rllm_torch.rllm.types import Trajectory

__all__ = ["turn_rewards", "ObservationIds", "check_stepwise_estimator", "role_turn_advantages"]


def turn_rewards(trajectory: Trajectory, where: str, mode: str) -> list[float]:
    """The turn rewards of ``trajectory`` (see the module docstring), as Python floats.

    Raises:
        InvalidRewardsError / InvalidRewardTypeError: a step before the last has no reward
            (``None``) or one that is not a finite real number, or the trajectory's reward is
            missing or not finite; the message names the step and the setting.
    """
    steps = trajectory.steps
    earlier = []
    for index, step in enumerate(steps[:-1]):
        if step.reward is None:
            raise InvalidRewardsError(
                f"{where}, step {index}: no reward, and rllm.stepwise_advantage.mode={mode!r} gives each step before "
                "the last its own Step.reward; set one on every step (0.0 for none), or use mode=broadcast."
            )
        earlier.append(check_reward(step.reward, f"{where}, step {index}"))
    total = trajectory.reward if trajectory.reward is not None else steps[-1].reward
    total = check_reward(total, f"{where} (its reward, else its last step's)")
    try:
        values = [*earlier, total - math.fsum(earlier)]
    except OverflowError:
        values = [math.inf]
    if not all(math.isfinite(v) for v in values):
        raise InvalidRewardsError(
            f"{where}: turn rewards {values} are not all finite; training needs finite step and trajectory rewards."
        )
    return values


def _hashable(value: object, where: str) -> object:
    """A hashable key equal for observations equal by content, tagged by kind (so a dict and a
    list of pairs, or a tensor and a tuple, never meet)."""
    if isinstance(value, dict):
        return ("dict", tuple(sorted((repr(k), _hashable(v, where)) for k, v in value.items())))
    if isinstance(value, (list, tuple)):
        return ("sequence", tuple(_hashable(v, where) for v in value))
    if isinstance(value, (Tensor, np.ndarray)):
        return ("array", tuple(value.shape), tuple(np.asarray(value.tolist()).ravel().tolist()))
    try:
        hash(value)
    except TypeError as exc:
        raise InvalidTrajectoryError(
            f"{where}: observation of type {type(value).__name__} cannot be compared (GiGPO groups equal observations); "
            "give a str, number, tuple, list, dict or tensor."
        ) from exc
    return value


class ObservationIds:
    """Dense ids of observations, in order of first appearance: equal observations (a dict or
    list compared by content) get the same id. GiGPO's anchor states."""

    def __init__(self) -> None:
        self._ids: dict = {}

    def __call__(self, observation: object, where: str) -> int:
        """The id of ``observation``.

        Raises:
            InvalidTrajectoryError: ``observation`` is None or cannot be compared.
        """
        if observation is None:
            raise InvalidTrajectoryError(
                f"{where}: no observation, and rllm.stepwise_advantage.mode='gigpo' groups a group's steps by the state "
                "they acted on (Step.observation): set it in the workflow, e.g. output.to_step(reward, observation=prompt)."
            )
        return self._ids.setdefault(_hashable(observation, where), len(self._ids))


def _label(name: object) -> str:
    return name.value if isinstance(name, Enum) else str(name)


def check_stepwise_estimator(estimator: rLLMAdvantageEstimator | str, mode: str) -> None:
    """Refuse an estimator that a turn mode cannot run (its registration's ``per_turn`` reason:
    a token-level estimator, ``gdpo``, ``pass_at_k``, ``grpo_passk``, ``remax``, ...).

    Raises:
        ConfigError: naming the estimator, the mode and the reason.
    """
    if mode not in TURN_MODES:
        return
    why = registration(estimator).per_turn
    if why is not None:
        raise ConfigError(
            f"rllm.stepwise_advantage.mode={mode!r} runs a group estimator on each turn's return; estimator "
            f"{_label(estimator)!r} cannot be run that way ({why}). Use grpo, rloo, reinforce, opo, ... or mode=broadcast."
        )


def role_turn_advantages(
    turns: GroupedTurns,
    role: str,
    estimator: BoundEstimator,
    algorithm_config: AlgorithmConfig,
    *,
    episode_scores: Tensor | None = None,
    process_group: object = None,
) -> tuple[Tensor, dict[str, float]]:
    """One role's per-step advantages in ``algorithm_config.stepwise_advantage_mode``.

    Args:
        turns: the role's trained trajectories' turns (under a process group, this rank's share).
        role: the group role, for the metric names.
        estimator: the role's estimator with the run's options bound (its plan's; one a turn
            mode can run: :func:`check_stepwise_estimator`).
        algorithm_config: the mode and its options (``stepwise_gamma``, ``step_advantage_w``,
            ``normalize_by_steps``).
        episode_scores: ``[N]`` the trajectories' scores (default: their summed turn rewards).
        process_group: ``None`` (one process) or the resolved ``ProcessGroup``; every rank calls.

    Returns:
        ``(adv_M, metrics)``: one advantage per turn in ``turns``' order (empty when no rank holds
        a turn of the role); ``reward/{role}/*`` over trajectory scores, ``advantage/{role}/*``
        over turns (with ``fraction_zero``), ``turns/{role}/*`` the turns per trajectory.
    """
    config, run = algorithm_config, estimator
    scores_N = turns.episode_returns() if episode_scores is None else episode_scores
    metrics: dict[str, float] = {}
    if process_group is not None or turns.num_trajectories:
        metrics = summary_metrics(scores_N, f"reward/{role}", process_group=process_group)
    if not metrics:
        return scores_N.new_zeros(0, dtype=torch.float64), metrics
    mode = config.stepwise_advantage_mode
    if mode == "turn_level":
        adv_M, _ = turn_level_advantages(turns, run, gamma=config.stepwise_gamma)
    elif mode == "mt_grpo":
        adv_M, _ = per_turn_index_advantages(turns, run, gamma=config.stepwise_gamma)
    elif mode == "gigpo":
        adv_M, _ = gigpo_advantages(
            turns, run, gamma=config.stepwise_gamma, step_advantage_w=config.step_advantage_w, episode_scores=scores_N
        )
    else:
        adv_M, _ = broadcast_advantages(
            turns, run, normalize_by_steps=config.normalize_by_steps, episode_scores=scores_N
        )
    metrics |= summary_metrics(adv_M, f"advantage/{role}", fraction_zero=True, process_group=process_group)
    metrics |= summary_metrics(turns.turn_counts.double(), f"turns/{role}", process_group=process_group)
    return adv_M, metrics
