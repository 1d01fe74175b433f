"""The packed layout of a batch of trajectory groups (docs/design.md §2).

G groups with N trajectories in total are held as a flat reward tensor ``rewards [N]`` with a
dense ``group_index [N]`` (int64, ``0..G-1``). The padded view ``[G, K]`` (``K`` = largest
group) with its ``mask [G, K]`` and ``slot_index [N]`` is derived on demand; when every group has
the same size and trajectories are in group-major order (n rollouts per prompt, the common
case) the padded view is a free ``view(G, K)`` and estimators take a dense fast path.

Under a ``torch.distributed`` process group (``process_group=pg`` on every constructor) each
rank holds its share of one batch, and the estimators reduce over the ranks; the two layouts,
split groups and rank-local groups, are described in :mod:`rllm_torch.core.distributed`.

The group structure and its flat ⇄ padded conversions are :class:`~rllm_torch.core.grouping.PackedGroups`'s;
:class:`GroupedRewards` adds the rewards (and weights, reward components) and the constructors,
whose cross-rank agreement is :func:`~rllm_torch.core.grouping.attach_ranks`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from rllm_torch.core.checks import (
    check_group_index,
    check_matches,
    check_reward_components,
    check_reward_tensor,
    check_weights,
    group_to_array,
    inspect_group_index,
)
from rllm_torch.core.distributed import ONE_PROCESS, world_position
from rllm_torch.core.errors import InvalidGroupIndexError, InvalidRewardsError
from rllm_torch.core.grouping import PackedGroups, attach_ranks
from rllm_torch.core.labels import factorize_group_labels

__all__ = ["GroupedRewards"]


class GroupedRewards(PackedGroups):
    """Rewards of ``G`` trajectory groups, packed as tensors. Treat it as immutable.

    Attributes:
        rewards: ``[N]`` rewards in flat order; dtype as given (bool, integer or float), any device.
        group_index: ``[N]`` int64 group of each trajectory, dense ids ``0..G-1``, same device
            (built on first use for the dense layout, which does not need it).
        num_groups: ``G``. Groups with no trajectory are allowed and produce nothing.
        group_size: ``K`` when every group has exactly ``K`` trajectories and flat order is
            group-major (``rewards.view(G, K)`` is the padded tensor); else ``None``.
        group_major: True when flat order lists group 0's trajectories, then group 1's, and so
            on (as :meth:`from_groups` and :meth:`from_padded` build it).
        process_group: the ``torch.distributed.ProcessGroup`` whose ranks hold the rest of the
            batch, or ``None`` when it is all on this process. Every attribute above describes
            this rank's share; estimators compute statistics over all ranks.
        local_groups: True for the rank-local layout (each group wholly on one rank, ids and
            ``G`` per rank); False for split groups (global ids, the same ``G`` on every rank).
        weights: ``[N]`` non-negative per-trajectory weights in flat order (e.g. each response's
            token count, for :func:`~rllm_torch.core.estimators.opo`), same device, or ``None``.
            Every constructor takes ``weights=`` shaped like its rewards; estimators that do not
            use weights ignore them.
        reward_components: ``[N, R]`` rewards of ``R`` reward functions per trajectory, in flat
            order, same device, or ``None``: the input of multi-objective estimators
            (:func:`~rllm_torch.core.estimators.gdpo`; ``rewards`` then holds the trajectory's scalar
            reward, for the metrics and other estimators). :meth:`from_flat` and
            :meth:`from_padded` take ``reward_components=``.

    Build it with :meth:`from_groups` (lists / arrays / tensors per group), :meth:`from_flat`
    (a flat tensor and a dense group index), :meth:`from_padded` (a ``[G, K]`` tensor and an
    optional mask) or :meth:`from_labels` (arbitrary group labels). The constructors check
    their input and raise :class:`~rllm_torch.core.errors.InvalidRewardsError`,
    :class:`~rllm_torch.core.errors.InvalidRewardTypeError` or
    :class:`~rllm_torch.core.errors.InvalidGroupIndexError` naming the group and position.

    Across ranks, each constructor takes ``process_group`` (default ``ONE_PROCESS``: no
    collective; ``None``: the default WORLD group; or a ``ProcessGroup``), ``local_groups`` and
    ``validate``: what is checked across the ranks is :func:`~rllm_torch.core.grouping.attach_ranks`'s.
    """

    def __init__(
        self,
        rewards: Tensor,
        group_index: Tensor | None,
        num_groups: int,
        group_size: int | None = None,
        group_major: bool = False,
        *,
        process_group: dist.ProcessGroup | None = None,
        local_groups: bool = False,
        weights: Tensor | None = None,
        reward_components: Tensor | None = None,
    ) -> None:
        if group_index is None and group_size is None:
            raise InvalidGroupIndexError("group_index may only be omitted for equal groups (group_size given).")
        self.rewards, self._group_index, self.num_groups = rewards, group_index, num_groups
        self.group_size, self.group_major = group_size, group_major
        self.process_group, self.local_groups = process_group, local_groups
        self.weights, self.reward_components = weights, reward_components
        self.validated = False  # the cross-rank checks ran (GroupedRewards built with validate=True)

    def __repr__(self) -> str:
        layout = f"group_size={self.group_size}" if self.group_size is not None else "ragged"
        ranks = ""
        if self.process_group is not None:
            rank, world = world_position(self.process_group)
            ranks = f", rank {rank} of {world}, {'rank-local' if self.local_groups else 'split'} groups"
        weighted = ", weighted" if self.weights is not None else ""
        if self.reward_components is not None:
            weighted += f", {self.reward_components.shape[-1]} reward components"
        return f"GroupedRewards(N={self.num_trajectories}, G={self.num_groups}, {layout}{weighted}, dtype={self.rewards.dtype}, device={self.device}{ranks})"

    def all_ranks(self) -> tuple[GroupedRewards, slice]:
        """The whole batch on this process, and where this rank's trajectories are in its flat order.

        The concatenation of every rank's batch in rank order (rank-local group ids are offset
        by the groups of the ranks before), gathered with one ``all_gather_object``: ``O(N)``
        payload and a host sync, for code that needs every reward (rLLM-form custom
        estimators, references). For one process: ``(self, slice(0, N))``.
        """
        if self.process_group is None:
            return self, slice(0, self.num_trajectories)
        rank, world = world_position(self.process_group)
        parts: list = [None] * world
        weights = None if self.weights is None else self.weights.cpu()
        components = None if self.reward_components is None else self.reward_components.cpu()
        mine = (self.rewards.cpu(), self.group_index.cpu(), self.num_groups, weights, components)
        dist.all_gather_object(parts, mine, group=self.process_group)
        starts_N = np.cumsum([0] + [p[0].shape[0] for p in parts])
        starts_G = np.cumsum([0] + [p[2] for p in parts]) if self.local_groups else np.zeros(world + 1, dtype=int)
        rewards = torch.cat([p[0] for p in parts]).to(self.device)
        index = torch.cat([p[1] + int(starts_G[r]) for r, p in enumerate(parts)]).to(self.device)
        num_groups = int(starts_G[-1]) if self.local_groups else self.num_groups
        weighted = all(p[3] is not None for p in parts)
        weights = torch.cat([p[3] for p in parts]).to(self.device) if weighted else None
        multi = all(p[4] is not None for p in parts)
        components = torch.cat([p[4] for p in parts]).to(self.device) if multi else None
        whole = GroupedRewards.from_flat(
            rewards, index, num_groups=num_groups, validate=False, weights=weights, reward_components=components
        )
        return whole, slice(int(starts_N[rank]), int(starts_N[rank + 1]))

    @classmethod
    def from_groups(
        cls,
        groups: Sequence[Sequence[float] | np.ndarray | Tensor],
        *,
        weights: Sequence[Sequence[float] | np.ndarray | Tensor] | None = None,
        device: torch.device | str | None = None,
        process_group: object = ONE_PROCESS,
        local_groups: bool = False,
    ) -> GroupedRewards:
        """Pack per-group rewards (Python lists, 1-D numpy arrays or 1-D tensors).

        Flat order is the concatenation of the groups. The dtype follows type promotion over
        all groups (Python floats give float64, as numpy does). ``device`` defaults to the first
        tensor group's device, else CPU. Under a process group with split groups, every rank
        lists all ``G`` groups, each with this rank's members (possibly none); checked across
        ranks (see the class). ``weights``, when given, lists one weight per reward in the same
        nesting (finite, >= 0).

        Raises:
            InvalidRewardTypeError: a group is not a sequence, or a reward is not a real number.
            InvalidRewardsError: a reward is ``None``, or a group is not 1-D; ``weights`` do not
                match the groups, or one is negative or not finite.
            DistributedSetupError, DistributedBatchError: see :mod:`rllm_torch.core.distributed` and the class.
        """

        def build() -> GroupedRewards:
            packed = cls._from_groups(groups, device)
            if weights is not None:
                packed.weights = cls._weights_from_groups(weights, packed)
            return packed

        return attach_ranks(build, process_group, local_groups, True)

    @classmethod
    def _weights_from_groups(cls, weights: object, packed: GroupedRewards) -> Tensor:
        if isinstance(weights, (Tensor, np.ndarray, str, bytes)) or not isinstance(weights, Sequence):
            raise InvalidRewardsError(
                f"weights must be a list with one sequence of weights per group, like the rewards, got {type(weights).__name__}."
            )
        flat = cls._from_groups(weights, packed.device)
        if flat.num_groups != packed.num_groups or not torch.equal(flat.counts, packed.counts):
            sizes = flat.counts.tolist()
            for g, size in enumerate(packed.counts.tolist()):
                got = sizes[g] if g < len(sizes) else "no"
                if got != size:
                    raise InvalidRewardsError(
                        f"weights of group {g}: {got} value(s) for {size} reward(s); give one weight per trajectory."
                    )
            raise InvalidRewardsError(f"weights has {flat.num_groups} groups but rewards has {packed.num_groups}.")
        return check_weights(flat.rewards, packed.rewards, read_values=True)

    @classmethod
    def _from_groups(cls, groups, device) -> GroupedRewards:
        if isinstance(groups, (Tensor, np.ndarray, str, bytes)) or not isinstance(groups, Sequence):
            raise InvalidRewardsError(
                f"groups must be a list with one sequence of rewards per group, got {type(groups).__name__}; for a flat tensor use GroupedRewards.from_flat or from_padded."
            )
        parts = [group_to_array(group, g) for g, group in enumerate(groups)]
        if device is None:
            device = next((p.device for p in parts if isinstance(p, Tensor)), torch.device("cpu"))
        tensors = [
            p.to(device) if isinstance(p, Tensor) else torch.from_numpy(np.ascontiguousarray(p)).to(device)
            for p in parts
        ]
        sizes = [t.shape[0] for t in tensors]
        num_groups = len(tensors)
        rewards = torch.cat(tensors) if tensors else torch.zeros(0, dtype=torch.float64, device=device)
        counts_G = torch.tensor(sizes, dtype=torch.int64, device=device)
        group_index = torch.repeat_interleave(
            torch.arange(num_groups, device=device), counts_G, output_size=rewards.shape[0]
        )
        equal = num_groups > 0 and sizes[0] > 0 and all(s == sizes[0] for s in sizes)
        packed = cls(rewards, group_index, num_groups, sizes[0] if equal else None, group_major=True)
        packed.__dict__["counts"] = counts_G
        return packed

    @classmethod
    def from_flat(
        cls,
        rewards: Tensor,
        group_index: Tensor,
        *,
        num_groups: int | None = None,
        weights: Tensor | None = None,
        reward_components: Tensor | None = None,
        validate: bool = True,
        process_group: object = ONE_PROCESS,
        local_groups: bool = False,
    ) -> GroupedRewards:
        """Pack a flat reward tensor with a dense group index, in any order.

        Args:
            rewards: ``[N]`` bool/int/float rewards, any device.
            group_index: ``[N]`` integer group ids in ``[0, num_groups)``, same device.
            num_groups: ``G``; when ``None`` it is ``group_index.max() + 1``.
            weights: optional ``[N]`` per-trajectory weights (integer or float, same device),
                e.g. response token counts; checked finite and >= 0 when ``validate``.
            reward_components: optional ``[N, R]`` rewards of ``R`` reward functions (same device).
            validate: check that every id is in ``[0, num_groups)``, and note whether ids are
                sorted (group-major order, which makes later steps cheaper). This reads
                ``group_index``: one host sync on an accelerator, also taken when ``num_groups``
                is ``None``. With ``num_groups`` given and ``validate=False`` nothing
                synchronises, for use inside compiled or graph-captured loops; ids out of range
                are then undefined behaviour. Under a process group it also runs the cross-rank
                check of the class docstring.
            process_group: ``ONE_PROCESS`` (default), ``None`` (WORLD) or a ``ProcessGroup``.
            local_groups: the rank-local layout (ids and ``num_groups`` are this rank's own);
                else split groups, where ``num_groups`` is required and global.

        Raises:
            InvalidRewardTypeError, InvalidRewardsError, InvalidGroupIndexError: see the class.
            DistributedSetupError, DistributedBatchError: see :mod:`rllm_torch.core.distributed` and the class.
        """
        split = process_group is not ONE_PROCESS and not local_groups

        def build() -> GroupedRewards:
            checked = check_reward_tensor(rewards, "rewards", ndim=1)
            index = check_group_index(group_index, checked, num_groups)
            if split and num_groups is None:
                raise InvalidGroupIndexError(
                    "num_groups is required for groups split over a process group: pass the global number of groups, the same on every rank."
                )
            checked_weights = None if weights is None else check_weights(weights, checked, read_values=validate)
            extra = dict(
                weights=checked_weights,
                reward_components=None
                if reward_components is None
                else check_reward_components(reward_components, checked),
            )
            if validate or num_groups is None:
                size, ascending = inspect_group_index(index, num_groups)
                return cls(checked, index, size, None, group_major=ascending, **extra)
            return cls(checked, index, num_groups, None, **extra)

        return attach_ranks(build, process_group, local_groups, validate)

    @classmethod
    def from_padded(
        cls,
        rewards: Tensor,
        mask: Tensor | None = None,
        *,
        weights: Tensor | None = None,
        reward_components: Tensor | None = None,
        process_group: object = ONE_PROCESS,
        local_groups: bool = False,
        validate: bool = True,
    ) -> GroupedRewards:
        """Pack a padded ``[G, K]`` reward tensor; ``mask [G, K]`` (bool) marks real trajectories.

        Without a mask every entry is a trajectory: the dense layout, built without
        synchronising, and without copying unless ``rewards`` is not contiguous. With a mask, flat order is the
        row-major order of the ``True`` entries (one host sync to count them); padded entries
        are never read, so they may hold anything, NaN included.

        Under a process group, row ``g`` holds this rank's members of group ``g`` (split
        groups: every rank passes ``G`` rows, global ids; each rank may hold a different ``K``)
        or this rank's own group ``g`` (``local_groups=True``). ``validate`` runs the cross-rank
        check of the class docstring (one host sync); ``validate=False`` skips it. ``weights``
        (optional, ``[G, K]`` like ``rewards``, read where ``mask`` is True) are checked finite
        and >= 0 when ``validate`` (one host sync). Without a process group or weights,
        ``validate`` has no effect: the other checks here read no data. ``reward_components``
        (optional, ``[G, K, R]``: ``R`` rewards per trajectory, read where ``mask`` is True).
        """

        def build() -> GroupedRewards:
            packed = cls._from_padded(rewards, mask)
            if weights is not None:
                padded = check_weights(weights, rewards, read_values=validate)
                rows = padded.reshape(-1) if mask is None else padded[mask]
                packed.weights = rows
            if reward_components is not None:
                padded = check_reward_components(reward_components, rewards)
                packed.reward_components = padded.reshape(-1, padded.shape[-1]) if mask is None else padded[mask]
            return packed

        return attach_ranks(build, process_group, local_groups, validate)

    @classmethod
    def _from_padded(cls, rewards: Tensor, mask: Tensor | None) -> GroupedRewards:
        rewards = check_reward_tensor(rewards, "rewards", ndim=2)
        num_groups, width = rewards.shape
        if mask is None:
            if width == 0 or num_groups == 0:  # no trajectory at all
                return cls(rewards.reshape(-1), rewards.new_zeros(0, dtype=torch.int64), num_groups, None, True)
            return cls(rewards.reshape(-1), None, num_groups, width, group_major=True)
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            raise InvalidGroupIndexError(
                f"mask must be a bool tensor, got {getattr(mask, 'dtype', type(mask).__name__)}."
            )
        check_matches(mask, "mask", rewards, "rewards", error=InvalidGroupIndexError)
        rows_N, cols_N = mask.nonzero(as_tuple=True)
        packed = cls(rewards[rows_N, cols_N], rows_N, num_groups, None, group_major=True)
        packed.__dict__["slot_index"] = cols_N
        packed.__dict__["max_group_size"] = width
        return packed

    @classmethod
    def from_labels(
        cls, rewards: Tensor, labels: Sequence | np.ndarray | Tensor, *, weights: Tensor | None = None
    ) -> GroupedRewards:
        """Pack a flat reward tensor whose groups are given by arbitrary labels (strings, sparse
        or negative ints); groups are numbered in order of first appearance
        (:func:`~rllm_torch.core.labels.factorize_group_labels`). ``weights``: as in :meth:`from_flat`
        (checked)."""
        rewards = check_reward_tensor(rewards, "rewards", ndim=1)
        if isinstance(labels, (str, bytes)) or not hasattr(labels, "__len__"):
            raise InvalidGroupIndexError(
                f"labels must be a sequence, array or tensor with one label per reward, got {type(labels).__name__}."
            )
        if len(labels) != rewards.shape[0]:
            raise InvalidGroupIndexError(
                f"labels has {len(labels)} entries but rewards has {rewards.shape[0]}; give one label per reward."
            )
        if weights is not None:
            check_weights(weights, rewards, read_values=True)
        group_index, unique = factorize_group_labels(labels)
        return cls.from_flat(
            rewards, group_index.to(rewards.device), num_groups=len(unique), validate=False, weights=weights
        )

    @property
    def num_trajectories(self) -> int:
        """``N``, the number of trajectories."""
        return self.rewards.shape[0]

    @property
    def device(self) -> torch.device:
        return self.rewards.device

    @property
    def padded_rewards(self) -> Tensor:
        """``[G, K]`` rewards, 0 where there is no trajectory (see :attr:`mask`)."""
        return self.to_padded(self.rewards)

    def to(self, device: torch.device | str) -> GroupedRewards:
        """The same packing on another device."""
        index = None if self._group_index is None else self._group_index.to(device)
        moved = GroupedRewards(
            self.rewards.to(device),
            index,
            self.num_groups,
            self.group_size,
            self.group_major,
            process_group=self.process_group,
            local_groups=self.local_groups,
            weights=None if self.weights is None else self.weights.to(device),
            reward_components=None if self.reward_components is None else self.reward_components.to(device),
        )
        for key in ("counts", "slot_index"):
            if key in self.__dict__:
                moved.__dict__[key] = self.__dict__[key].to(device)
        return moved
