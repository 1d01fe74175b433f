"""Group-wise (segment) reductions over a flat tensor with a dense group index.

Vocabulary follows ``torch_scatter``: ``src`` holds the values ``[N]``, ``index`` the group of
each value ``[N]`` (int64, dense ids ``0..G-1``), ``dim_size`` the number of groups ``G``.
Reductions return one value per group, ``[G]``, on ``src``'s device.

Numerics, defined here once for the whole package (every estimator goes through
:class:`SegmentLayout`):

* **Accumulation dtype**: float64 for float64 input, float32 for everything else (bool, integer,
  float16, bfloat16, float32). Results have the accumulation dtype.
* **Variance is two-pass (centred)**: ``var = sum((x - mean)^2) / (n - correction)``, never
  ``E[x^2] - E[x]^2``.
* **Centring** (:meth:`SegmentLayout.center`): ``x - mean`` is rounded once, at its own scale,
  never at the scale of a common offset of the group's values; a constant group has centred
  values and variance exactly 0 (:mod:`rllm_torch.core.centring` gives the rules per dtype).
* **Across ranks** (a process group, :mod:`rllm_torch.core.distributed`): per-rank sums of the
  shifted values, the counts and the centred squares are all-reduced (``O(G)`` payload, a fixed
  number of collectives); the result equals one process's on the concatenated batch up to the
  order of float additions.
* **Empty groups** (count 0) give sum 0 and mean/variance NaN; ``n - correction <= 0`` gives
  an infinite or NaN variance, as ``torch.var`` does. Callers handle groups of one explicitly.
* **No host-device synchronisation**: ``index_add_``, gathers and elementwise ops with shapes
  known from ``dim_size``; usable inside ``torch.compile`` or CUDA-graph capture.
* **Determinism**: deterministic on CPU. On CUDA, ``index_add_`` on floating-point values uses
  atomic adds, so ragged-group sums may differ in the last bits between runs
  (``torch.use_deterministic_algorithms(True)`` selects PyTorch's deterministic kernel). The
  equal-group path (a ``[G, K]`` view) uses plain row reductions and is deterministic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from rllm_torch.core.centring import Centered, center_groups, group_weighted_mean
from rllm_torch.core.distributed import all_reduce_

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = [
    "accumulation_dtype",
    "segment_count",
    "segment_sum",
    "segment_mean",
    "segment_var_mean",
    "SegmentLayout",
    "Centered",
]


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype statistics accumulate in: float64 for float64 input, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def segment_count(index: Tensor, dim_size: int) -> Tensor:
    """Number of members of each group, ``[G]`` int64, on ``index``'s device."""
    if index.device.type == "cpu" and not torch.compiler.is_compiling():
        return torch.bincount(index, minlength=dim_size)  # faster; its data-dependent size syncs elsewhere
    counts_G = torch.zeros(dim_size, dtype=torch.int64, device=index.device)
    return counts_G.index_add_(0, index, torch.ones_like(index))


def segment_sum(src: Tensor, index: Tensor, dim_size: int) -> Tensor:
    """Sum of each group ``[G]``, accumulated in :func:`accumulation_dtype` of ``src``.

    Args:
        src: ``[N]`` values (bool, integer or floating point), any device.
        index: ``[N]`` int64 group of each value, in ``[0, dim_size)``, same device.
        dim_size: number of groups ``G``.
    """
    acc = accumulation_dtype(src.dtype)
    sum_G = torch.zeros(dim_size, dtype=acc, device=src.device)
    return sum_G.index_add_(0, index, src.to(acc))


def segment_mean(src: Tensor, index: Tensor, dim_size: int) -> Tensor:
    """Mean of each group ``[G]``: ``segment_sum / segment_count``; NaN for an empty group."""
    return segment_sum(src, index, dim_size) / segment_count(index, dim_size)


def segment_var_mean(src: Tensor, index: Tensor, dim_size: int, *, correction: int = 0) -> tuple[Tensor, Tensor]:
    """Two-pass variance and mean of each group, ``(var [G], mean [G])``.

    ``var = sum((x - mean)^2) / (n - correction)`` with ``correction`` as in :func:`torch.var`
    (0 = population variance, as rLLM; 1 = sample variance, as verl). See the module docstring
    for the shift, the accumulation dtype and empty groups.
    """
    x_N = src.to(accumulation_dtype(src.dtype))
    if x_N.numel() == 0:
        nan_G = x_N.new_full((dim_size,), float("nan"))
        return nan_G, nan_G.clone()
    stats = SegmentLayout.ragged(index, dim_size).center(x_N, singleton_baseline=None)
    return stats.var(correction), stats.mean


