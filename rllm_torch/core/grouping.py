"""The group structure of a packed batch (docs/design.md §2): :class:`PackedGroups` holds the
dense ``group_index [N]``, the counts, starts and slot of each trajectory, and converts values
between flat ``[N]`` order and the padded ``[G, K]`` view; :func:`attach_ranks` attaches a
process group to a batch after the cross-rank agreement. :class:`~rllm_torch.core.packing.GroupedRewards`
is a ``PackedGroups`` with rewards on it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from rllm_torch.core.distributed import agree_across_ranks, check_backend_carries, resolve_process_group
from rllm_torch.core.errors import InvalidGroupIndexError, InvalidRewardsError, InvalidRewardTypeError, RLLMTorchError
from rllm_torch.core.segment import SegmentLayout, segment_count

__all__ = ["PackedGroups", "attach_ranks"]


def _lazy(compute):
    """A read-only property computed on first use and kept in the instance ``__dict__``.

    (``functools.cached_property`` takes a lock that ``torch.compile`` cannot trace.)
    """
    key = compute.__name__

    def get(self):
        cache = self.__dict__
        if key not in cache:
            cache[key] = compute(self)
        return cache[key]

    return property(get, doc=compute.__doc__)


class PackedGroups:
    """The groups of a packed batch of ``N`` trajectories: which group each one is in
    (:attr:`group_index`), and the views derived from it, built on first use. A subclass holds
    the values (``num_trajectories`` and ``device`` come from them).

    Attributes:
        num_groups: ``G``. group_size: ``K`` for equal groups in group-major order, else None.
        group_major: flat order lists group 0's trajectories, then group 1's, ...
        process_group, local_groups: the ranks holding the rest of the batch, and whether each
            group is wholly on one rank (see :class:`~rllm_torch.core.packing.GroupedRewards`).
    """

    _group_index: Tensor | None
    num_groups: int
    group_size: int | None
    group_major: bool
    process_group: Any
    local_groups: bool

    @property
    def num_trajectories(self) -> int:
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        raise NotImplementedError

    @property
    def group_index(self) -> Tensor:
        """``[N]`` int64 group of each trajectory."""
        if self._group_index is None:
            groups_G = torch.arange(self.num_groups, device=self.device)
            self._group_index = groups_G.repeat_interleave(self.group_size, output_size=self.num_trajectories)
        return self._group_index

    @_lazy
    def layout(self) -> SegmentLayout:
        """The :class:`~rllm_torch.core.segment.SegmentLayout` estimators reduce with."""
        comms = {"group_comm": None if self.local_groups else self.process_group, "batch_comm": self.process_group}
        if self.group_size is not None:
            return SegmentLayout.dense_layout(self.num_groups, self.group_size, device=self.device, **comms)
        # an empty group's start may be N (past the end): clamp it, its shift is never read
        first_index = self.starts.clamp_(max=max(self.num_trajectories - 1, 0)) if self.group_major else None
        return SegmentLayout.ragged(
            self.group_index, self.num_groups, first_index=first_index, counts=self.counts, **comms
        )

    @_lazy
    def counts(self) -> Tensor:
        """``[G]`` int64 number of this rank's trajectories per group."""
        if self.group_size is not None:
            return torch.full((self.num_groups,), self.group_size, dtype=torch.int64, device=self.device)
        return segment_count(self.group_index, self.num_groups)

    @property
    def starts(self) -> Tensor:
        """``[G]`` int64 flat position of each group's first trajectory (group-major order only)."""
        return torch.cumsum(self.counts, 0) - self.counts

    @_lazy
    def slot_index(self) -> Tensor:
        """``[N]`` int64 column of each trajectory in the padded tensor: its rank within its group
        in flat order (a stable sort of ``group_index``)."""
        if self.group_size is not None:
            return torch.arange(self.group_size, device=self.device).repeat(self.num_groups)
        order_N = torch.sort(self.group_index, stable=True).indices
        starts_G = torch.cumsum(self.counts, 0) - self.counts
        rank_N = torch.arange(self.num_trajectories, device=self.device) - starts_G[self.group_index[order_N]]
        return torch.empty_like(rank_N).scatter_(0, order_N, rank_N)

    @_lazy
    def max_group_size(self) -> int:
        """``K``, the largest group size (one host sync unless the layout is dense)."""
        if self.group_size is not None:
            return self.group_size
        return int(self.counts.max()) if self.num_groups else 0

    @_lazy
    def mask(self) -> Tensor:
        """``[G, K]`` bool, True where a trajectory exists."""
        ones_N = torch.ones(self.num_trajectories, dtype=torch.bool, device=self.device)
        return self.to_padded(ones_N, fill_value=False)

    def to_padded(self, values: Tensor, *, fill_value: float | bool = 0) -> Tensor:
        """Scatter flat ``[N]`` values into ``[G, K]``, ``fill_value`` where :attr:`mask` is False."""
        self._check_flat(values)
        if self.group_size is not None:
            return values.view(self.num_groups, self.group_size)
        out_GK = values.new_full((self.num_groups, self.max_group_size), fill_value)
        out_GK[self.group_index, self.slot_index] = values
        return out_GK

    def to_flat(self, values: Tensor) -> Tensor:
        """Gather padded ``[G, K]`` values back into flat ``[N]`` order."""
        if values.shape[:2] != (self.num_groups, self.max_group_size):
            raise InvalidRewardsError(
                f"padded values have shape {tuple(values.shape)}, expected ({self.num_groups}, {self.max_group_size})."
            )
        if self.group_size is not None:
            return values.reshape(self.num_trajectories, *values.shape[2:])
        return values[self.group_index, self.slot_index]

    def split(self, values: Tensor) -> list[Tensor]:
        """Flat ``[N]`` values as a list of ``G`` per-group tensors, members in flat order."""
        self._check_flat(values)
        sizes = self.counts.tolist()
        if self.group_major:
            return list(torch.split(values, sizes))
        order_N = torch.sort(self.group_index, stable=True).indices
        return list(torch.split(values[order_N], sizes))

    def merge(self, groups: Sequence[Tensor]) -> Tensor:
        """Inverse of :meth:`split`: ``G`` per-group ``[n_g]`` tensors back to flat ``[N]`` order."""
        sizes = self.counts.tolist()
        if len(groups) != self.num_groups:
            raise InvalidRewardsError(f"expected {self.num_groups} groups of values, got {len(groups)}.")
        for g, (values, size) in enumerate(zip(groups, sizes, strict=True)):
            if values.shape[:1] != (size,):
                raise InvalidRewardsError(
                    f"group {g} has {size} trajectories but {tuple(values.shape)} values were given for it."
                )
        flat = torch.cat(list(groups)) if groups else torch.zeros(0, device=self.device)
        if self.group_major:
            return flat
        order_N = torch.sort(self.group_index, stable=True).indices
        return torch.empty_like(flat).index_copy_(0, order_N, flat)

    def _check_flat(self, values: Tensor) -> None:
        if not isinstance(values, Tensor) or values.shape[:1] != (self.num_trajectories,):
            raise InvalidRewardsError(
                f"expected a tensor with {self.num_trajectories} rows (one per trajectory), got {getattr(values, 'shape', type(values).__name__)}."
            )


