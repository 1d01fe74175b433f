"""rLLM's ``collect_reward_and_advantage_from_trajectory_groups``, tensorized: the groups are
described once as tensors (:func:`role_batch`), the per-role rule
(:func:`~rllm_torch.rllm.role_plan.compute_role_advantages`, the trainer's too) packs each role's
groups once and runs its estimator once, and each step gets its advantage back.

Two modes per group, as rLLM decides them:

* **precomputed**: ``use_precomputed_advantage`` is on and some step of the group has an
  advantage. Every step ends with a per-token list of ``T`` floats: a list is kept, a scalar
  ``a`` becomes ``a * response_mask`` (``[a] * T`` without a mask), a missing one becomes zeros
  (with one ``UserWarning`` per call that counts them).
* **RL**: otherwise. The role's estimator (``estimator_map[role]``, else ``estimator``) turns
  trajectory rewards into one advantage per trajectory, and each step of the trajectory gets it
  as a Python float (``step.advantage = a``). A trajectory with no trained token
  (:meth:`~rllm_torch.rllm.types.Trajectory.is_trained`: every response mask all 0) takes no part
  in the statistics (nor in the ``reward/*`` metrics; its reward is not read) and gets ``0.0``;
  ``advantage/{role}/num_untrained`` counts them. A trajectory whose steps carry no tokens at all
  (no ``response_ids``, no ``response_mask``: rewards only, as rLLM's tests build them) counts as
  rLLM counts it in broadcast mode: its reward is read and each step gets its advantage (``opo``
  weighs it as one token). The backend multiplies it by each step's own
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

from rllm_torch.core.checks import all_rewards_are_numbers, check_reward
from rllm_torch.core.distributed import ONE_PROCESS, resolve_process_group
from rllm_torch.core.errors import InvalidRewardsError, InvalidRewardTypeError, RLLMTorchError
from rllm_torch.rllm.config import TURN_MODES, AlgorithmConfig
from rllm_torch.rllm.metrics import difficulty_metrics
from rllm_torch.rllm.plan import AdvantagePlan
from rllm_torch.rllm.role_plan import RoleBatch, compute_role_advantages, role_reward_metrics, token_advantage_metrics
from rllm_torch.rllm.roles import group_baselines_tensor, reward_components_tensor
from rllm_torch.rllm.stepwise import ObservationIds, turn_rewards
from rllm_torch.rllm.types import Step, Trajectory, TrajectoryGroup

__all__ = ["collect_reward_and_advantage_from_trajectory_groups", "role_batch"]


def _where(group: TrajectoryGroup, traj: Trajectory, step_index: int | None = None) -> str:
    step = "" if step_index is None else f", step {step_index}"
    return f"task {group.task_id!r}, trajectory {traj.name!r} (group {group.group_id!r}){step}"


def _locate_bad_reward(pairs: list[tuple[TrajectoryGroup, Trajectory]], counted: list[bool]) -> None:
    """Raise the error for the first counted trajectory's reward that is not a real number
    (slow path, on failure only)."""
    for (group, traj), is_counted in zip(pairs, counted, strict=True):
        if is_counted:
            check_reward(traj.reward, _where(group, traj))


def _precomputed_values(
    group: TrajectoryGroup, missing: list[str], mismatched: list[str] | None = None
) -> list[tuple[Step, list]]:
    """(step, per-token list to write) for every step of a precomputed group; appends the
    location of each step without an advantage to ``missing``, and with ``mismatched`` (rLLM's
    rule, ``compat="rllm"``) gives a per-token list of the wrong length zeros and appends its
    location there instead of raising."""
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
                if len(value) != num_tokens and mismatched is not None:
                    mismatched.append(_where(group, traj, index))
                    value = [0.0] * num_tokens
                elif len(value) != num_tokens:
                    raise InvalidRewardsError(
                        f"{_where(group, traj, index)}: precomputed advantage has {len(value)} entries but the step has {num_tokens} response tokens; give one per response token (AlgorithmConfig(compat='rllm') gives such a step zeros with a warning, as rLLM does)."
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

    See the module docstring for the two modes. The per-role rule is
    :func:`~rllm_torch.rllm.role_plan.compute_role_advantages` (the trainer's token batch runs
    the same one); this function describes the groups to it as tensors (:func:`role_batch`)
    and writes what it returns on the steps.

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
        groups, per response token for precomputed ones) and rLLM's ``batch/{role}/*`` difficulty
        keys of :func:`~rllm_torch.rllm.metrics.difficulty_metrics` (RL groups). ``{}`` for no groups.

    Raises:
        InvalidRewardsError / InvalidRewardTypeError: an RL trajectory's reward is None / not a number.
        ValueError: a precomputed per-token list of the wrong length; in a turn mode, a step
            without a reward (or, for ``gigpo``, without an observation).
        TypeError: a precomputed step advantage of an unsupported type.
        UnknownEstimatorError: a role's estimator (from ``estimator_map`` or the default) is not registered.
        ConfigError: a token-level estimator (the collector gives one advantage per trajectory).

    Messages name the task id, the trajectory name and the step index.

    Source: rLLM ``rllm/experimental/common/advantage.py``.
    """
    group = resolve_process_group(process_group)
    mode = algorithm_config.stepwise_advantage_mode if collect_advantage else "broadcast"
    pre = [
        algorithm_config.use_precomputed_advantage
        and any(s.advantage is not None for t in g.trajectories for s in t.steps)
        for g in groups
    ]
    # every check that reads this rank's data runs before the first collective
    plan, batch, steps, token_writes, pre_tokens = None, None, [], [], {}
    try:
        if collect_advantage:
            plan = AdvantagePlan(algorithm_config)
            plan.check_outcome_level()
            pre_groups = defaultdict(list)
            for g, p in zip(groups, pre, strict=True):
                if p:
                    pre_groups[g.group_role].append(g)
            token_writes, pre_tokens = _precomputed_writes(pre_groups, algorithm_config.compat == "rllm")
        batch, steps = role_batch(groups, pre, mode)
    except (RLLMTorchError, ValueError, TypeError) as exc:
        if group is None:
            raise
        batch, steps = role_batch([], [], mode)  # this rank failed: an empty batch meets the others' collectives
        batch.error = exc
    if not collect_advantage:  # validation: the reward metrics only
        return role_reward_metrics(batch, process_group=group)
    if plan is None:  # this rank failed before its plan: its error, met in the first collective, raises on every rank
        role_reward_metrics(batch, process_group=group)
    result = compute_role_advantages(batch, plan, process_group=group)
    metrics = result.metrics
    for role, packed in result.packed.items():  # rLLM's difficulty diagnostics of each RL role
        metrics |= difficulty_metrics(packed, role)
    for role in result.precomputed_roles:  # over its tokens, and its RL trajectories if it has both
        parts = [a for a in (result.by_role.get(role), pre_tokens.get(role)) if a is not None]
        adv_all = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)
        metrics |= token_advantage_metrics(role, adv_all, process_group=group)
    for step, adv in zip(steps, result.steps.tolist(), strict=True):
        step.advantage = adv
    for step, value in token_writes:
        step.advantage = value
    return metrics


