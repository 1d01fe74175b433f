"""``BackendProtocol``: what a training backend provides to the unified trainer, and the default
tensor-path advantage computation.

The trainer calls, per batch: ``generate_episodes`` → (transform, filtering) →
``transform_to_backend_batch`` → ``process_backend_batch`` → ``compute_advantages`` →
``update_policy``; and the ``on_*`` hooks around training, epochs, batches and validation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

import torch
from omegaconf import DictConfig

from rllm_torch.core.distributed import ONE_PROCESS, agree_across_ranks, gather_objects, resolve_process_group
from rllm_torch.core.packing import GroupedRewards
from rllm_torch.core.tokens import TokenRewards, broadcast_to_tokens
from rllm_torch.rllm.collect import _estimator_of
from rllm_torch.rllm.config import AlgorithmConfig
from rllm_torch.rllm.metrics import summary_metrics
from rllm_torch.rllm.registry import compute_advantages, is_token_level
from rllm_torch.trainer.ranks import RunRanks
from rllm_torch.trainer.state import TrainerState
from rllm_torch.trainer.token_batch import TokenBatch

__all__ = ["BackendProtocol", "compute_token_advantages"]


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
    token_roles = [role for role in roles if is_token_level(_estimator_of(role, algorithm_config))]
    for role in roles:
        if role in token_roles:
            continue
        estimator = _estimator_of(role, algorithm_config)
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
        role_adv_N, _ = compute_advantages(packed, estimator, **algorithm_config.estimator_call_kwargs(estimator))
        role_adv_N = role_adv_N.to(adv_N.dtype)
        adv_N = role_adv_N if rows_N is None else adv_N.index_copy(0, rows_N, role_adv_N)
        if group is not None or rewards_N.numel():
            metrics |= summary_metrics(rewards_N, f"reward/{role}", process_group=group)
            metrics |= summary_metrics(role_adv_N, f"advantage/{role}", fraction_zero=True, process_group=group)
        if count := sum(gather_objects(untrained, group)):
            metrics[f"advantage/{role}/num_untrained"] = float(count)
    row_adv_R = adv_N if batch.row_index is None else adv_N[batch.row_index]
    batch.advantages = broadcast_to_tokens(row_adv_R, batch.response_mask)  # float32 tokens; float64 statistics above
    for role in token_roles:
        estimator = _estimator_of(role, algorithm_config)
        in_role = [r == role and not p for r, p in zip(batch.group_roles, pre_G, strict=True)]
        kwargs = algorithm_config.estimator_call_kwargs(estimator)
        metrics |= _token_level_role(batch, estimator, in_role, scores_N, kwargs, group, role)
    if pre_roles:
        metrics |= _keep_precomputed(batch, pre_G, pre_roles, group)
    return metrics


class BackendProtocol(ABC):
    """Abstract base of training backends (rLLM's ``BackendProtocol``).

    A subclass is built as ``backend_cls(config=config, ranks=ranks, **backend_args)``. The
    methods that touch the model are abstract; the hooks default to doing nothing, and
    :meth:`compute_advantages` defaults to the tensor estimators on a :class:`TokenBatch`.

    In a run of several processes (``ranks.world_size > 1``) the trainer calls every method on
    every rank, each with its own share of the batch; a backend must then keep its collectives
    in step across the ranks, also on a rank whose share of a step is empty.
    """

    name: str = "base"

    def __init__(self, config: DictConfig, ranks: RunRanks | None = None, **kwargs: Any) -> None:
        self.config = config
        self.ranks = ranks if ranks is not None else RunRanks()

    # ---- set-up ----------------------------------------------------------------------------
    @abstractmethod
    def init_rollout_engine(self, **kwargs: Any) -> Any:
        """Build and return the rollout engine the workflows sample from."""

    def validate_config(self) -> None:
        """Raise :class:`~rllm_torch.core.errors.ConfigError` for backend settings that cannot work."""

    def validate_prompts(self, tasks: list[dict]) -> None:
        """Raise :class:`~rllm_torch.core.errors.ConfigError` for task prompts the backend cannot
        serve (e.g. too long for the model's context); called at start-up with every training
        and validation task. The default: no check."""

    @abstractmethod
    def get_dataloader(self, dataset: Any, trainer_state: TrainerState) -> Iterable:
        """Batches of tasks from ``dataset`` (one pass = one epoch); must support ``len``.

        If the loader has ``set_epoch(epoch)``, the trainer calls it before each epoch. Resuming a
        run skips the batches already done in the epoch, so an epoch's order must depend only on
        the epoch (and the seed), never on how many passes this process has made."""

    # ---- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything the backend needs to continue training that is the same on every rank
        (model, optimizer, lr scheduler), as objects ``torch.save`` can write; rank 0's is saved.
        The default: nothing."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (called on every rank before training resumes)."""

    def sharded_state_dict(self) -> dict[str, Any] | None:
        """State that each rank holds a shard of (e.g. an FSDP model and optimizer), as a
        ``torch.distributed.checkpoint`` state dict: every rank writes its shards with ``dcp.save``
        and a resume loads into this structure with ``dcp.load``. The default: None (nothing sharded)."""
        return None

    def load_sharded_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`sharded_state_dict`'s structure, filled from a checkpoint."""

    def rank_state_dict(self) -> dict[str, Any]:
        """What differs from rank to rank (e.g. each rank's sampling generator); every rank's is
        saved. The default: nothing."""
        return {}

    def load_rank_state_dict(self, state: dict[str, Any]) -> None:
        """Restore this rank's :meth:`rank_state_dict`."""

    # ---- per batch -------------------------------------------------------------------------
    @abstractmethod
    async def generate_episodes(self, batch: Any, agent_workflow_engine: Any, is_validation: bool = False) -> list:
        """Run the workflows on a batch of tasks (``rollout.n`` or ``rollout.n_val`` times each)."""

    @abstractmethod
    def transform_to_backend_batch(self, trainer_state: TrainerState) -> Any:
        """Turn ``trainer_state.trajectory_groups`` into the backend's batch."""

    async def process_backend_batch(self, trainer_state: TrainerState) -> None:
        """Compute what the update needs before advantages (e.g. old log-probs)."""

    async def compute_advantages(self, trainer_state: TrainerState, algorithm_config: AlgorithmConfig) -> None:
        """Token-level advantages on ``trainer_state.backend_batch`` (a :class:`TokenBatch`):
        see :func:`compute_token_advantages` (over every rank of ``self.ranks``). Metrics go into
        ``trainer_state.metrics``."""
        trainer_state.metrics.update(
            compute_token_advantages(
                trainer_state.backend_batch, algorithm_config, process_group=self.ranks.estimator_group
            )
        )

    @abstractmethod
    async def update_policy(self, trainer_state: TrainerState) -> None:
        """Update the policy from ``trainer_state.backend_batch``; put metrics in the state."""

    def summary_rows(self) -> list[tuple[str, str]]:
        """Extra ``(name, value)`` rows of the start-up summary (e.g. the memory settings); none by default."""
        return []

    # ---- hooks -----------------------------------------------------------------------------
    async def on_train_start(self, trainer_state: TrainerState) -> None:
        """Before the first validation and batch."""

    async def on_train_end(self, trainer_state: TrainerState) -> None:
        """After the final validation (e.g. save the final checkpoint)."""

    async def on_epoch_start(self, trainer_state: TrainerState) -> None:
        """Before the first batch of an epoch."""

    async def on_epoch_end(self, trainer_state: TrainerState) -> None:
        """After the last batch of an epoch."""

    async def on_batch_start(self, trainer_state: TrainerState) -> None:
        """Before a batch's first stage."""

    async def on_batch_end(self, trainer_state: TrainerState) -> None:
        """After a batch's update, before it is logged (the trainer itself writes the checkpoints)."""

    async def on_validation_start(self, trainer_state: TrainerState) -> bool:
        """Before validation; return False to skip it."""
        return True

    async def on_validation_end(self, trainer_state: TrainerState) -> None:
        """After validation."""

    def shutdown(self) -> None:
        """Release resources."""