def attach_ranks(build: Callable[[], Any], process_group: object, local_groups: object, validate: bool) -> Any:
    """``build()`` this rank's share of a batch, then attach the process group.

    ``process_group``: ``ONE_PROCESS`` (no collective), ``None`` (the default WORLD group) or a
    ``ProcessGroup``. With ``validate=True`` the checks that need the other ranks run as one small
    ``all_gather_object`` before any statistic: every rank must pass the same reward dtype, device
    type and ``local_groups``, and, for split groups, the same ``num_groups``; an error on any
    rank (an id out of range, a bad tensor) is raised on every rank, naming that rank, so none
    waits for a rank that failed. With ``validate=False`` nothing is exchanged and such
    mismatches are undefined behaviour: a collective may fail, wait until the process group's
    timeout, or return wrong numbers.
    """
    group = resolve_process_group(process_group)
    if not isinstance(local_groups, bool):
        raise InvalidRewardTypeError(f"local_groups must be a bool, got {local_groups!r}.")
    if group is None:
        if local_groups:
            raise InvalidGroupIndexError(
                "local_groups=True describes a batch spread over a process group; pass process_group too, or drop local_groups."
            )
        return build()

    def build_here() -> Any:
        packed = build()
        check_backend_carries(group, packed.device)
        return packed

    if not validate:
        packed = build_here()
    else:
        packed, error = None, None
        try:
            packed = build_here()
        except RLLMTorchError as exc:
            error = exc
        facts = {"local_groups": local_groups}
        if packed is not None:
            facts |= {"num_groups": packed.num_groups, "device type": packed.device.type}
            components = packed.reward_components
            if packed.num_trajectories:  # a rank with no trajectory takes the others' dtype and R
                facts["reward dtype"] = packed.rewards.dtype
                facts["reward components"] = 0 if components is None else components.shape[-1]
        checked = ("local_groups", "device type", "reward dtype", "reward components")
        checked += () if local_groups else ("num_groups",)
        everyone = agree_across_ranks(group, error, facts, must_match=checked)
        dtype = next((f["reward dtype"] for f in everyone if "reward dtype" in f), packed.rewards.dtype)
        if packed.rewards.dtype != dtype:
            packed.rewards = packed.rewards.to(dtype)
    packed.process_group, packed.local_groups, packed.validated = group, local_groups, validate
    return packed