def role_batch(groups: list[TrajectoryGroup], precomputed: list[bool], mode: str) -> tuple[RoleBatch, list[Step]]:
    """The groups as the per-role rule reads them (:class:`~rllm_torch.rllm.role_plan.RoleBatch`,
    float64 scores) and the steps whose advantage it gives, in its step order: every step of
    every trajectory of the RL groups (``precomputed[g]``: the group keeps its own). In a turn
    ``mode``, each trained trajectory's turn rewards (:func:`~rllm_torch.rllm.stepwise.turn_rewards`),
    each step's trained tokens and, for ``gigpo``, its observation id.

    Raises:
        InvalidRewardsError / InvalidRewardTypeError / InvalidTrajectoryError: a trained
            trajectory's reward is not a real number, ``reward_components`` differ between
            trajectories, or a turn mode's step rewards or observations are missing; the message
            names the task, the trajectory and the step.
    """
    turn_mode = mode in TURN_MODES
    observation_ids = ObservationIds() if mode == "gigpo" else None
    pairs, tokens, trained, steps, step_counts, step_rewards, step_weights, observations = (
        [],
        [],
        [],
        [],
        [],
        [],
        [],
        [],
    )
    members, sizes = [], []  # per group
    for g, group in enumerate(groups):
        trajectories = group.trajectories if not precomputed[g] else []
        size = 0
        for traj in trajectories:
            trained_tokens = traj.trained_tokens()  # > 0: Trajectory.is_trained()
            token_free = not turn_mode and _token_free(traj)  # rLLM's: its reward counts, weight 1
            trained.append(trained_tokens > 0 or token_free)
            size += trained[-1]
            pairs.append((group, traj))
            tokens.append(1 if token_free else trained_tokens)
            steps.extend(traj.steps)
            step_counts.append(len(traj.steps))
            if turn_mode:
                step_rewards += (
                    turn_rewards(traj, _where(group, traj), mode) if trained_tokens else [0.0] * len(traj.steps)
                )
                step_weights += [float(step.response_mask_tensor().sum()) for step in traj.steps]
            if observation_ids is not None:
                observations += [
                    observation_ids(s.observation, _where(group, traj, i)) if trained_tokens else 0
                    for i, s in enumerate(traj.steps)
                ]
        members.append(len(trajectories))
        sizes.append(size)
    group_index = torch.repeat_interleave(torch.arange(len(groups)), torch.tensor(members, dtype=torch.int64))
    step_trajectory = torch.repeat_interleave(torch.arange(len(pairs)), torch.tensor(step_counts, dtype=torch.int64))
    values = [t.reward if is_trained else 0.0 for (_, t), is_trained in zip(pairs, trained, strict=True)]
    if not all_rewards_are_numbers(values):  # a list, array, string, None...: never read as a number
        _locate_bad_reward(pairs, trained)
    trained_pairs = [pair for pair, is_trained in zip(pairs, trained, strict=True) if is_trained]
    components = reward_components_tensor(trained_pairs)
    if components is not None:  # untrained trajectories' rows are not read
        full = components.new_zeros(len(pairs), components.shape[1])
        full[torch.tensor(trained, dtype=torch.bool)] = components
        components = full
    batch = RoleBatch(
        scores=torch.from_numpy(np.array(values, dtype=np.float64)).reshape(len(values)),
        group_index=group_index.reshape(len(pairs)),
        group_roles=[g.group_role for g in groups],
        step_trajectory=step_trajectory.reshape(len(steps)),
        trained=torch.tensor(trained, dtype=torch.bool),
        weights=torch.tensor(tokens, dtype=torch.float64).reshape(len(pairs)),
        reward_components=components,
        group_baselines=group_baselines_tensor(groups),
        group_precomputed=list(precomputed),
        group_sizes=sizes,
        step_rewards=torch.tensor(step_rewards, dtype=torch.float64) if turn_mode else None,
        step_weights=torch.tensor(step_weights, dtype=torch.float64) if turn_mode else None,
        step_observation=torch.tensor(observations, dtype=torch.int64) if observation_ids is not None else None,
        trajectory_groups=list(groups),
    )
    return batch, steps


