"""``TokenBatch``: a batch of trajectories as padded token tensors, one row per step, the form
the default :meth:`BackendProtocol.compute_advantages` and the torch backend consume.

Each **step** of each trajectory is a row (``R`` rows for ``N`` trajectories): its prompt (for a
multi-turn workflow, the conversation so far) followed by its response, right padded to ``T``
tokens; ``response_mask`` marks the step's own trained response tokens. ``row_index`` maps a row
to its trajectory, so a trajectory's advantage is broadcast to every one of its steps, each at
its own response tokens (rLLM's ``broadcast`` mode). Trajectories of one
:class:`~rllm_torch.rllm.types.TrajectoryGroup` share a dense ``group_index``; each group has a role.

With ``use_precomputed_advantage``, a group with any ``step.advantage`` set is *precomputed*: its
rows carry :meth:`Step.token_advantages <rllm_torch.rllm.types.Step.token_advantages>` in
``precomputed_advantages`` and no estimator touches them (rLLM's rule, per group).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import torch
from torch import Tensor

from rllm_torch.core.checks import check_reward
from rllm_torch.core.errors import ConfigError, InvalidRewardsError, InvalidTrajectoryError
from rllm_torch.rllm.config import STEPWISE_MODES, TURN_MODES
from rllm_torch.rllm.roles import group_baselines_tensor, reward_components_tensor
from rllm_torch.rllm.stepwise import ObservationIds, turn_rewards
from rllm_torch.rllm.types import TrajectoryGroup

__all__ = ["TokenBatch", "build_token_batch"]


@dataclass
class TokenBatch:
    """Packed tensors of one training batch (``R`` step rows, ``N`` trajectories, ``G`` groups).

    Attributes:
        input_ids: ``[R, T]`` int64 prompt + response ids, right padded with ``pad_token_id``.
        attention_mask: ``[R, T]`` int64, 1 on real tokens.
        response_mask: ``[R, T]`` float32, 1 on the response tokens that are trained
            (``Step.response_mask``), 0 on prompt and padding.
        rewards: ``[N]`` float64 trajectory rewards (Python floats keep their precision up to the
            estimator's statistics; the token-level ``advantages`` are float32).
        group_index: ``[N]`` int64 dense group ids ``0..G-1``.
        group_roles: ``G`` role names (host list), one per group: picks the estimator.
        rollout_log_probs: ``[R, T]`` float32 sampling log-probs of response tokens (0 elsewhere).
        old_log_probs: ``[R, T]`` float32 log-probs of the policy before the update (filled by
            ``process_backend_batch``), or None: not computed (the embedded backend leaves them
            None when a single update per batch takes them from its own forward).
        advantages: ``[R, T]`` float32 token-level advantages (filled by ``compute_advantages``).
        row_index: ``[R]`` int64 trajectory of each row; None means row ``i`` is trajectory ``i``.
        precomputed_advantages: ``[R, T]`` float32 workflow-written token advantages of the rows
            of precomputed groups (0 elsewhere), or None when no group is precomputed.
        group_precomputed: ``G`` bools (host list): whether group ``g`` is precomputed; None: none is.
        ref_log_probs: ``[R, T]`` float32 log-probs of the frozen reference policy (with a
            reference model: ``use_kl_loss`` or ``use_kl_in_reward``), or None.
        reward_penalty: ``[R, T]`` float32 per-token penalty subtracted from the rewards
            (``kl_coef`` times the KL to the reference, ``use_kl_in_reward``), or None.
        values: ``[R, T]`` float32 critic values of the response tokens (``gae``), or None.
        sum_pi_squared: ``[R, T]`` float32 ``Σ_v π_old(v)²`` at each response token (the old
            log-prob pass's, for ``optimal_token_baseline``), or None.
        reward_components: ``[N, R]`` float64 rewards of several reward functions
            (``Trajectory.reward_components``, for ``gdpo``), or None when no trajectory has them.
        group_baselines: ``[G]`` float64 each group's greedy reward (``TrajectoryGroup.reward_baseline``,
            ``remax``'s baseline; NaN where a group has none), or None when no group has one.
        turn_rewards: ``[R]`` float64 reward of each row's step (the turn modes' turn rewards,
            :func:`~rllm_torch.rllm.stepwise.turn_rewards`), or None (broadcast).
        observation_index: ``[R]`` int64 dense id of each row's ``Step.observation`` (GiGPO's
            step groups), or None.
        obs_mask: ``[R, T]`` float32, 1 on the environment-observation tokens of each row (a
            step's prompt tokens after the previous step's prompt and response, see
            :func:`_observation_span`; a trajectory's first step has none), for a loss that trains
            them (``echo``), or None: not asked for.
        returns: ``[R, T]`` float32 regression targets of the critic (written by token-level
            estimators' ``compute_advantages``), or None.
        trajectory_groups: the ``G`` groups the batch was built from (host objects, for an
            estimator that reads rLLM's ``traj_groups``), or None.
        extras: anything else a backend wants to carry with the batch.
    """

    input_ids: Tensor
    attention_mask: Tensor
    response_mask: Tensor
    rewards: Tensor
    group_index: Tensor
    group_roles: list[str]
    rollout_log_probs: Tensor
    old_log_probs: Tensor | None = None
    advantages: Tensor | None = None
    row_index: Tensor | None = None
    precomputed_advantages: Tensor | None = None
    group_precomputed: list[bool] | None = None
    ref_log_probs: Tensor | None = None
    reward_penalty: Tensor | None = None
    values: Tensor | None = None
    sum_pi_squared: Tensor | None = None
    returns: Tensor | None = None
    reward_components: Tensor | None = None
    group_baselines: Tensor | None = None
    turn_rewards: Tensor | None = None
    observation_index: Tensor | None = None
    obs_mask: Tensor | None = None
    trajectory_groups: list | None = None
    extras: dict = field(default_factory=dict)

    @property
    def num_groups(self) -> int:
        return len(self.group_roles)

    def to(self, device: torch.device | str) -> TokenBatch:
        """The same batch with every tensor on ``device``."""
        moved = {k: (v.to(device) if isinstance(v, Tensor) else v) for k, v in vars(self).items()}
        return TokenBatch(**moved)


def _where(group: TrajectoryGroup, name: str, index: int) -> str:
    return f"task {group.task_id!r}, group {group.group_id!r}, trajectory {name!r}, step {index}"


def build_token_batch(
    groups: list[TrajectoryGroup],
    *,
    pad_token_id: int,
    use_precomputed_advantage: bool = False,
    stepwise_mode: str = "broadcast",
    length_mismatch: str = "raise",
    observation_mask: bool = False,
) -> TokenBatch:
    """Pack trajectory groups into a :class:`TokenBatch` (on CPU), one row per step.

    Args:
        groups: groups whose trajectories have at least one step; every step has
            ``prompt_ids`` and ``response_ids`` (and, optionally, ``logprobs`` with one value per
            response token).
        pad_token_id: the id written in padding positions.
        use_precomputed_advantage: keep the workflow's ``step.advantage`` for groups that have one.
        stepwise_mode: ``rllm.stepwise_advantage.mode``; a turn mode fills ``turn_rewards`` (RL
            groups), ``gigpo`` also ``observation_index``.
        length_mismatch: a precomputed per-token advantage of the wrong length: ``"raise"``, or
            ``"zeros"`` with one ``UserWarning`` counting them (``rllm.algorithm.compat=rllm``).
        observation_mask: fill ``obs_mask`` (a loss that needs it). A later step whose prompt does
            not begin with the previous step's prompt (a workflow that rewrote the conversation)
            has no observation tokens, with one ``UserWarning`` counting such steps.

    Raises:
        InvalidTrajectoryError (a ValueError): a trajectory has no step, a step has no response
            token or log-probs of the wrong length; the message names the task, group, trajectory
            and step.
        InvalidRewardsError / InvalidRewardTypeError: an RL trajectory's reward is None or not
            finite / not a real number or bool (see :func:`~rllm_torch.core.checks.check_reward`);
            ``reward_components`` on some trajectories and not others, or of different lengths;
            in a turn mode, a step without a reward (:func:`~rllm_torch.rllm.stepwise.turn_rewards`)
            or, for ``gigpo``, without an observation.
            The estimators keep a NaN in its group; a training batch refuses it, since one
            NaN advantage makes the loss, and so every weight, NaN.
    """
    rows, rows_logp, rows_mask, rows_adv, row_index, rewards, group_index, group_pre = [], [], [], [], [], [], [], []
    trajectories: list = []  # (group, trajectory), for reward_components_tensor
    if stepwise_mode not in (*STEPWISE_MODES, "per_step"):
        raise ConfigError(
            f"stepwise_mode must be one of {STEPWISE_MODES} (rllm.stepwise_advantage.mode), got {stepwise_mode!r}."
        )
    turns = [] if stepwise_mode in TURN_MODES else None
    observation_ids = ObservationIds() if stepwise_mode == "gigpo" else None
    observations: list[int] = []
    mismatched: list[str] = []
    obs_spans: list[tuple[int, int]] = []  # each row's observation tokens, [start, end) of its prompt
    rewritten: list[str] = []  # later steps whose prompt does not extend the conversation before them
    for g, group in enumerate(groups):
        pre = use_precomputed_advantage and any(s.advantage is not None for t in group.trajectories for s in t.steps)
        group_pre.append(pre)
        for traj in group.trajectories:
            if not traj.steps:
                raise InvalidTrajectoryError(
                    f"task {group.task_id!r}, group {group.group_id!r}: trajectory {traj.name!r} has no step; every trained trajectory needs at least one."
                )
            for index, step in enumerate(traj.steps):
                num_prompt, num_resp = len(step.prompt_ids), len(step.response_ids)
                if not num_resp:
                    raise InvalidTrajectoryError(
                        f"{_where(group, traj.name, index)}: no response token; every trained step needs at least one."
                    )
                if step.logprobs and len(step.logprobs) != num_resp:
                    raise InvalidTrajectoryError(
                        f"{_where(group, traj.name, index)}: {len(step.logprobs)} log-probs for {num_resp} response tokens."
                    )
                rows.append(list(step.prompt_ids) + list(step.response_ids))
                if observation_mask:
                    obs_spans.append(_observation_span(traj.steps, index, rewritten, _where(group, traj.name, index)))
                rows_logp.append((num_prompt, list(step.logprobs) or [0.0] * num_resp))
                try:
                    rows_mask.append(step.response_mask_tensor())
                except InvalidTrajectoryError as exc:
                    raise InvalidTrajectoryError(f"{_where(group, traj.name, index)}: {exc}") from exc
                if pre and length_mismatch == "zeros" and isinstance(step.advantage, (list, tuple, Tensor)):
                    if len(step.advantage) != num_resp:
                        mismatched.append(_where(group, traj.name, index))
                rows_adv.append(step.token_advantages(length_mismatch=length_mismatch) if pre else None)
                row_index.append(len(rewards))
                if observation_ids is not None:
                    observations.append(
                        observation_ids(step.observation, _where(group, traj.name, index)) if not pre else -1
                    )
            if turns is not None:
                where = f"task {group.task_id!r}, group {group.group_id!r}, trajectory {traj.name!r}"
                turns += [0.0] * len(traj.steps) if pre else turn_rewards(traj, where, stepwise_mode)
            if traj.reward is None and pre:
                rewards.append(0.0)  # precomputed groups: unused
            else:
                where = f"task {group.task_id!r}, group {group.group_id!r}, trajectory {traj.name!r}"
                reward = check_reward(traj.reward, where)
                if not math.isfinite(reward):  # it would reach every weight through the update
                    raise InvalidRewardsError(
                        f"{where}: reward {reward} is not finite; training needs finite rewards: check the "
                        "reward function (task.reward_fn, or the workflow's) for a division by zero or a missing score."
                    )
                rewards.append(reward)
            trajectories.append((group, traj))
            group_index.append(g)
    if mismatched:
        warnings.warn(
            f"{len(mismatched)} step(s) have a precomputed advantage whose length differs from their response and get "
            f"zeros (rllm.algorithm.compat=rllm, as rLLM does; first: {mismatched[0]}).",
            UserWarning,
            stacklevel=2,
        )
    if rewritten:
        warnings.warn(
            f"{len(rewritten)} step(s) have a prompt that does not begin with the previous step's prompt: "
            f"their environment-observation tokens cannot be told from the rest, and the loss's observation term "
            f"skips them (first: {rewritten[0]}).",
            UserWarning,
            stacklevel=2,
        )
    num_rows, width = len(rows), max((len(r) for r in rows), default=0)
    input_ids_RT = torch.full((num_rows, width), pad_token_id, dtype=torch.int64)
    attention_mask_RT = torch.zeros((num_rows, width), dtype=torch.int64)
    response_mask_RT = torch.zeros((num_rows, width), dtype=torch.float32)
    rollout_logp_RT = torch.zeros((num_rows, width), dtype=torch.float32)
    pre_adv_RT = torch.zeros((num_rows, width), dtype=torch.float32) if any(group_pre) else None
    for i, (ids, (start, logp), mask_T, adv_T) in enumerate(zip(rows, rows_logp, rows_mask, rows_adv, strict=True)):
        input_ids_RT[i, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
        attention_mask_RT[i, : len(ids)] = 1
        response_mask_RT[i, start : len(ids)] = mask_T
        rollout_logp_RT[i, start : len(ids)] = torch.tensor(logp, dtype=torch.float32)
        if adv_T is not None:
            pre_adv_RT[i, start : len(ids)] = adv_T
    obs_RT = None
    if observation_mask:
        obs_RT = torch.zeros((num_rows, width), dtype=torch.float32)
        for i, (first, end) in enumerate(obs_spans):
            obs_RT[i, first:end] = 1.0
    return TokenBatch(
        input_ids=input_ids_RT,
        attention_mask=attention_mask_RT,
        response_mask=response_mask_RT,
        rewards=torch.tensor(rewards, dtype=torch.float64),
        group_index=torch.tensor(group_index, dtype=torch.int64),
        group_roles=[g.group_role for g in groups],
        trajectory_groups=list(groups),
        rollout_log_probs=rollout_logp_RT,
        row_index=torch.tensor(row_index, dtype=torch.int64),
        precomputed_advantages=pre_adv_RT,
        group_precomputed=group_pre if any(group_pre) else None,
        reward_components=reward_components_tensor(trajectories),
        group_baselines=group_baselines_tensor(groups),
        turn_rewards=None if turns is None else torch.tensor(turns, dtype=torch.float64),
        observation_index=torch.tensor(observations, dtype=torch.int64) if observation_ids is not None else None,
        obs_mask=obs_RT,
    )


def _observation_span(steps: list, index: int, rewritten: list[str], where: str) -> tuple[int, int]:
    """``[start, end)`` of step ``index``'s prompt that the environment added: its tokens after
    the longest common prefix with the previous step's prompt and response (a workflow may render
    the response back otherwise, e.g. without its end-of-turn token). Empty for a trajectory's
    first step, and for a prompt that does not begin with the previous prompt (its ``where`` is
    then appended to ``rewritten``)."""
    if index == 0:
        return 0, 0
    previous, prompt = steps[index - 1], list(steps[index].prompt_ids)
    if prompt[: len(previous.prompt_ids)] != list(previous.prompt_ids):
        rewritten.append(where)
        return 0, 0
    common, response = len(previous.prompt_ids), list(previous.response_ids)
    while common < len(prompt) and common - len(previous.prompt_ids) < len(response):
        if prompt[common] != response[common - len(previous.prompt_ids)]:
            break
        common += 1
    return common, len(prompt)
