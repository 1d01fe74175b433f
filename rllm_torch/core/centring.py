"""Centring on the group mean, written once for every estimator (:meth:`SegmentLayout.center
<rllm_torch.core.segment.SegmentLayout.center>` and :meth:`~rllm_torch.core.segment.SegmentLayout.weighted_mean`
call these).

``x - mean`` is rounded once, at its own scale, never at the scale of a common offset of the
group's values:

* float64 values: ``(x - shift) - (mean - shift)`` with ``shift`` a member of the group (its first;
  its maximum when the group is split over ranks), so the deviations are exact at any offset.
* float32 values: the mean a float64 sum, ``x - mean`` formed in float64 (exact but for the mean's
  own rounding, ``2**-53`` of the mean) and rounded once to float32; ragged groups subtract the
  mean rounded to float32 (exact at an offset), then the remainder.
* float32 inside ``torch.compile`` on CPU, where inductor's float64 reductions of float32 values
  are slow: ``(x - shift) - (mean - shift)`` with ``shift`` the float32 mean and ``mean - shift``
  the float32 mean of the deviations (a corrected two-pass mean).

A constant group has centred values and variance exactly 0, also when its members are on several
ranks. The variance is the second, centred pass (:meth:`Centered.var`), never ``E[x^2] - E[x]^2``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import torch
from torch import Tensor

from rllm_torch.core.distributed import all_reduce_
from rllm_torch.core.moments import merge_moments

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["Centered", "center_groups", "group_weighted_mean"]


class _GroupLayout(Protocol):
    """What centring reads of a layout: :class:`~rllm_torch.core.segment.SegmentLayout`'s
    attributes and reductions (declared here, not imported: the segment module calls this one)."""

    num_groups: int
    group_size: int | None
    index: Tensor | None
    group_comm: ProcessGroup | None
    gathers_moments: bool

    @property
    def counts(self) -> Tensor | int: ...
    def sum_and_counts(self, x: Tensor) -> tuple[Tensor, Tensor | int]: ...
    def sum_of_squares(self, x: Tensor) -> Tensor: ...
    def shift(self, x: Tensor) -> Tensor: ...
    def expand(self, v_G: Tensor) -> Tensor: ...
    def singletons(self) -> Tensor | bool: ...
    def where_singleton(self, value_G: Tensor, singleton_value: float | Tensor) -> Tensor: ...
    def adopt_counts(self, counts: Tensor) -> None: ...
    @classmethod
    def dense_layout(cls, num_groups: int, group_size: int, **kwargs: Any) -> _GroupLayout: ...


class Centered(NamedTuple):
    """Result of :func:`center_groups`: ``values`` in the layout's working shape, per-group tensors
    shaped like :meth:`SegmentLayout.sum <rllm_torch.core.segment.SegmentLayout.sum>`'s output."""

    values: Tensor
    """``x - mean`` (owned: callers may change it in place, after taking :meth:`var`)."""
    mean_shifted: Tensor
    """``mean - shift``."""
    shift: Tensor
    """each group's shift (see :func:`center_groups`)."""
    layout: _GroupLayout
    sum_sq: Tensor | None = None
    """``sum((x - mean)^2)`` when :func:`center_groups` already has it (merged moments)."""

    @property
    def mean(self) -> Tensor:
        return self.shift + self.mean_shifted

    def var(self, correction: int = 0) -> Tensor:
        """Second pass: ``sum((x - mean)^2) / (n - correction)``, only when an estimator needs it
        (one ``sum`` all-reduce of ``[G]`` when the groups are split over ranks; none for the
        whole-batch layout, whose merged moments carry it)."""
        if self.sum_sq is not None:
            return self.sum_sq / (self.layout.counts - correction)
        return self.layout.sum_of_squares(self.values).div_(self.layout.counts - correction)


def compiled_on_cpu(x: Tensor) -> bool:
    """Inside ``torch.compile`` on CPU (where float64 reductions of float32 values are slow)."""
    return torch.compiler.is_compiling() and x.device.type == "cpu"


def center_groups(layout: _GroupLayout, x: Tensor, singleton_baseline: float | None) -> Centered:
    """Two-pass centring of ``x`` (the layout's working shape) on each group's mean, by the rules
    of the module docstring; with ``singleton_baseline`` a number, a group of one uses that value
    as its mean. Collectives as :meth:`SegmentLayout.center
    <rllm_torch.core.segment.SegmentLayout.center>` lists them."""
    if layout.gathers_moments and layout.group_comm is not None:
        return _merged_moments(layout, x)  # the whole batch over the ranks: no singleton rule
    if x.dtype != torch.float64 and not compiled_on_cpu(x):
        return _center_in_float64(layout, x, singleton_baseline)
    if x.dtype == torch.float64:
        shift_G = layout.shift(x)
        centered = x - layout.expand(shift_G)  # exactly 0 in a constant group
        sum_G, counts = layout.sum_and_counts(centered)
        mean_shifted_G = sum_G.div_(counts)
    else:
        # float32 sums of values near their float32 mean: for a constant group c - shift is
        # exact and small, so its float32 sum and mean are too, and the correction cancels it
        sum_G, counts = layout.sum_and_counts(x)
        shift_G = sum_G / counts
        centered = x - layout.expand(shift_G)
        correction_G, _ = layout.sum_and_counts(centered)
        mean_shifted_G = correction_G / counts
    if _has_singleton_rule(layout, singleton_baseline):  # a singleton's centred value is 0 so far
        mean_shifted_G = layout.where_singleton(mean_shifted_G, singleton_baseline - shift_G)
    centered.sub_(layout.expand(mean_shifted_G))  # one rounding, at the scale of the result
    return Centered(centered, mean_shifted_G, shift_G, layout)


