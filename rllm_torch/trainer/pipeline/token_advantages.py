"""The default advantage step of a training backend, on the trainer's :class:`TokenBatch`:
each role's estimator once on its packed trajectories
(:func:`~rllm_torch.rllm.roles.role_advantages`, the same per-role step the collector runs),
broadcast to the rows' response tokens; token-level estimators on the role's ``[R, T]`` rows;
precomputed groups kept as the workflow wrote them.
"""

from __future__ import annotations

import torch

from rllm_torch.core.distributed import ONE_PROCESS, agree_across_ranks, gather_objects, resolve_process_group
from rllm_torch.core.errors import ConfigError
from rllm_torch.core.packing import GroupedRewards
from rllm_torch.core.tokens import TokenRewards, broadcast_to_tokens
from rllm_torch.core.turns import GroupedTurns
from rllm_torch.rllm.config import TURN_MODES, AlgorithmConfig
from rllm_torch.rllm.dispatch import compute_advantages
from rllm_torch.rllm.metrics import summary_metrics
from rllm_torch.rllm.registry import is_token_level
from rllm_torch.rllm.roles import role_advantages, role_estimator
from rllm_torch.rllm.stepwise import role_turn_advantages
from rllm_torch.trainer.pipeline.token_batch import TokenBatch

__all__ = ["compute_token_advantages", "token_level_rewards", "outcome_scores", "trained_token_counts"]


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
        if group is not None or tokens.numel():
            metrics |= summary_metrics(tokens, f"advantage/{role}", fraction_zero=True, process_group=group)
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
    batch: TokenBatch,
    estimator: object,
    in_role: list[bool],
    scores_N: torch.Tensor,
    kwargs: dict,
    group: object,
    role: str,
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
    tokens = TokenRewards(
        token_level_rewards(batch, rows),
        mask_RT,
        values=values,
        process_group=ONE_PROCESS if group is None else group,
        validate=False,
    )
    adv_RT, returns_RT = compute_advantages(tokens, estimator, **kwargs)
    adv_RT, returns_RT = adv_RT.to(torch.float32) * mask_RT, returns_RT.to(torch.float32) * mask_RT
    if batch.returns is None:
        batch.returns = torch.zeros_like(batch.response_mask)
    if rows is None:
        batch.advantages, batch.returns = adv_RT, returns_RT
    else:
        batch.advantages = batch.advantages.index_copy(0, rows, adv_RT)
        batch.returns = batch.returns.index_copy(0, rows, returns_RT)
    trained = mask_RT > 0
    metrics = summary_metrics(scores_N[in_role_G[batch.group_index]], f"reward/{role}", process_group=group)
    metrics |= summary_metrics(adv_RT[trained], f"advantage/{role}", fraction_zero=True, process_group=group)
    metrics |= summary_metrics(returns_RT[trained], f"returns/{role}", process_group=group)
    return metrics


def _role_remap(batch: TokenBatch, role: str, pre_G: list[bool]) -> tuple[torch.Tensor, int]:
    """``([G] int64, count)``: each group's index among the ``count`` RL groups of ``role``, -1
    for the others (built from the host lists: no sync)."""
    role_groups = [g for g, (r, p) in enumerate(zip(batch.group_roles, pre_G, strict=True)) if r == role and not p]
    remap_G = torch.full((batch.num_groups,), -1, dtype=torch.int64, device=batch.rewards.device)
    remap_G[role_groups] = torch.arange(len(role_groups), device=remap_G.device)
    return remap_G, len(role_groups)


