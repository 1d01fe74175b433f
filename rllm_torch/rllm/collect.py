"""rLLM's ``collect_reward_and_advantage_from_trajectory_groups``, tensorized: per role, every
group is packed once and the role's estimator runs once on the packed rewards.

Two modes per group, as rLLM decides them:

* **precomputed**: ``use_precomputed_advantage`` is on and some step of the group has an
  advantage. Every step ends with a per-token list of ``T`` floats: a list is kept, a scalar
  ``a`` becomes ``a * response_mask`` (``[a] * T`` without a mask), a missing one becomes zeros
  (with one ``UserWarning`` per call that counts them).
* **RL**: otherwise. The role's estimator (``estimator_map[role]``, else ``estimator``) turns
  trajectory rewards into one advantage per trajectory, and each step of the trajectory gets it
  as a Python float (``step.advantage = a``). A trajectory with no trained token
  (:meth:`~rllm_torch.rllm.types.Trajectory.is_trained`) takes no part in the statistics (nor in the
  ``reward/*`` metrics; its reward is not read) and gets ``0.0``; ``advantage/{role}/num_untrained``
  counts them. The backend multiplies it by each step's own
  response mask (:meth:`~rllm_torch.rllm.types.Step.token_advantages`), so every step of a
  multi-step trajectory gets the advantage exactly at its own response tokens. In a turn mode
  (``stepwise_advantage_mode`` ``turn_level``, ``mt_grpo``, ``gigpo``; :mod:`rllm_torch.rllm.stepwise`)
  each step gets its own advantage instead, from the trajectory's turn rewards.

Everything is validated before any step is written: when an error is raised, no step changed.
In RL mode ``step.advantage`` is an output: a value left there (e.g. by an earlier call) is
overwritten without a warning (rLLM logs one per group; detecting it costs a scan of every step).
"""

from __future__ import annotations

import numbers
import warnings
from collections import defaultdict

import numpy as np
import torch
import torch.distributed as dist

from rllm_torch.core.checks import all_rewards_are_numbers, check_reward
from rllm_torch.core.distributed import ONE_PROCESS, agree_across_ranks, gather_objects, resolve_process_group
from rllm_torch.core.errors import (
    InvalidRewardsError,
    InvalidRewardTypeError,
    RLLMTorchError,
)
from rllm_torch.core.packing import GroupedRewards
from rllm_torch.core.turns import GroupedTurns
from rllm_torch.rllm.config import TURN_MODES, AlgorithmConfig
from rllm_torch.rllm.metrics import difficulty_metrics, summary_metrics
from rllm_torch.rllm.roles import outcome_estimator, reward_components_tensor, role_advantages
from rllm_torch.rllm.stepwise import ObservationIds, check_stepwise_estimator, role_turn_advantages, turn_rewards
from rllm_torch.rllm.types import Step, Trajectory, TrajectoryGroup

__all__ = ["collect_reward_and_advantage_from_trajectory_groups", "pack_role_rewards", "pack_role_turns"]


def _where(group: TrajectoryGroup, traj: Trajectory, step_index: int | None = None) -> str:
    step = "" if step_index is None else f", step {step_index}"
    return f"task {group.task_id!r}, trajectory {traj.name!r} (group {group.group_id!r}){step}"


def _locate_bad_reward(groups: list[TrajectoryGroup]) -> None:
    """Raise the error for the first trained trajectory's reward that is not a real number
    (slow path, on failure only)."""
    for group in groups:
        for traj in group.trajectories:
            if traj.is_trained():
                check_reward(traj.reward, _where(group, traj))


