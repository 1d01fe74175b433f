"""The default advantage step of a training backend, on the trainer's :class:`TokenBatch`: the
per-role rule (:func:`~rllm_torch.rllm.role_plan.compute_role_advantages`, the collector's too)
on the batch described as tensors (:func:`role_batch`), its per-step advantages broadcast to the
rows' response tokens; token-level estimators on their role's ``[R, T]`` rows; precomputed
groups kept as the workflow wrote them.
"""

from __future__ import annotations

import torch

from rllm_torch.core.distributed import ONE_PROCESS, resolve_process_group
from rllm_torch.core.errors import ConfigError
from rllm_torch.core.tokens import TokenRewards, broadcast_to_tokens
from rllm_torch.rllm.bound_estimator import BoundEstimator
from rllm_torch.rllm.config import TURN_MODES, AlgorithmConfig
from rllm_torch.rllm.plan import AdvantagePlan
from rllm_torch.rllm.role_plan import RoleBatch, compute_role_advantages, token_advantage_metrics
from rllm_torch.trainer.pipeline.token_batch import TokenBatch

__all__ = ["compute_token_advantages", "role_batch", "token_level_rewards", "outcome_scores", "trained_token_counts"]


def _keep_precomputed(batch: TokenBatch, pre_G: list[bool], pre_roles: list[str], group) -> dict[str, float]:
    """Rows of precomputed groups take ``batch.precomputed_advantages`` as written; returns the
    ``advantage/{role}/*`` metrics of each precomputed role (``pre_roles``: those of every rank)
    over its trained tokens."""
    device = batch.group_index.device
    row_traj_R = (
        batch.row_index if batch.row_index is not None else torch.arange(batch.input_ids.shape[0], device=device)
    )
    row_group_R = batch.group_index[row_traj_R]
    if any(pre_G):
        row_pre_R = torch.tensor(pre_G, device=device)[row_group_R]
        batch.advantages = torch.where(row_pre_R[:, None], batch.precomputed_advantages, batch.advantages)
    metrics: dict[str, float] = {}
    for role in pre_roles:
        in_role_G = torch.tensor(
            [p and r == role for r, p in zip(batch.group_roles, pre_G, strict=True)], dtype=torch.bool, device=device
        )
        tokens = (
            batch.precomputed_advantages[in_role_G[row_group_R][:, None] & (batch.response_mask > 0)]
            if any(pre_G)
            else batch.advantages.new_zeros(0)
        )
        metrics |= token_advantage_metrics(role, tokens, process_group=group)
    return metrics


def _trained_trajectories(batch: TokenBatch) -> torch.Tensor:
    """``[N]`` bool: whether a trajectory has a trained token in any of its rows."""
    row_trained_R = (batch.response_mask.sum(-1) > 0).to(batch.rewards.dtype)
    if batch.row_index is None:
        return row_trained_R > 0
    return torch.zeros_like(batch.rewards).index_add_(0, batch.row_index, row_trained_R) > 0


def _row_trajectories(batch: TokenBatch) -> torch.Tensor:
    """``[R]`` the trajectory of each row."""
    if batch.row_index is not None:
        return batch.row_index
    return torch.arange(batch.input_ids.shape[0], device=batch.rewards.device)


def trained_token_counts(batch: TokenBatch) -> torch.Tensor:
    """``[N]`` float64: each trajectory's trained token count over all its rows (OPO's lengths)."""
    row_tokens_R = batch.response_mask.sum(-1).to(torch.float64)
    return torch.zeros_like(batch.rewards, dtype=torch.float64).index_add_(0, _row_trajectories(batch), row_tokens_R)


def outcome_scores(batch: TokenBatch) -> torch.Tensor:
    """``[N]`` the trajectory rewards, minus each trajectory's summed per-token ``reward_penalty``
    (KL in the reward) when there is one: the scores outcome estimators see."""
    if batch.reward_penalty is None:
        return batch.rewards
    penalty_R = (batch.reward_penalty * batch.response_mask).sum(-1).to(batch.rewards.dtype)
    return batch.rewards - torch.zeros_like(batch.rewards).index_add_(0, _row_trajectories(batch), penalty_R)