def _turn_role(
    batch: TokenBatch,
    role: str,
    estimator: object,
    algorithm_config: AlgorithmConfig,
    pre_G: list[bool],
    trained_N: torch.Tensor,
    group: object,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """A turn mode's advantages of one role: ``(rows, adv_rows, metrics)``, the rows of the
    role's trained RL trajectories (each a turn, in order) and each one's advantage. A row's turn
    reward is its step's minus its summed ``reward_penalty``; its weight its trained tokens."""
    gigpo = algorithm_config.stepwise_advantage_mode == "gigpo"
    if batch.turn_rewards is None or (gigpo and batch.observation_index is None):
        raise ConfigError(
            f"rllm.stepwise_advantage.mode={algorithm_config.stepwise_advantage_mode!r} needs each step's reward "
            "(and gigpo its observation): build the batch with build_token_batch(..., stepwise_mode=<the mode>), "
            "which fills TokenBatch.turn_rewards and observation_index."
        )
    remap_G, num_groups = _role_remap(batch, role, pre_G)
    keep_N = (remap_G[batch.group_index] >= 0) & trained_N
    untrained = int(((remap_G[batch.group_index] >= 0) & ~trained_N).sum())
    dense_N = torch.cumsum(keep_N.long(), 0) - 1  # the kept trajectories, renumbered 0..n-1
    row_traj_R = _row_trajectories(batch)
    rows = torch.nonzero(keep_N[row_traj_R]).squeeze(1)
    rewards_M = batch.turn_rewards[rows]
    if batch.reward_penalty is not None:
        rewards_M = rewards_M - (batch.reward_penalty[rows] * batch.response_mask[rows]).sum(-1).to(rewards_M.dtype)
    turns = GroupedTurns.from_flat(
        rewards_M,
        dense_N[row_traj_R[rows]],
        remap_G[batch.group_index[keep_N]],
        num_groups=num_groups,
        observation_index=None if batch.observation_index is None else batch.observation_index[rows],
        weights=batch.response_mask[rows].sum(-1).to(torch.float64),
        process_group=ONE_PROCESS if group is None else group,
        local_groups=group is not None,
    )
    adv_M, metrics = role_turn_advantages(turns, role, estimator, algorithm_config, process_group=group)
    if count := sum(gather_objects(untrained, group)):
        metrics[f"advantage/{role}/num_untrained"] = float(count)
    return rows, adv_M, metrics


def compute_token_advantages(
    batch: TokenBatch, algorithm_config: AlgorithmConfig, *, process_group: object = ONE_PROCESS
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
        algorithm_config: the estimators and their options.
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
    pre_G = batch.group_precomputed or [False] * batch.num_groups
    roles = sorted({r for r, p in zip(batch.group_roles, pre_G, strict=True) if not p})
    pre_roles = sorted({r for r, p in zip(batch.group_roles, pre_G, strict=True) if p})
    if group is not None:
        everyone = agree_across_ranks(group, None, {"rl": roles, "pre": pre_roles}, must_match=())
        roles = sorted({r for facts in everyone for r in facts["rl"]})
        pre_roles = sorted({r for facts in everyone for r in facts["pre"]})
    ranks = {} if group is None else {"process_group": group, "local_groups": True}
    trained_N = _trained_trajectories(batch)
    all_trained = bool(trained_N.all())  # one host sync
    scores_N, lengths_N = outcome_scores(batch), trained_token_counts(batch)
    adv_N = torch.zeros_like(batch.rewards)
    metrics: dict[str, float] = {}
    estimators = {role: role_estimator(role, algorithm_config) for role in roles}
    token_roles = [role for role in roles if is_token_level(estimators[role])]
    if algorithm_config.stepwise_advantage_mode in TURN_MODES:
        row_adv_R = torch.zeros(batch.input_ids.shape[0], dtype=torch.float64, device=batch.rewards.device)
        for role in roles:
            rows, adv_M, role_metrics = _turn_role(
                batch, role, estimators[role], algorithm_config, pre_G, trained_N, group
            )
            row_adv_R = row_adv_R.index_copy(0, rows, adv_M.to(row_adv_R.dtype))
            metrics |= role_metrics
        batch.advantages = broadcast_to_tokens(row_adv_R, batch.response_mask)
        if pre_roles:
            metrics |= _keep_precomputed(batch, pre_G, pre_roles, group)
        return metrics
    for role in roles:
        if role in token_roles:
            continue
        components_N = batch.reward_components
        if len(roles) == 1 and not any(pre_G) and all_trained:
            rows_N, rewards_N, weights_N = None, scores_N, lengths_N
            group_index_N, num_groups, untrained = batch.group_index, batch.num_groups, 0
        else:
            remap_G, num_groups = _role_remap(batch, role, pre_G)
            in_role_N = remap_G[batch.group_index] >= 0
            untrained = int((in_role_N & ~trained_N).sum())
            rows_N = torch.nonzero(in_role_N & trained_N).squeeze(1)  # untrained: out of the statistics, advantage 0
            rewards_N, weights_N = scores_N[rows_N], lengths_N[rows_N]
            group_index_N = remap_G[batch.group_index[rows_N]]
            components_N = None if components_N is None else components_N[rows_N]
        packed = GroupedRewards.from_flat(
            rewards_N,
            group_index_N,
            num_groups=num_groups,
            weights=weights_N,
            reward_components=components_N,
            validate=False,
            **ranks,
        )
        role_adv_N, role_metrics = role_advantages(
            packed, role, estimators[role], algorithm_config, num_untrained=untrained, process_group=group
        )
        metrics |= role_metrics
        role_adv_N = role_adv_N.to(adv_N.dtype)
        adv_N = role_adv_N if rows_N is None else adv_N.index_copy(0, rows_N, role_adv_N)
    row_adv_R = adv_N if batch.row_index is None else adv_N[batch.row_index]
    if algorithm_config.normalize_by_steps:  # rLLM's: each step's share of its trajectory's advantage
        row_traj_R = _row_trajectories(batch)
        row_adv_R = row_adv_R / torch.bincount(row_traj_R, minlength=adv_N.shape[0]).to(row_adv_R.dtype)[row_traj_R]
    batch.advantages = broadcast_to_tokens(row_adv_R, batch.response_mask)  # float32 tokens; float64 statistics above
    for role in token_roles:
        estimator = estimators[role]
        in_role = [r == role and not p for r, p in zip(batch.group_roles, pre_G, strict=True)]
        kwargs = algorithm_config.estimator_call_kwargs(estimator)
        metrics |= _token_level_role(batch, estimator, in_role, scores_N, kwargs, group, role)
    if pre_roles:
        metrics |= _keep_precomputed(batch, pre_G, pre_roles, group)
    return metrics