def _token_free(traj: Trajectory) -> bool:
    """Whether no step of ``traj`` carries tokens: no ``response_ids`` and no ``response_mask``
    (rLLM's tests build trajectories of rewards only; rLLM's collector reads their reward and gives
    each step the estimator's advantage: rllm/trainer/algorithms/advantage.py,
    ``collect_reward_and_advantage_from_trajectory_groups``)."""
    return all(len(step.response_ids) == 0 and step.response_mask is None for step in traj.steps)


def _precomputed_writes(
    pre_groups: dict[str, list[TrajectoryGroup]], zeros_on_mismatch: bool = False
) -> tuple[list[tuple[Step, list]], dict[str, torch.Tensor]]:
    """``(writes, tokens_by_role)``: the per-token list to write on every step of the precomputed
    groups, and each role's token advantages (float64) for the metrics; warns once about steps
    without an advantage (they get zeros), and with ``zeros_on_mismatch`` once about per-token
    lists of the wrong length (zeros too, rLLM's rule)."""
    missing: list[str] = []
    mismatched: list[str] | None = [] if zeros_on_mismatch else None
    token_writes: list[tuple[Step, list]] = []
    tokens_by_role: dict[str, torch.Tensor] = {}
    for role, role_groups in pre_groups.items():
        entries = [entry for g in role_groups for entry in _precomputed_values(g, missing, mismatched)]
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
    if mismatched:
        warnings.warn(
            f"{len(mismatched)} step(s) of precomputed groups have an advantage whose length differs from their "
            f"response and get zeros (compat='rllm', as rLLM does; first: {mismatched[0]}).",
            UserWarning,
            stacklevel=3,
        )
    return token_writes, tokens_by_role
