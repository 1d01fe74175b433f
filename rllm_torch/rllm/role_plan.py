"""The per-role rule of rLLM's advantage step, written once for its two callers: the collector
(:func:`~rllm_torch.rllm.collect.collect_reward_and_advantage_from_trajectory_groups`, on
trajectory objects) and the trainer's token batch
(:func:`~rllm_torch.trainer.pipeline.token_advantages.compute_token_advantages`, on tensors).
Each caller keeps only its adapter: it describes its batch as plain tensors (:class:`RoleBatch`)
and writes the per-step advantages :func:`compute_role_advantages` returns where its steps live.

The rule, for the RL groups of each role (``group_role``; groups with precomputed advantages and
roles whose estimator is token-level are the caller's, see :class:`RoleAdvantages`):

1. the roles are agreed across ranks (every rank computes every role, in one order) and any
   rank's input error is raised on every rank;
2. the role's estimator is ``estimator_map[role]``, else ``estimator``
   (its :class:`~rllm_torch.rllm.plan.RolePlan`, resolved once), with the run's options;
3. its trained trajectories (:meth:`~rllm_torch.rllm.types.Trajectory.is_trained`) are packed
   once (a dense ``[G, K]`` view when the caller knows every group has ``K`` of them) and the
   estimator runs once; an untrained trajectory takes no part and gets 0
   (``advantage/{role}/num_untrained`` counts them);
4. ``broadcast`` gives each step its trajectory's advantage (divided by its number of steps
   with ``normalize_by_steps``); a turn mode gives each step its own
   (:func:`~rllm_torch.rllm.stepwise.role_turn_advantages`);
5. the role's ``reward/*``, ``advantage/*`` (and ``turns/*``, ``batch/{role}/*`` difficulty) metrics, over
   every rank; a role whose advantages are per token (precomputed, token-level) gets its
   metrics from :func:`token_advantage_metrics`, which the callers use for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from rllm_torch.core.distributed import agree_across_ranks, gather_objects
from rllm_torch.core.packing import GroupedRewards
from rllm_torch.core.turns import GroupedTurns
from rllm_torch.rllm.bound_estimator import BoundEstimator
from rllm_torch.rllm.config import TURN_MODES, AlgorithmConfig
from rllm_torch.rllm.metrics import summary_metrics
from rllm_torch.rllm.plan import AdvantagePlan, RolePlan
from rllm_torch.rllm.roles import estimator_inputs
from rllm_torch.rllm.stepwise import role_turn_advantages

__all__ = [
    "RoleBatch",
    "RoleAdvantages",
    "compute_role_advantages",
    "role_reward_metrics",
    "token_advantage_metrics",
]


@dataclass
class RoleBatch:
    """A batch's trajectories and steps as the per-role rule reads them (tensors on one device).

    ``N`` trajectories in ``G`` groups, ``M`` steps; a trajectory's steps in order.

    Attributes:
        scores: ``[N]`` float64 the score each trajectory's estimator sees (its reward, minus a
            KL penalty in the reward).
        group_index: ``[N]`` int64 group of each trajectory, ``0 .. G-1``, groups in order.
        group_roles: ``G`` host strs: each group's role.
        step_trajectory: ``[M]`` int64 trajectory of each step.
        trained: ``[N]`` bool, whether a trajectory has a trained token; None: all do.
        weights: ``[N]`` float64 each trajectory's trained tokens (``opo``'s lengths), or None.
        reward_components: ``[N, R]`` float64 (``gdpo``), or None.
        group_baselines: ``[G]`` float64 each group's greedy reward (``remax``; NaN where a
            group has none), or None.
        group_precomputed: ``G`` host bools: a group whose steps carry precomputed advantages
            (the caller keeps them); None: none does.
        group_sizes: ``G`` host ints, each group's trained trajectories, when the caller knows
            them without a device sync (they pick the dense ``[G, K]`` view); None: unknown.
        step_rewards, step_weights, step_observation: ``[M]`` each step's turn reward, trained
            tokens and observation id (``gigpo``): the turn modes' input, None in ``broadcast``.
        trajectory_groups: ``G`` host objects, each group's ``TrajectoryGroup`` (its trajectories
            in the batch's flat order), for an estimator that reads rLLM's ``traj_groups``; None:
            the caller has none.
        error: the error this rank met describing its batch (the batch is then empty): raised
            on every rank by the rule, after the ranks meet, so that none waits for it.
    """

    scores: Tensor
    group_index: Tensor
    group_roles: list[str]
    step_trajectory: Tensor
    trained: Tensor | None = None
    weights: Tensor | None = None
    reward_components: Tensor | None = None
    group_baselines: Tensor | None = None
    group_precomputed: list[bool] | None = None
    group_sizes: list[int] | None = None
    step_rewards: Tensor | None = None
    step_weights: Tensor | None = None
    step_observation: Tensor | None = None
    trajectory_groups: list | None = None
    error: Exception | None = None

    @property
    def num_groups(self) -> int:
        return len(self.group_roles)

    def rl_groups(self, role: str) -> list[int]:
        """The groups of ``role`` without precomputed advantages (host ints, in order)."""
        pre = self.group_precomputed or [False] * self.num_groups
        return [g for g, (r, p) in enumerate(zip(self.group_roles, pre, strict=True)) if r == role and not p]


@dataclass
class RoleAdvantages:
    """What :func:`compute_role_advantages` gives back.

    Attributes:
        steps: ``[M]`` float64 each step's advantage; 0 for untrained trajectories and for the
            groups the caller handles (precomputed, token-level roles).
        metrics: every RL role's metrics (Python floats, over every rank).
        by_role: each RL role's advantages as its metrics summarised them (one per trained
            trajectory in ``broadcast``, one per step in a turn mode).
        token_level_roles: the roles whose estimator is token-level (the caller runs them on its
            tokens; the collector refuses them).
        precomputed_roles: the roles with precomputed groups on some rank.
        packed: each RL role's packed trained trajectories (the collector's difficulty metrics).
    """

    steps: Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    by_role: dict[str, Tensor] = field(default_factory=dict)
    token_level_roles: list[str] = field(default_factory=list)
    precomputed_roles: list[str] = field(default_factory=list)
    packed: dict[str, GroupedRewards] = field(default_factory=dict)


def compute_role_advantages(batch: RoleBatch, plan: AdvantagePlan, *, process_group: object = None) -> RoleAdvantages:
    """The per-role rule (module docstring) on one rank's batch: each RL role's
    :class:`~rllm_torch.rllm.plan.RolePlan` estimator called once on its packed trained trajectories.

    Args:
        batch: this rank's trajectories and steps (an empty batch carrying this rank's ``error``
            on a rank that could not describe its own).
        plan: each role's estimator, bound once for the run.
        process_group: None (one process) or the resolved ``ProcessGroup`` whose ranks hold the
            rest of the batch (rank-local groups); every rank must call.

    Raises:
        ValueError: ``batch.error`` of any rank (under a process group, on every rank), or what
            the estimator raises on its input.
    """
    roles, pre_roles = _agreed_roles(batch, process_group)
    config = plan.algorithm_config
    turn_mode = config.stepwise_advantage_mode in TURN_MODES
    out = RoleAdvantages(torch.zeros(batch.step_trajectory.shape[0], dtype=torch.float64, device=batch.scores.device))
    out.precomputed_roles = pre_roles
    trained_N = batch.trained if batch.trained is not None else torch.ones_like(batch.group_index, dtype=torch.bool)
    all_trained = batch.trained is None or bool(trained_N.all())  # one host sync
    adv_N = torch.zeros_like(batch.scores, dtype=torch.float64)
    for role in roles:
        role_plan = plan.role(role)
        if role_plan.token_level:
            out.token_level_roles.append(role)
            continue
        rows_N, packed, untrained = _pack_role(batch, role, trained_N, all_trained, len(roles) == 1, process_group)
        out.packed[role] = packed
        if turn_mode:
            steps_M, role_adv, metrics = _turn_role(batch, role, rows_N, role_plan.estimator, config, process_group)
            out.steps = (
                out.steps.index_copy(0, steps_M, role_adv.double()) if steps_M is not None else role_adv.double()
            )
        else:
            role_adv, metrics = _outcome_role(batch, role_plan, packed, rows_N, process_group)
            adv_N = role_adv if rows_N is None else adv_N.index_copy(0, rows_N, role_adv)
        if count := sum(gather_objects(untrained, process_group)):
            metrics[f"advantage/{role}/num_untrained"] = float(count)
        out.by_role[role], out.metrics = role_adv.double(), out.metrics | metrics
    if turn_mode:
        return out
    steps_M = adv_N[batch.step_trajectory]
    if config.normalize_by_steps:  # rLLM's: each step's share of its trajectory's advantage
        counts_N = torch.bincount(batch.step_trajectory, minlength=adv_N.shape[0]).to(steps_M.dtype)
        steps_M = steps_M / counts_N[batch.step_trajectory]
    out.steps = steps_M
    return out


def _outcome_role(
    batch: RoleBatch, role_plan: RolePlan, packed: GroupedRewards, rows_N: Tensor | None, process_group: object
) -> tuple[Tensor, dict[str, float]]:
    """The role's estimator, once, on its packed trained trajectories: ``(adv_N, metrics)`` in
    ``packed``'s flat order (float64; empty, the estimator not called, when no rank holds one of
    them), ``reward/{role}/*`` and ``advantage/{role}/*`` (with ``fraction_zero``) over every rank."""
    role = role_plan.role
    inputs = estimator_inputs(batch, role, role_plan.estimator, process_group, rows_N) or {}
    metrics: dict[str, float] = {}
    if process_group is not None or packed.num_trajectories:
        metrics = summary_metrics(packed.rewards, f"reward/{role}", process_group=process_group)
    if not metrics:  # no rank holds a trajectory of the role (the same answer on every rank)
        return packed.rewards.new_zeros(0, dtype=torch.float64), metrics
    adv_N, _ = role_plan.estimator(packed, **inputs)
    metrics |= summary_metrics(adv_N, f"advantage/{role}", fraction_zero=True, process_group=process_group)
    return adv_N.to(torch.float64), metrics


def role_reward_metrics(batch: RoleBatch, *, process_group: object = None) -> dict[str, float]:
    """``reward/{role}/*`` of each RL role over its trained trajectories, no estimator run
    (validation's metrics); collectives and errors as :func:`compute_role_advantages`."""
    roles, _ = _agreed_roles(batch, process_group)
    trained_N = batch.trained if batch.trained is not None else torch.ones_like(batch.group_index, dtype=torch.bool)
    all_trained = batch.trained is None or bool(trained_N.all())
    metrics: dict[str, float] = {}
    for role in roles:
        _, packed, _ = _pack_role(batch, role, trained_N, all_trained, len(roles) == 1, process_group)
        if process_group is not None or packed.num_trajectories:
            metrics |= summary_metrics(packed.rewards, f"reward/{role}", process_group=process_group)
    return metrics


def _agreed_roles(batch: RoleBatch, process_group: object) -> tuple[list[str], list[str]]:
    """The RL roles and the precomputed roles of every rank (sorted), and any rank's
    ``batch.error`` raised on every rank (one ``all_gather_object``)."""
    roles, pre_roles = _roles(batch), _precomputed_roles(batch)
    if process_group is None:
        if batch.error is not None:
            raise batch.error
        return roles, pre_roles
    everyone = agree_across_ranks(process_group, batch.error, {"rl": roles, "pre": pre_roles}, must_match=())
    return sorted({r for facts in everyone for r in facts["rl"]}), sorted(
        {r for facts in everyone for r in facts["pre"]}
    )


def token_advantage_metrics(
    role: str,
    advantages: Tensor,
    *,
    scores: Tensor | None = None,
    returns: Tensor | None = None,
    process_group: object = None,
) -> dict[str, float]:
    """The metrics of a role whose advantages are per token (precomputed groups, token-level
    estimators), the per-role rule's other case: ``advantage/{role}/*`` (with ``fraction_zero``)
    over ``advantages`` (the tokens the caller counts), ``reward/{role}/*`` over ``scores`` and
    ``returns/{role}/*`` over ``returns`` when given. Over every rank of ``process_group``; ``{}``
    on one process for no values.
    """
    metrics: dict[str, float] = {}
    if scores is not None:
        metrics |= summary_metrics(scores, f"reward/{role}", process_group=process_group)
    if process_group is not None or advantages.numel():
        metrics |= summary_metrics(advantages, f"advantage/{role}", fraction_zero=True, process_group=process_group)
    if returns is not None:
        metrics |= summary_metrics(returns, f"returns/{role}", process_group=process_group)
    return metrics


def _roles(batch: RoleBatch) -> list[str]:
    pre = batch.group_precomputed or [False] * batch.num_groups
    return sorted({r for r, p in zip(batch.group_roles, pre, strict=True) if not p})


def _precomputed_roles(batch: RoleBatch) -> list[str]:
    pre = batch.group_precomputed or [False] * batch.num_groups
    return sorted({r for r, p in zip(batch.group_roles, pre, strict=True) if p})


def _pack_role(
    batch: RoleBatch, role: str, trained_N: Tensor, all_trained: bool, only_role: bool, process_group: object
) -> tuple[Tensor | None, GroupedRewards, int]:
    """``(rows_N, packed, untrained)``: the role's trained RL trajectories (``rows_N`` None: all of
    the batch's, in its order, with no selection and no host sync), packed once, and this rank's
    count of the role's untrained ones."""
    ranks = {} if process_group is None else {"process_group": process_group, "local_groups": True}
    groups = batch.rl_groups(role)
    sizes = None if batch.group_sizes is None else [batch.group_sizes[g] for g in groups]
    if only_role and all_trained and len(groups) == batch.num_groups:
        rows_N, group_index_N, untrained = None, batch.group_index, 0
    else:
        remap_G = torch.full((batch.num_groups,), -1, dtype=torch.int64, device=batch.group_index.device)
        remap_G[groups] = torch.arange(len(groups), device=remap_G.device)
        in_role_N = remap_G[batch.group_index] >= 0
        untrained = int((in_role_N & ~trained_N).sum())
        rows_N = torch.nonzero(in_role_N & trained_N).squeeze(1)  # untrained: out of the statistics, advantage 0
        group_index_N = remap_G[batch.group_index[rows_N]]

    def pick(x: Tensor | None) -> Tensor | None:
        return x if x is None or rows_N is None else x[rows_N]

    scores_N, weights_N, components_NR = pick(batch.scores), pick(batch.weights), pick(batch.reward_components)
    if sizes and sizes[0] > 0 and sizes.count(sizes[0]) == len(sizes):  # every group has K trained members
        shape = (len(sizes), sizes[0])
        extra = {} if components_NR is None else {"reward_components": components_NR.view(*shape, -1)}
        weights = None if weights_N is None else weights_N.view(shape)
        packed = GroupedRewards.from_padded(scores_N.view(shape), weights=weights, validate=False, **extra, **ranks)
    else:
        packed = GroupedRewards.from_flat(
            scores_N,
            group_index_N,
            num_groups=len(groups),
            weights=weights_N,
            reward_components=components_NR,
            validate=False,
            **ranks,
        )
    return rows_N, packed, untrained


def _turn_role(
    batch: RoleBatch,
    role: str,
    rows_N: Tensor | None,
    estimator: BoundEstimator,
    algorithm_config: AlgorithmConfig,
    process_group: object,
) -> tuple[Tensor | None, Tensor, dict[str, float]]:
    """A turn mode's advantages of one role: ``(steps, adv, metrics)``, the steps of the role's
    trained RL trajectories (None: every step of the batch) and each one's advantage."""
    groups = batch.rl_groups(role)
    if rows_N is None:
        steps_M, trajectory_M, group_N = None, batch.step_trajectory, batch.group_index
    else:
        dense_N = torch.full_like(batch.group_index, -1)
        dense_N[rows_N] = torch.arange(rows_N.shape[0], device=rows_N.device)  # the role's trajectories, renumbered
        steps_M = torch.nonzero(dense_N[batch.step_trajectory] >= 0).squeeze(1)
        trajectory_M = dense_N[batch.step_trajectory[steps_M]]
        remap_G = torch.full((batch.num_groups,), -1, dtype=torch.int64, device=batch.group_index.device)
        remap_G[groups] = torch.arange(len(groups), device=remap_G.device)
        group_N = remap_G[batch.group_index[rows_N]]

    def pick(x: Tensor | None) -> Tensor | None:
        return x if x is None or steps_M is None else x[steps_M]

    turns = GroupedTurns.from_flat(
        pick(batch.step_rewards),
        trajectory_M,
        group_N,
        num_groups=len(groups),
        observation_index=pick(batch.step_observation),
        weights=pick(batch.step_weights),
    ).rank_local(process_group)
    adv_M, metrics = role_turn_advantages(turns, role, estimator, algorithm_config, process_group=process_group)
    return steps_M, adv_M, metrics
