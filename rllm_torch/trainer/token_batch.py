"""``TokenBatch``: a batch of single-step trajectories as padded token tensors, the form the
default :meth:`BackendProtocol.compute_advantages` and the torch backend consume.

Row ``i`` is trajectory ``i`` (``N`` rows) and holds its prompt followed by its response, right
padded to ``T`` tokens; ``response_mask`` marks the trained response tokens. Trajectories of one
:class:`~rllm_torch.types.TrajectoryGroup` share a dense ``group_index``; each group has a role.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from rllm_torch.types import TrajectoryGroup

__all__ = ["TokenBatch", "build_token_batch"]


@dataclass
class TokenBatch:
    """Packed tensors of one training batch.

    Attributes:
        input_ids: ``[N, T]`` int64 prompt + response ids, right padded with ``pad_token_id``.
        attention_mask: ``[N, T]`` int64, 1 on real tokens.
        response_mask: ``[N, T]`` float32, 1 on the response tokens that are trained
            (``Step.response_mask``), 0 on prompt and padding.
        rewards: ``[N]`` float32 trajectory rewards.
        group_index: ``[N]`` int64 dense group ids ``0..G-1``.
        group_roles: ``G`` role names (host list), one per group: picks the estimator.
        rollout_log_probs: ``[N, T]`` float32 sampling log-probs of response tokens (0 elsewhere).
        old_log_probs: ``[N, T]`` float32 log-probs of the policy before the update (filled by
            ``process_backend_batch``), or None.
        advantages: ``[N, T]`` float32 token-level advantages (filled by ``compute_advantages``).
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
    extras: dict = field(default_factory=dict)

    @property
    def num_groups(self) -> int:
        return len(self.group_roles)

    def to(self, device: torch.device | str) -> TokenBatch:
        """The same batch with every tensor on ``device``."""
        moved = {k: (v.to(device) if isinstance(v, Tensor) else v) for k, v in vars(self).items()}
        return TokenBatch(**moved)


def build_token_batch(groups: list[TrajectoryGroup], *, pad_token_id: int) -> TokenBatch:
    """Pack single-step trajectory groups into a :class:`TokenBatch` (on CPU).

    Args:
        groups: groups whose trajectories have exactly one step with ``prompt_ids`` and
            ``response_ids`` (and, optionally, ``logprobs`` with one value per response token).
        pad_token_id: the id written in padding positions.

    Raises:
        ValueError: a trajectory does not have exactly one step, has no response token, or has
            log-probs of the wrong length; the message names the task and the group.
    """
    rows, rewards, group_index, rows_logp, rows_mask = [], [], [], [], []
    for g, group in enumerate(groups):
        for traj in group.trajectories:
            if len(traj.steps) != 1 or not traj.steps[0].response_ids:
                raise ValueError(f"task {group.task_id!r}, group {group.group_id!r}: trajectory {traj.name!r} has {len(traj.steps)} step(s); this backend trains single-step trajectories with at least one response token.")
            step = traj.steps[0]
            num_prompt, num_resp = len(step.prompt_ids), len(step.response_ids)
            if step.logprobs and len(step.logprobs) != num_resp:
                raise ValueError(f"task {group.task_id!r}, group {group.group_id!r}: {len(step.logprobs)} log-probs for {num_resp} response tokens.")
            rows.append(list(step.prompt_ids) + list(step.response_ids))
            rows_logp.append((num_prompt, list(step.logprobs) or [0.0] * num_resp))
            rows_mask.append((num_prompt, step.response_mask_tensor()))
            rewards.append(float(traj.reward))
            group_index.append(g)
    num_rows, width = len(rows), max((len(r) for r in rows), default=0)
    input_ids_NT = torch.full((num_rows, width), pad_token_id, dtype=torch.int64)
    attention_mask_NT = torch.zeros((num_rows, width), dtype=torch.int64)
    response_mask_NT = torch.zeros((num_rows, width), dtype=torch.float32)
    rollout_logp_NT = torch.zeros((num_rows, width), dtype=torch.float32)
    for i, (ids, (start, logp), (_, mask_T)) in enumerate(zip(rows, rows_logp, rows_mask)):
        input_ids_NT[i, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
        attention_mask_NT[i, : len(ids)] = 1
        response_mask_NT[i, start : len(ids)] = mask_T
        rollout_logp_NT[i, start : len(ids)] = torch.tensor(logp, dtype=torch.float32)
    return TokenBatch(
        input_ids=input_ids_NT,
        attention_mask=attention_mask_NT,
        response_mask=response_mask_NT,
        rewards=torch.tensor(rewards, dtype=torch.float32),
        group_index=torch.tensor(group_index, dtype=torch.int64),
        group_roles=[g.group_role for g in groups],
        rollout_log_probs=rollout_logp_NT,
    )