def token_level_rewards(batch: TokenBatch, rows: torch.Tensor | None = None) -> torch.Tensor:
    """``[R, T]`` float32 token rewards of ``rows`` (all by default): the trajectory's reward on
    each row's last trained token (every step of a multi-step trajectory ends with the
    trajectory's outcome, as rLLM's broadcast mode gives it to every step), minus
    ``reward_penalty`` on every trained token."""
    rows = slice(None) if rows is None else rows
    mask_RT = batch.response_mask[rows]
    width = mask_RT.shape[1]
    positions_T = torch.arange(width, device=mask_RT.device)
    last_R = torch.where(mask_RT > 0, positions_T, -1).amax(-1) if width else mask_RT.new_zeros(mask_RT.shape[0])
    reward_R = batch.rewards[_row_trajectories(batch)[rows]].to(torch.float32)
    rewards_RT = torch.where(positions_T == last_R[:, None], reward_R[:, None], 0.0)
    if batch.reward_penalty is not None:
        rewards_RT = rewards_RT - batch.reward_penalty[rows]
    return rewards_RT * mask_RT


def _token_level_role(
    batch: TokenBatch, estimator: BoundEstimator, in_role: list[bool], scores_N: torch.Tensor, group: object, role: str
) -> dict[str, float]:
    """Token-level estimator of one role (``in_role``: whether each group is one of its RL
    groups, a host list): over the role's rows, written into ``batch.advantages`` and
    ``batch.returns``; returns the role's metrics (over its trained tokens). When every group
    is the role's, no row is selected (no host sync)."""
    in_role_G = torch.tensor(in_role, dtype=torch.bool, device=batch.group_index.device)
    rows = None
    if not all(in_role):
        rows = torch.nonzero(in_role_G[batch.group_index[_row_trajectories(batch)]]).squeeze(1)
    select = slice(None) if rows is None else rows
    mask_RT = batch.response_mask[select]
    values = None if batch.values is None else batch.values[select]

    def pick(x):
        return None if x is None else x[select]

    tokens = TokenRewards(
        token_level_rewards(batch, rows),
        mask_RT,
        values=values,
        old_log_probs=pick(batch.old_log_probs),
        sum_pi_squared=pick(batch.sum_pi_squared),
        group_index=batch.group_index[_row_trajectories(batch)][select],
        importance_weights=pick(batch.extras.get("rollout_is_weights")),
        process_group=ONE_PROCESS if group is None else group,
        validate=False,
    )
    adv_RT, returns_RT = estimator(tokens)
    adv_RT, returns_RT = adv_RT.to(torch.float32) * mask_RT, returns_RT.to(torch.float32) * mask_RT
    if batch.returns is None:
        batch.returns = torch.zeros_like(batch.response_mask)
    if rows is None:
        batch.advantages, batch.returns = adv_RT, returns_RT
    else:
        batch.advantages = batch.advantages.index_copy(0, rows, adv_RT)
        batch.returns = batch.returns.index_copy(0, rows, returns_RT)
    trained = mask_RT > 0
    return token_advantage_metrics(
        role,
        adv_RT[trained],
        scores=scores_N[in_role_G[batch.group_index]],
        returns=returns_RT[trained],
        process_group=group,
    )