def _has_singleton_rule(layout: _GroupLayout, baseline: float | None) -> bool:
    """Whether groups of one take ``baseline`` as their mean (asked after the sums, which bring
    the global counts of split groups with them)."""
    return baseline is not None and layout.singletons() is not False


def _center_in_float64(layout: _GroupLayout, x: Tensor, baseline: float | None) -> Centered:
    """:func:`center_groups` of float32 values (eager): the mean a float64 sum of the values (exact for a
    constant group: ``k * c`` needs at most 24 + 29 bits for ``k < 2**29``), the centred values
    formed against it in float64 and rounded once to float32. The shift is the mean rounded to
    float32, ``mean - shift`` the float64 remainder, rounded."""
    x64 = x.to(torch.float64)
    sum_G, _ = layout.sum_and_counts(x64)
    mean_G = sum_G.div_(layout.counts)
    if _has_singleton_rule(layout, baseline):  # a group of one: the baseline as its mean
        mean_G = layout.where_singleton(mean_G, baseline)
    shift_G = mean_G.to(x.dtype)
    mean_shifted_G = (mean_G - shift_G).to(x.dtype)
    if layout.group_size is not None:  # dense: in float64, in place (cheaper than two float32 passes)
        centered = x64.sub_(mean_G).to(x.dtype)
    else:  # ragged: two float32 gathers (cheaper than one of float64); x - shift is exact at an offset
        centered = (x - layout.expand(shift_G)).sub_(layout.expand(mean_shifted_G))
    return Centered(centered, mean_shifted_G, shift_G, layout)


def _merged_moments(layout: _GroupLayout, x_1N: Tensor) -> Centered:
    """:func:`center_groups` of one group spread over the ranks: this rank's two-pass moments in float64
    (its shift, mean and centred squares), merged over the ranks by
    :func:`~rllm_torch.core.moments.merge_moments`; the centred values are formed in float64
    against the common shift and rounded once to ``x``'s dtype. ``shift`` and ``mean_shifted``
    are ``[1, 1]`` float64, ``sum_sq`` the merged centred sum of squares."""
    n, dtype = x_1N.shape[1], x_1N.dtype
    x64 = x_1N.to(torch.float64, copy=True)  # float32 values are exact in float64: their shifts and
    if n:  # differences are, too; the moments travel and merge in float64
        local = type(layout).dense_layout(1, n).center(x64, singleton_baseline=None)
        shift_r, ms_r = local.shift.reshape(()), local.mean_shifted.reshape(())
        m2_r = local.layout.sum_of_squares(local.values).reshape(())
    else:
        shift_r = ms_r = m2_r = x64.new_zeros(())
    count, shift, mean_shifted, m2 = merge_moments(x64.new_full((), n), shift_r, ms_r, m2_r, layout.group_comm)
    layout.adopt_counts(count.reshape(1, 1))
    shift_11, mean_shifted_11 = shift.reshape(1, 1), mean_shifted.reshape(1, 1)
    centered = x64.sub_(shift_11).sub_(mean_shifted_11).to(dtype)  # a constant batch: exactly 0
    return Centered(centered, mean_shifted_11, shift_11, layout, m2.to(dtype).reshape(1, 1))


def group_weighted_mean(layout: _GroupLayout, x: Tensor, weights: Tensor) -> Tensor:
    """Per-group weighted means over every rank, ``sum(w x) / sum(w)``, shaped like the layout's
    sums, in ``x``'s dtype. A group whose weights sum to 0 gets its unweighted mean (the limit of
    equal weights); an empty group NaN.

    ``x`` and ``weights`` are in the layout's working shape, ``weights`` non-negative. The sums
    are of ``w (x - shift)`` in float64 with the layout's shift, so a constant group's mean is
    exactly its value. Collectives: split groups, 2 (the shift's ``max`` of ``[G]``, then one
    ``sum`` of ``[4G]``).
    """
    shift_G = layout.shift(x)
    c = (x - layout.expand(shift_G)).to(torch.float64)
    w = weights.to(torch.float64)
    parts = (w * c, w, c, torch.ones_like(c))
    if layout.group_size is not None:
        local = torch.cat([p.sum(1, keepdim=True) for p in parts])
    else:
        sums = c.new_zeros(len(parts), layout.num_groups)
        for row, p in zip(sums, parts, strict=True):
            row.scatter_add_(0, layout.index, p)
        local = sums.reshape(-1)
    wc_G, w_G, c_G, n_G = all_reduce_(local, layout.group_comm).chunk(4)
    if layout.group_comm is not None:
        layout.adopt_counts(n_G)  # the global counts came with the sums (as in :func:`center_groups`)
    mean_G = torch.where(w_G > 0, wc_G / w_G, c_G / n_G)
    return (shift_G.to(torch.float64) + mean_G).to(x.dtype)