def pack_role_rewards(
    groups: list[TrajectoryGroup], *, process_group: dist.ProcessGroup | None = None
) -> tuple[GroupedRewards, list[Trajectory]]:
    """Pack the trajectory rewards of some groups as float64 tensors, in one go (with a
    ``process_group``: this rank's share of a rank-local batch, unchecked across ranks). Only
    trained trajectories (:meth:`Trajectory.is_trained`) are packed: an untrained one takes no
    part in its group's statistics (a group left with one member follows the singleton rule; one
    left with none is empty).

    Returns:
        ``(batch, trajectories)``: the :class:`~rllm_torch.GroupedRewards` (dense ``[G, K]`` view
        when every group has ``K`` members, else ragged) and the trained trajectories in its flat
        order.

    Raises:
        InvalidRewardsError: a reward is None; ``reward_components`` on some trajectories and
        not others, or of different lengths. InvalidRewardTypeError: a reward is not a real
        number or bool (a list, array or tensor, even of one element; a string). All name the
        task id and the trajectory.
    """
    members = [[t for t in g.trajectories if t.is_trained()] for g in groups]
    pairs = [(g, t) for g, group_members in zip(groups, members, strict=True) for t in group_members]
    trajs = [t for _, t in pairs]
    values = [t.reward for t in trajs]
    if not all_rewards_are_numbers(values):  # a list, array, string, None...: never read as a number
        _locate_bad_reward(groups)
    rewards_N = torch.from_numpy(np.array(values, dtype=np.float64)).reshape(len(values))
    lengths_N = torch.tensor([t.trained_tokens() for t in trajs], dtype=torch.float64).reshape(len(trajs))
    components_NR = reward_components_tensor(pairs)
    sizes = [len(group_members) for group_members in members]
    common = (
        dict(validate=False)
        if process_group is None
        else dict(validate=False, process_group=process_group, local_groups=True)
    )
    if sizes and sizes[0] > 0 and sizes.count(sizes[0]) == len(sizes):
        shape = (len(sizes), sizes[0])
        extra = {} if components_NR is None else {"reward_components": components_NR.view(*shape, -1)}
        return GroupedRewards.from_padded(
            rewards_N.view(shape), weights=lengths_N.view(shape), **extra, **common
        ), trajs
    group_index_N = torch.repeat_interleave(
        torch.arange(len(sizes)), torch.tensor(sizes, dtype=torch.int64), output_size=len(trajs)
    )
    batch = GroupedRewards.from_flat(
        rewards_N, group_index_N, num_groups=len(sizes), weights=lengths_N, reward_components=components_NR, **common
    )
    return batch, trajs


def pack_role_turns(groups: list[TrajectoryGroup], mode: str) -> tuple[GroupedTurns, list[Trajectory]]:
    """Pack the turns of some groups' trained trajectories (one turn per step, float64 turn
    rewards of :func:`~rllm_torch.rllm.stepwise.turn_rewards`, each step's trained tokens as its
    weight, and for ``gigpo`` its observation id), on this process.

    Returns:
        ``(turns, trajectories)``: the turns, and the trained trajectories in their order.

    Raises:
        InvalidRewardsError / InvalidRewardTypeError / InvalidTrajectoryError: see ``turn_rewards``
        and :class:`~rllm_torch.rllm.stepwise.ObservationIds`; the message names the task and step.
    """
    observation_ids = ObservationIds() if mode == "gigpo" else None
    rewards, traj_index, group_index, weights, observations, trajs = [], [], [], [], [], []
    for g, group in enumerate(groups):
        for traj in (t for t in group.trajectories if t.is_trained()):
            rewards += turn_rewards(traj, _where(group, traj), mode)
            traj_index += [len(trajs)] * len(traj.steps)
            weights += [float(step.response_mask_tensor().sum()) for step in traj.steps]
            if observation_ids is not None:
                observations += [
                    observation_ids(s.observation, _where(group, traj, i)) for i, s in enumerate(traj.steps)
                ]
            trajs.append(traj)
            group_index.append(g)
    turns = GroupedTurns.from_flat(
        torch.tensor(rewards, dtype=torch.float64),
        torch.tensor(traj_index, dtype=torch.int64),
        torch.tensor(group_index, dtype=torch.int64),
        num_groups=len(groups),
        observation_index=None if observation_ids is None else torch.tensor(observations, dtype=torch.int64),
        weights=torch.tensor(weights, dtype=torch.float64),
    )
    return turns, trajs


def _precomputed_values(group: TrajectoryGroup, missing: list[str]) -> list[tuple[Step, list]]:
    """(step, per-token list to write) for every step of a precomputed group; appends the
    location of each step without an advantage to ``missing``."""
    out = []
    for traj in group.trajectories:
        for index, step in enumerate(traj.steps):
            adv, num_tokens = step.advantage, len(step.response_ids)
            if adv is None:
                missing.append(_where(group, traj, index))
                value = [0.0] * num_tokens
            elif isinstance(adv, numbers.Real) and not isinstance(adv, bool):
                value = (
                    [float(adv)] * num_tokens
                    if step.response_mask is None
                    else (step.response_mask_tensor() * float(adv)).tolist()
                )
            elif isinstance(adv, (list, tuple, np.ndarray, torch.Tensor)):
                value = (
                    adv
                    if isinstance(adv, list)
                    else list(adv)
                    if isinstance(adv, tuple)
                    else np.asarray(adv, dtype=np.float64).reshape(-1).tolist()
                )
                if len(value) != num_tokens:
                    raise InvalidRewardsError(
                        f"{_where(group, traj, index)}: precomputed advantage has {len(value)} entries but the step has {num_tokens} response tokens; give one per response token."
                    )
            else:
                raise InvalidRewardTypeError(
                    f"{_where(group, traj, index)}: step.advantage of type {type(adv).__name__} is not supported; use None, a float, or a per-token list."
                )
            out.append((step, value))
    return out


