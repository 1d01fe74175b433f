"""The packed turns of multi-turn trajectories (:class:`GroupedTurns`): turn rewards, their
returns-to-go, and regroupings of per-turn values by (group, turn), by (group, observation) or by
trajectory group, as :class:`~rllm_torch.core.packing.GroupedRewards` any group estimator runs on.

A batch of ``N`` trajectories in ``G`` groups has ``M`` turns in all: turn ``m`` belongs to
trajectory ``trajectory_index[m]`` and is its ``turn_index[m]``-th turn (counted from 0, in the
order the turns are listed). Turns of one trajectory are ragged; the returns are computed on an
``[N, K]`` padded view (``K`` the most turns of any trajectory) with
:func:`~rllm_torch.core.returns.discounted_returns`: no Python loop over turns, trajectories or
groups. The credit schemes built on it are in :mod:`rllm_torch.core.estimators.turns`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from rllm_torch.core.checks import check_reward_tensor, check_weights
from rllm_torch.core.distributed import ONE_PROCESS, agree_across_ranks, resolve_process_group
from rllm_torch.core.errors import InvalidGroupIndexError, InvalidRewardsError, InvalidRewardTypeError
from rllm_torch.core.packing import GroupedRewards
from rllm_torch.core.returns import discounted_returns
from rllm_torch.core.segment import accumulation_dtype, segment_count

__all__ = ["GroupedTurns"]


def _index(value: object, name: str, length: int, bound: int | None, device: torch.device) -> Tensor:
    """A 1-D integer tensor of ``length`` ids in ``[0, bound)`` (``bound`` None: any non-negative)."""
    if (
        not isinstance(value, Tensor)
        or value.dtype.is_floating_point
        or value.dtype == torch.bool
        or value.is_complex()
    ):
        raise InvalidGroupIndexError(f"{name} must be a 1-D integer torch.Tensor, got {value!r:.80}.")
    if value.dim() != 1 or value.shape[0] != length:
        raise InvalidGroupIndexError(f"{name} must have shape ({length},), got {tuple(value.shape)}.")
    if value.device != device:
        raise InvalidGroupIndexError(f"{name} is on {value.device}, the rewards on {device}; move both to one device.")
    value = value.long()
    if length:
        low, high = int(value.min()), int(value.max())
        if low < 0 or (bound is not None and high >= bound):
            raise InvalidGroupIndexError(
                f"{name} holds {low if low < 0 else high}, outside [0, {bound if bound is not None else 'inf'}); ids must be dense."
            )
    return value


class GroupedTurns:
    """The turns of ``N`` trajectories in ``G`` groups, packed flat (``M`` turns). Treat it as immutable.

    Attributes:
        rewards: ``[M]`` float turn rewards (any device); float64 stays float64, other dtypes
            accumulate in float32.
        trajectory_index: ``[M]`` int64 trajectory of each turn, in ``[0, N)``.
        turn_index: ``[M]`` int64 position of each turn in its trajectory (0 first), by the order
            the turns are listed.
        group_index: ``[N]`` int64 group of each trajectory, in ``[0, G)``.
        num_groups: ``G``.
        num_turns: ``K``, the most turns of any trajectory (of any rank, for split groups).
        observation_index: ``[M]`` int64 dense id of each turn's observation (equal ids: the same
            state; GiGPO's anchor), or None.
        num_observations: ``O``, one more than the largest observation id (of any rank); 0 without.
        weights: ``[M]`` non-negative per-turn weights (e.g. the turn's trained tokens, for
            ``opo``), or None.
        process_group, local_groups: as :class:`~rllm_torch.core.packing.GroupedRewards`. For split
            groups, group and observation ids mean the same on every rank.
    """

    def __init__(self, **fields: object) -> None:
        for name, value in fields.items():
            setattr(self, name, value)

    @classmethod
    def from_flat(
        cls,
        rewards: Tensor,
        trajectory_index: Tensor,
        group_index: Tensor,
        *,
        num_groups: int,
        observation_index: Tensor | None = None,
        weights: Tensor | None = None,
        process_group: object = ONE_PROCESS,
        local_groups: bool = False,
    ) -> GroupedTurns:
        """Pack turns from flat tensors, checking them (ids are read: one host sync).

        Raises:
            InvalidRewardTypeError / InvalidRewardsError: ``rewards`` is not a 1-D real tensor,
                ``weights`` not ``[M]`` and non-negative.
            InvalidGroupIndexError: an index of the wrong shape, dtype or device, or an id out
                of range. Under a process group, any rank's error is raised on every rank (one
                ``all_gather_object``, which also agrees ``K``, ``O`` and, for split groups, ``G``).
        """
        group = resolve_process_group(process_group)
        error, packed = None, None
        try:
            packed = cls._pack(rewards, trajectory_index, group_index, num_groups, observation_index, weights)
        except (InvalidRewardsError, InvalidRewardTypeError, InvalidGroupIndexError) as exc:
            if group is None:
                raise
            error = exc
        if group is not None:
            facts = {} if packed is None else {"K": packed.num_turns, "O": packed.num_observations, "G": num_groups}
            facts["observations"] = observation_index is not None
            everyone = agree_across_ranks(
                group, error, facts, must_match=("observations",) + (() if local_groups else ("G",))
            )
            if not local_groups:  # segment ids g * K + t must mean the same on every rank
                packed.num_turns = max(f["K"] for f in everyone)
                packed.num_observations = max(f["O"] for f in everyone)
        packed.process_group, packed.local_groups = group, local_groups
        return packed

    @classmethod
    def _pack(cls, rewards, trajectory_index, group_index, num_groups, observation_index, weights) -> GroupedTurns:
        rewards = check_reward_tensor(rewards, "turn rewards", ndim=1)
        if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 0:
            raise InvalidGroupIndexError(f"num_groups must be a non-negative int, got {num_groups!r}.")
        device, num_turns_flat = rewards.device, rewards.shape[0]
        if not isinstance(group_index, Tensor) or group_index.dim() != 1:
            raise InvalidGroupIndexError(
                f"group_index must be a 1-D integer torch.Tensor [N], got {group_index!r:.80}."
            )
        group_index = _index(group_index, "group_index", group_index.shape[0], num_groups, device)
        num_trajectories = group_index.shape[0]
        trajectory_index = _index(trajectory_index, "trajectory_index", num_turns_flat, num_trajectories, device)
        if observation_index is not None:
            observation_index = _index(observation_index, "observation_index", num_turns_flat, None, device)
        if weights is not None:
            weights = check_weights(weights, rewards, read_values=True)  # finite, >= 0, one per turn
        counts_N = segment_count(trajectory_index, num_trajectories)
        order_M = torch.argsort(trajectory_index, stable=True)
        starts_N = torch.cumsum(counts_N, 0) - counts_N
        turn_sorted_M = torch.arange(num_turns_flat, device=device) - starts_N[trajectory_index[order_M]]
        turn_index = torch.empty_like(trajectory_index).index_copy_(0, order_M, turn_sorted_M)
        return cls(
            rewards=rewards,
            trajectory_index=trajectory_index,
            turn_index=turn_index,
            group_index=group_index,
            num_groups=num_groups,
            num_turns=int(counts_N.max()) if num_trajectories else 0,
            turn_counts=counts_N,
            observation_index=observation_index,
            num_observations=int(observation_index.max()) + 1
            if observation_index is not None and num_turns_flat
            else 0,
            weights=weights,
            process_group=None,
            local_groups=False,
        )

    def rank_local(self, process_group: dist.ProcessGroup | None) -> GroupedTurns:
        """These turns as one rank's share of a batch of rank-local groups over ``process_group``
        (a resolved group; None: one process). No collective: rank-local ids need no agreement."""
        return GroupedTurns(**{**vars(self), "process_group": process_group, "local_groups": process_group is not None})

    @property
    def num_trajectories(self) -> int:
        return self.group_index.shape[0]

    def _working(self, values: Tensor) -> Tensor:
        return values.to(accumulation_dtype(values.dtype))

    def returns(self, gamma: float, values: Tensor | None = None) -> Tensor:
        """``[M]`` discounted sums to go ``sum_{k >= t} gamma^(k-t) v_{i,k}`` of ``values`` (the
        turn rewards by default) within each trajectory, in the accumulation dtype."""
        values = self._working(self.rewards if values is None else values)
        padded_NK = values.new_zeros(self.num_trajectories, self.num_turns)
        mask_NK = torch.zeros_like(padded_NK)
        padded_NK[self.trajectory_index, self.turn_index] = values
        mask_NK[self.trajectory_index, self.turn_index] = 1.0
        return discounted_returns(padded_NK, mask_NK, gamma)[self.trajectory_index, self.turn_index]

    def episode_returns(self) -> Tensor:
        """``[N]`` undiscounted sum of each trajectory's turn rewards (its return)."""
        values = self._working(self.rewards)
        return values.new_zeros(self.num_trajectories).index_add_(0, self.trajectory_index, values)

    def _grouped(self, values: Tensor, key: Tensor, num_keys: int, weights: Tensor | None) -> GroupedRewards:
        return GroupedRewards.from_flat(
            values,
            key,
            num_groups=num_keys,
            weights=weights,
            validate=False,
            process_group=ONE_PROCESS if self.process_group is None else self.process_group,
            local_groups=self.local_groups,
        )

    def by_turn(self, values: Tensor) -> GroupedRewards:
        """``values [M]`` grouped by (group, turn index): ``G * K`` groups, id ``g * K + t``."""
        key_M = self.group_index[self.trajectory_index] * self.num_turns + self.turn_index
        return self._grouped(values, key_M, self.num_groups * self.num_turns, self.weights)

    def by_observation(self, values: Tensor) -> GroupedRewards:
        """``values [M]`` grouped by (group, observation): the distinct pairs on this process or
        rank (one host sync), or for split groups ``G * O`` groups of id ``g * O + o``.

        Raises:
            InvalidGroupIndexError: the turns carry no observation ids.
        """
        if self.observation_index is None:
            raise InvalidGroupIndexError(
                "grouping turns by observation (GiGPO's step groups) needs observation_index: one id per turn, "
                "equal for turns that saw the same state."
            )
        key_M = self.group_index[self.trajectory_index] * self.num_observations + self.observation_index
        if self.process_group is None or self.local_groups:  # dense pair ids: at most M groups, not G * O
            unique_K, key_M = torch.unique(key_M, return_inverse=True)
            return self._grouped(values, key_M, unique_K.shape[0], self.weights)
        return self._grouped(values, key_M, self.num_groups * self.num_observations, self.weights)

    def by_trajectory(self, values: Tensor) -> GroupedRewards:
        """``values [N]`` grouped by trajectory group (weights: each trajectory's summed turn weights)."""
        weights = None
        if self.weights is not None:
            weights = self._working(self.weights).new_zeros(self.num_trajectories)
            weights.index_add_(0, self.trajectory_index, self._working(self.weights))
        return self._grouped(values, self.group_index, self.num_groups, weights)