def compute_token_advantages(
    batch: TokenBatch, plan: AdvantagePlan | AlgorithmConfig, *, process_group: object = ONE_PROCESS
) -> dict[str, float]:
    """Write ``batch.advantages [R, T]``: each row's trajectory advantage times the row's own
    response mask (``adv_N[row_index][:, None] * response_mask``), per role; rows of precomputed
    groups take ``batch.precomputed_advantages`` unchanged instead; rows of a role whose
    estimator is token-level (``reinforce_plus_plus``, ``gae``) get its ``[R, T]`` advantages,
    and ``batch.returns`` its returns (the critic's targets).

    Outcome estimators see each trajectory's score: its reward minus the sum of
    ``batch.reward_penalty`` over its trained tokens (KL in the reward; verl sums the penalised
    token rewards the same way), its trained token count as its weight (OPO's length), and
    ``batch.reward_components`` when there are some (``gdpo``; the KL penalty is not in them).
    Token-level estimators see :func:`token_level_rewards` (the reward on each row's last
    trained token, minus the penalty on every trained token) and ``batch.values``; their
    whitening is over every trained token of the role's rows on every rank.

    Each role's RL trajectories are packed with ``GroupedRewards.from_flat(rewards_N,
    group_index_N, num_groups=G, validate=False)`` and the role's estimator (``estimator_map[role]``,
    else ``estimator``) is called once with ``algorithm_config.estimator_call_kwargs``. A trajectory
    none of whose rows has a trained token (response mask all 0) takes no part in the
    statistics and gets advantage 0 (``advantage/{role}/num_untrained`` counts them). The path
    stays on the batch's device: one host sync to find untrained trajectories, and, with
    several roles, precomputed groups or untrained trajectories, one per role to select its rows.
    Statistics are computed in the rewards' dtype (float64 from the trainer); the token-level
    advantages are float32. Advantages never pass through Python floats.

    Args:
        batch: this rank's batch.
        plan: each role's estimator and its options (the trainer's, resolved once for the run), or
            the :class:`AlgorithmConfig` to resolve one from.
        process_group: ``ONE_PROCESS`` (default), or the run's ``ProcessGroup`` when each rank
            holds part of the batch (every rank must call). The groups are rank-local (the
            ``n`` rollouts of a prompt are on one rank): group statistics stay on the rank,
            batch statistics and every metric are over all ranks. The roles are agreed first
            (one ``all_gather_object``), so a role that only some ranks hold is still computed
            everywhere.

    Returns:
        ``reward/{role}/*`` and ``advantage/{role}/*`` summary metrics (Python floats); for a
        precomputed or token-level role, ``advantage/{role}/*`` summarise its trained tokens
        (and ``returns/{role}/*`` its returns, for a token-level one).

    Raises:
        UnknownEstimatorError: a role's estimator is not registered.
    """
    group = resolve_process_group(process_group)
    plan = AdvantagePlan.of(plan)
    algorithm_config = plan.algorithm_config
    mode = algorithm_config.stepwise_advantage_mode
    if mode in TURN_MODES and (batch.turn_rewards is None or (mode == "gigpo" and batch.observation_index is None)):
        raise ConfigError(
            f"rllm.stepwise_advantage.mode={mode!r} needs each step's reward (and gigpo its observation): build the "
            "batch with build_token_batch(..., stepwise_mode=<the mode>), which fills TokenBatch.turn_rewards and "
            "observation_index."
        )
    result = compute_role_advantages(role_batch(batch), plan, process_group=group)
    metrics = result.metrics
    batch.advantages = broadcast_to_tokens(result.steps, batch.response_mask)  # float32 tokens; float64 statistics
    if result.token_level_roles:
        scores_N = outcome_scores(batch)
        pre_G = batch.group_precomputed or [False] * batch.num_groups
        for role in result.token_level_roles:
            in_role = [r == role and not p for r, p in zip(batch.group_roles, pre_G, strict=True)]
            metrics |= _token_level_role(batch, plan.role(role).estimator, in_role, scores_N, group, role)
    if result.precomputed_roles:
        pre_G = batch.group_precomputed or [False] * batch.num_groups
        metrics |= _keep_precomputed(batch, pre_G, result.precomputed_roles, group)
    return metrics


def role_batch(batch: TokenBatch) -> RoleBatch:
    """The token batch as the per-role rule reads it (:class:`~rllm_torch.rllm.role_plan.RoleBatch`):
    each trajectory's score (:func:`outcome_scores`) and trained token count, each row a step; in
    a turn mode each row's turn reward minus its summed ``reward_penalty``, its trained tokens and
    its observation id."""
    row_traj_R = _row_trajectories(batch)
    step_rewards = batch.turn_rewards
    if step_rewards is not None and batch.reward_penalty is not None:
        step_rewards = step_rewards - (batch.reward_penalty * batch.response_mask).sum(-1).to(step_rewards.dtype)
    return RoleBatch(
        scores=outcome_scores(batch),
        group_index=batch.group_index,
        group_roles=batch.group_roles,
        step_trajectory=row_traj_R,
        trained=_trained_trajectories(batch),
        weights=trained_token_counts(batch),
        reward_components=batch.reward_components,
        group_baselines=batch.group_baselines,
        group_precomputed=batch.group_precomputed,
        step_rewards=step_rewards,
        step_weights=None if batch.turn_rewards is None else batch.response_mask.sum(-1).to(torch.float64),
        step_observation=batch.observation_index,
        trajectory_groups=batch.trajectory_groups,
    )