def collect_reward_and_advantage_from_trajectory_groups(
    groups: list[TrajectoryGroup],
    algorithm_config: AlgorithmConfig,
    collect_advantage: bool = True,
    *,
    process_group: object = ONE_PROCESS,
) -> dict[str, float]:
    """Compute every step's advantage in place and return reward/advantage metrics.

    See the module docstring for the two modes. RL groups of one role are packed into one
    :class:`~rllm_torch.GroupedRewards` (float64) and the role's estimator is called once
    (:func:`~rllm_torch.compute_advantages` with ``algorithm_config.estimator_call_kwargs``).

    Args:
        groups: trajectory groups; ``group_role`` picks the estimator.
        algorithm_config: estimator, ``estimator_map``, options, ``use_precomputed_advantage``.
        collect_advantage: False (validation): only the reward metrics, no step is changed.
        process_group: ``ONE_PROCESS`` (default), ``None`` (WORLD) or a ``torch.distributed``
            ``ProcessGroup`` whose ranks hold the rest of the batch. Every rank must call. Each
            rank's groups stay whole (the rank-local layout, :mod:`rllm_torch.core.distributed`): the
            result is that of one process on the concatenation of every rank's ``groups``;
            batch statistics and every metric are over all ranks and identical on every rank.
            Collectives: one ``all_gather_object`` (roles, and any rank's input error, raised on
            every rank), then per role the estimator's own and the metrics' (``O(G)``).

    Returns:
        Metrics as Python floats, per role: ``reward/{role}/{mean,std,max,min}`` over the
        trajectory rewards of its RL groups; with ``collect_advantage``,
        ``advantage/{role}/{mean,std,max,min,fraction_zero}`` (one value per trajectory for RL
        groups, per response token for precomputed ones) and the ``difficulty/{role}/*`` keys of
        :func:`~rllm_torch.rllm.metrics.difficulty_metrics` (RL groups). ``{}`` for no groups.

    Raises:
        InvalidRewardsError / InvalidRewardTypeError: an RL trajectory's reward is None / not a number.
        ValueError: a precomputed per-token list of the wrong length; in a turn mode, a step
            without a reward (or, for ``gigpo``, without an observation).
        TypeError: a precomputed step advantage of an unsupported type.
        UnknownEstimatorError: a role's estimator (from ``estimator_map`` or the default) is not registered.
        Messages name the task id, the trajectory name and the step index.

    Source: rLLM ``rllm/experimental/common/advantage.py``.
    """
    group = resolve_process_group(process_group)
    mode = algorithm_config.stepwise_advantage_mode
    rl_groups, pre_groups = defaultdict(list), defaultdict(list)
    use_pre = algorithm_config.use_precomputed_advantage
    for g in groups:
        has_pre = use_pre and any(s.advantage is not None for t in g.trajectories for s in t.steps)
        (pre_groups if has_pre else rl_groups)[g.group_role].append(g)

    # every check that reads this rank's data runs before the first collective
    error, estimators, packed, token_writes, pre_tokens, turns = None, {}, {}, [], {}, {}
    try:
        if collect_advantage:
            roles = {*algorithm_config.estimator_map, *rl_groups}
            estimators = {role: outcome_estimator(role, algorithm_config) for role in roles}
            for estimator in estimators.values():
                check_stepwise_estimator(estimator, mode)
            token_writes, pre_tokens = _precomputed_writes(pre_groups)
        packed = {role: pack_role_rewards(role_groups, process_group=group) for role, role_groups in rl_groups.items()}
        if collect_advantage and mode in TURN_MODES:
            turns = {role: pack_role_turns(role_groups, mode) for role, role_groups in rl_groups.items()}
    except (RLLMTorchError, ValueError, TypeError) as exc:
        if group is None:
            raise
        error = exc
    rl_roles, pre_roles = sorted(rl_groups), sorted(pre_tokens)
    if group is not None:  # the roles of every rank, and every rank's error on every rank
        everyone = agree_across_ranks(group, error, {"rl": rl_roles, "pre": pre_roles}, must_match=())
        rl_roles = sorted({role for facts in everyone for role in facts["rl"]})
        pre_roles = sorted({role for facts in everyone for role in facts["pre"]})
        for role in set(rl_roles) - set(packed):
            packed[role] = pack_role_rewards([], process_group=group)
            if collect_advantage and mode in TURN_MODES:
                turns[role] = pack_role_turns([], mode)
            if collect_advantage:
                estimators[role] = outcome_estimator(role, algorithm_config)

    metrics: dict[str, float] = {}
    advantages_by_role: dict[str, torch.Tensor] = {}
    writes: list[tuple[list[Trajectory], list[float]]] = []
    step_writes: list[tuple[list[Trajectory], list[Trajectory], list[float]]] = []  # turn modes
    for role in rl_roles:
        batch, trajs = packed[role]
        if not collect_advantage:  # validation: the rewards only
            if group is not None or batch.num_trajectories:
                metrics |= summary_metrics(batch.rewards, f"reward/{role}", process_group=group)
            continue
        untrained = [t for g in rl_groups.get(role, []) for t in g.trajectories if not t.is_trained()]
        if mode in TURN_MODES:
            adv_M, role_metrics = role_turn_advantages(
                turns[role][0].rank_local(group), role, estimators[role], algorithm_config, process_group=group
            )
            if count := sum(gather_objects(len(untrained), group)):
                role_metrics[f"advantage/{role}/num_untrained"] = float(count)
            metrics |= role_metrics | difficulty_metrics(batch, f"difficulty/{role}")
            advantages_by_role[role] = adv_M.double()
            step_writes.append((untrained, turns[role][1], adv_M.tolist()))
            continue
        adv_N, role_metrics = role_advantages(
            batch,
            role,
            estimators[role],
            algorithm_config,
            num_untrained=len(untrained),
            process_group=group,
            difficulty=True,
        )
        metrics |= role_metrics
        advantages_by_role[role] = adv_N.double()
        writes += [(untrained, [0.0] * len(untrained)), (trajs, adv_N.tolist())]
    for role in pre_roles if collect_advantage else []:  # over its tokens, and its RL trajectories if it has both
        parts = [a for a in (advantages_by_role.get(role), pre_tokens.get(role)) if a is not None]
        adv_all = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)
        if group is not None or adv_all.numel():
            metrics |= summary_metrics(adv_all, f"advantage/{role}", fraction_zero=True, process_group=group)
    per_step = algorithm_config.normalize_by_steps  # rLLM's: each step's share of its trajectory's advantage
    for trajs, adv_list in writes:
        for traj, adv in zip(trajs, adv_list, strict=True):
            for step in traj.steps:
                step.advantage = adv / len(traj.steps) if per_step else adv
    for untrained, trajs, adv_list in step_writes:  # turn modes: one advantage per step
        for step in (step for traj in untrained for step in traj.steps):
            step.advantage = 0.0
        for step, adv in zip((step for traj in trajs for step in traj.steps), adv_list, strict=True):
            step.advantage = adv
    for step, value in token_writes:
        step.advantage = value
    return metrics


def _precomputed_writes(
    pre_groups: dict[str, list[TrajectoryGroup]],
) -> tuple[list[tuple[Step, list]], dict[str, torch.Tensor]]:
    """``(writes, tokens_by_role)``: the per-token list to write on every step of the precomputed
    groups, and each role's token advantages (float64) for the metrics; warns once about steps
    without an advantage (they get zeros)."""
    missing: list[str] = []
    token_writes: list[tuple[Step, list]] = []
    tokens_by_role: dict[str, torch.Tensor] = {}
    for role, role_groups in pre_groups.items():
        entries = [entry for g in role_groups for entry in _precomputed_values(g, missing)]
        tokens = [a for _, values in entries for a in values]
        try:
            tokens_by_role[role] = torch.tensor(tokens, dtype=torch.float64)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"role {role!r}: a precomputed per-token advantage is not a number ({exc}); lists must hold floats."
            ) from exc
        token_writes.extend(entries)
    if missing:
        warnings.warn(
            f"{len(missing)} step(s) of precomputed groups have no advantage and get zeros (first: {missing[0]}).",
            UserWarning,
            stacklevel=3,
        )
    return token_writes, tokens_by_role