def _gemv_is_exact(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a row sum may go through ``torch.mv``: eager CPU only, and never where TF32/bf16
    matmuls are allowed (they would round the rewards). Compiled code fuses the plain sum."""
    if torch.compiler.is_compiling() or device.type != "cpu":
        return False
    return dtype == torch.float64 or torch.get_float32_matmul_precision() == "highest"


class SegmentLayout:
    """How a flat ``[N]`` tensor maps onto ``G`` groups, with the reductions estimators need.

    Two private branches give the same numbers:

    * dense: all groups have ``K`` members here and flat order is group-major, so values are a
      free ``view(G, K)``; sums are row reductions, per-group values broadcast as ``[G, 1]``.
    * ragged: any sizes and any order, described by ``index [N]``; sums are ``scatter_add_`` and
      per-group values are gathered with ``index_select``.

    Estimators write their formula once against :meth:`values`, :meth:`center`, :meth:`sum`,
    :meth:`mean`, :meth:`expand`, :meth:`where_singleton`, :meth:`whole_batch`,
    :meth:`batch_std` and :meth:`flat`;
    ``GroupedRewards.layout`` builds the right one. The same formula is then correct on one
    process and across the ranks of a process group (:mod:`rllm_torch.core.distributed`):

    * ``group_comm``: the process group per-group statistics are reduced over (split groups),
      or ``None`` when each group is wholly on this process;
    * ``batch_comm``: the process group batch statistics (:meth:`whole_batch`) are reduced over,
      or ``None`` for one process.

    Collectives per call, with a process group (on the values' device): :meth:`center` 1
    ``all_reduce`` for float32 values (float64 sums and counts, ``[2G]``), 2 for float64 values
    (the shift, a ``max`` of ``[G]``, then sums and counts),
    :meth:`Centered.var` 1 (``[G]``), :meth:`sum` 1, :attr:`counts` 1 (``[G]`` int64, only if
    asked before :meth:`center`; :meth:`mean` is :meth:`sum` and :attr:`counts`); on the
    :meth:`whole_batch` layout, :meth:`center` is one ``all_gather`` of 4 values per rank and
    :meth:`Centered.var` none. Every rank of the group must make the same calls.
    """

    def __init__(
        self,
        *,
        num_groups: int,
        group_size: int | None,
        index: Tensor | None,
        first_index: Tensor | None,
        counts: Tensor | None,
        group_comm: ProcessGroup | None = None,
        batch_comm: ProcessGroup | None = None,
        device: torch.device | None = None,
        gather_moments: bool = False,
    ):
        self.num_groups = num_groups
        self.group_size = group_size
        self.index = index
        self._first_index = first_index
        self._counts = None if group_comm is not None else counts  # a split layout's counts are global
        self.group_comm, self.batch_comm = group_comm, batch_comm
        self.gathers_moments = gather_moments  # the whole-batch layout: merge per-rank moments
        self._device = index.device if index is not None else device or torch.device("cpu")

    @classmethod
    def dense_layout(
        cls,
        num_groups: int,
        group_size: int,
        *,
        group_comm: ProcessGroup | None = None,
        batch_comm: ProcessGroup | None = None,
        device: torch.device | None = None,
    ) -> SegmentLayout:
        """Layout of ``num_groups`` groups of ``group_size`` members each (on this rank), group-major;
        ``device`` is where its values live (needed only when the groups are split over ranks)."""
        return cls(
            num_groups=num_groups,
            group_size=group_size,
            index=None,
            first_index=None,
            counts=None,
            group_comm=group_comm,
            batch_comm=batch_comm,
            device=device,
        )

    @classmethod
    def ragged(
        cls,
        index: Tensor,
        num_groups: int,
        *,
        first_index: Tensor | None = None,
        counts: Tensor | None = None,
        group_comm: ProcessGroup | None = None,
        batch_comm: ProcessGroup | None = None,
    ) -> SegmentLayout:
        """Layout given by a dense group index ``[N]``. ``first_index [G]`` (flat position of each
        group's first member) and ``counts [G]`` (this rank's) are computed here, without a host
        sync, when ``None``."""
        return cls(
            num_groups=num_groups,
            group_size=None,
            index=index,
            first_index=first_index,
            counts=counts,
            group_comm=group_comm,
            batch_comm=batch_comm,
        )

    @property
    def is_dense(self) -> bool:
        return self.group_size is not None

    @property
    def _int_counts(self) -> bool:
        """Whether every group's size is the Python int ``K`` (dense, not split over ranks)."""
        return self.group_size is not None and self.group_comm is None

    def _local_counts(self) -> Tensor:
        if self.group_size is not None:
            return torch.full((self.num_groups, 1), self.group_size, dtype=torch.int64, device=self._device)
        return segment_count(self.index, self.num_groups)

    @property
    def counts(self) -> Tensor | int:
        """Members per group over every rank: the int ``K`` (dense, one process) or a tensor shaped
        like :meth:`sum`'s output."""
        if self._int_counts:
            return self.group_size
        if self._counts is None:
            self._counts = all_reduce_(self._local_counts(), self.group_comm)
        return self._counts

    @property
    def first_index(self) -> Tensor:
        """``[G]`` flat position of each group's first member (0 for an empty group)."""
        if self._first_index is None:
            positions_N = torch.arange(self.index.numel(), device=self.index.device)
            first_G = torch.zeros(self.num_groups, dtype=torch.int64, device=self.index.device)
            self._first_index = first_G.scatter_reduce_(0, self.index, positions_N, "amin", include_self=False)
        return self._first_index

    def values(self, x_N: Tensor) -> Tensor:
        """``x`` in the layout's working shape: ``[G, K]`` view (dense) or ``[N]`` (ragged)."""
        return x_N.view(self.num_groups, self.group_size) if self.group_size is not None else x_N

    def flat(self, x: Tensor) -> Tensor:
        """Inverse of :meth:`values`: back to flat ``[N]`` order (a view)."""
        return x.reshape(-1)

    def _local_sum(self, x: Tensor) -> Tensor:
        if self.group_size is None:
            return x.new_zeros(self.num_groups).scatter_add_(0, self.index, x)
        if _gemv_is_exact(x.device, x.dtype):  # BLAS gemv beats eager's reduction over a short inner dimension
            return torch.mv(x, x.new_ones(self.group_size)).unsqueeze(1)
        return x.sum(dim=1, keepdim=True)

    def sum(self, x: Tensor) -> Tensor:
        """Per-group sums over every rank: ``[G, 1]`` (dense) or ``[G]`` (ragged), in ``x``'s dtype."""
        return all_reduce_(self._local_sum(x), self.group_comm)

    def mean(self, x: Tensor) -> Tensor:
        """Per-group means over every rank, shaped like :meth:`sum` (NaN for an empty group)."""
        return self.sum(x).div_(self.counts)

    def max(self, x: Tensor) -> Tensor:
        """Per-group maxima over every rank (one ``max`` all-reduce of ``[G]`` when split), shaped
        like :meth:`sum`; ``-inf`` for an empty group. NaN values may or may not win: callers that
        care test for NaN themselves."""
        if self.group_size is not None:
            high = x.amax(dim=1, keepdim=True) if x.shape[1] else x.new_full((self.num_groups, 1), -torch.inf)
        else:
            high = x.new_full((self.num_groups,), -torch.inf).scatter_reduce_(0, self.index, x, "amax")
        return all_reduce_(high, self.group_comm, op="max")

    def batch_total(self, x: Tensor) -> Tensor:
        """Sums over the whole batch, every rank of ``batch_comm`` (one ``sum`` all-reduce): of the
        flat ``[N]`` values, a 0-d tensor, or of each row of ``[C, N]``, ``[C]``."""
        return all_reduce_(x.sum(dim=-1), self.batch_comm)

    def sum_of_squares(self, x: Tensor) -> Tensor:
        """Per-group sums of ``x * x``, shaped like :meth:`sum`."""
        return self.sum(x * x)

    def expand(self, v_G: Tensor) -> Tensor:
        """A per-group value broadcast to every member (``[G, 1]`` or gathered ``[N]``)."""
        return v_G if self.group_size is not None else torch.index_select(v_G, 0, self.index)

    def singletons(self) -> Tensor | bool:
        """Which groups have at most one member (over every rank): a bool (dense, one process) or a
        bool tensor shaped like :meth:`sum`'s output."""
        return self.group_size <= 1 if self._int_counts else self.counts <= 1

    def where_singleton(self, value_G: Tensor, singleton_value: float | Tensor) -> Tensor:
        """``value_G`` (shaped like :meth:`sum`) with ``singleton_value`` (a number, or a tensor
        shaped like ``value_G``) in groups of at most one member."""
        single = self.singletons()
        if isinstance(single, bool):
            return torch.zeros_like(value_G).add_(singleton_value) if single else value_G
        return torch.where(single, singleton_value, value_G)

    def whole_batch(self, x_N: Tensor) -> tuple[SegmentLayout, Tensor]:
        """The batch as one group, over every rank of ``batch_comm``: ``(layout, x [1, N])``, for
        batch statistics (whitening) written with the same reductions as group statistics.

        Across ranks its :meth:`center` is one ``all_gather`` of each rank's ``(count, shift,
        mean - shift, M2)`` (``4 W`` values), merged exactly on every rank
        (:func:`~rllm_torch.core.centring.center_groups`), and :meth:`Centered.var` then needs no
        collective."""
        whole = SegmentLayout(
            num_groups=1,
            group_size=x_N.shape[0],
            index=None,
            first_index=None,
            counts=None,
            group_comm=self.batch_comm,
            batch_comm=self.batch_comm,
            device=x_N.device,
            gather_moments=True,
        )
        return whole, whole.values(x_N)

    def batch_std(self, x_N: Tensor, correction: int = 0) -> Tensor:
        """The std of all values of the batch over every rank of ``batch_comm``, a 0-d tensor:
        ``torch.std`` on one process (centred, fused), else :meth:`whole_batch`'s merged moments
        (one ``all_gather`` of 4 values per rank)."""
        if self.batch_comm is None:  # an empty batch: NaN, without torch.std's warning
            return torch.std(x_N, correction=correction) if x_N.numel() else x_N.new_full((), torch.nan)
        whole, x_1N = self.whole_batch(x_N)
        return whole.center(x_1N, singleton_baseline=None).var(correction).sqrt_().reshape(())

    def shift(self, x: Tensor) -> Tensor:
        """One value per group that every member's rank agrees on, and that is exactly the
        group's value when the group is constant: its first member on one process, its maximum
        (one ``max`` all-reduce of ``[G]``) when it is split over ranks. Either way
        ``|x - shift|`` is at most the group's range."""
        dense = self.group_size is not None
        if self.group_comm is None:
            if x.shape[-1 if dense else 0] == 0:  # no member: nothing to shift
                return x.new_zeros((self.num_groups, 1) if dense else (self.num_groups,))
            return x[:, :1] if dense else torch.index_select(x, 0, self.first_index)
        return self.max(x)

    def sum_and_counts(self, x: Tensor) -> tuple[Tensor, Tensor | int]:
        """Per-group sums (in ``x``'s dtype) and counts over every rank; one ``sum`` all-reduce of
        ``[2G]`` when split (counts travel in the sums' dtype: exact below ``2**24`` members per
        group in float32, ``2**53`` in float64)."""
        local_G = self._local_sum(x)
        if self.group_comm is None or self._counts is not None:
            return all_reduce_(local_G, self.group_comm), self.counts
        both = all_reduce_(torch.cat([local_G, self._local_counts().to(local_G.dtype)]), self.group_comm)
        sum_G, self._counts = both.chunk(2)
        return sum_G, self._counts

    def adopt_counts(self, counts: Tensor) -> None:
        """Keep the global counts that came with a collective's sums, so :attr:`counts` needs none."""
        if self._counts is None:
            self._counts = counts

    def weighted_mean(self, x: Tensor, weights: Tensor) -> Tensor:
        """Per-group weighted means over every rank, ``sum(w x) / sum(w)``, shaped like :meth:`sum`:
        :func:`rllm_torch.core.centring.group_weighted_mean` (a group whose weights sum to 0 gets its
        unweighted mean; an empty group NaN)."""
        return group_weighted_mean(self, x, weights)

    def center(self, x: Tensor, *, singleton_baseline: float | None = 0.0) -> Centered:
        """Two-pass centring on the group mean, ``x - mean`` rounded once at its own scale
        (:mod:`rllm_torch.core.centring` gives the rules per dtype), as :class:`Centered`.

        A constant group gives exactly 0, also when its members are on several ranks. With
        ``singleton_baseline`` a number, a group of one uses that value as its mean (0: its
        centred value is its reward; its variance is then meaningless and callers override it
        with :meth:`where_singleton`); with ``None`` it is treated like any group.
        """
        return center_groups(self, x, singleton_baseline)
