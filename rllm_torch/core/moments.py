"""Moments of values spread over the ranks of a process group, and the guard of a zero std: each
written once, for every batch statistic of the package (the whole-batch layout of
:mod:`~rllm_torch.core.segment`, the token whitening of :mod:`~rllm_torch.core.tokens`, the
reward and advantage metrics of :mod:`rllm_torch.rllm.metrics`, the estimators' divisions).

A rank's moments are ``(count, shift, mean - shift, M2)``: its number of values, a value near
them, their mean relative to it and their centred sum of squares ``M2 = sum((x - mean)^2)``.
They merge exactly with Chan, Golub and LeVeque's pairwise update (1979), relative to one shared
shift, so a mean is never rounded at the scale of the data before a subtraction, and values
that are all equal give ``mean - shift`` and ``M2`` exactly 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import Tensor

from rllm_torch.core.distributed import require_live, world_position

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["chan_merge", "merge_moments", "std_plus_epsilon"]


def chan_merge(
    count_W: Tensor, shift_W: Tensor, mean_shifted_W: Tensor, m2_W: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The ``(count, shift, mean_shifted, M2)`` of ``W`` parts merged into one (0-d float64).

    Args:
        count_W, shift_W, mean_shifted_W, m2_W: ``[W]`` float64, each part's moments (see the
            module docstring); a part with ``count`` 0 may hold any shift.

    The merged shift is that of the first part with a value (the first part when none has
    one); ``mean_shifted`` is 0 when no part has a value. No host sync.
    """
    total = count_W.sum()
    shift = shift_W.gather(0, (count_W > 0).to(torch.int8).argmax().reshape(1)).reshape(())  # first part with data
    part_mean_W = (shift_W - shift) + mean_shifted_W  # each part's mean minus the common shift
    mean_shifted = ((count_W / total.clamp(min=1.0)) * part_mean_W).sum()
    merged_m2 = m2_W.sum() + (count_W * (part_mean_W - mean_shifted).square()).sum()
    return total, shift, torch.where(total > 0, mean_shifted, 0.0), merged_m2


def merge_moments(
    count: Tensor, shift: Tensor, mean_shifted: Tensor, m2: Tensor, comm: ProcessGroup | None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The ``(count, shift, mean_shifted, M2)`` of values spread over the ranks of ``comm``, from
    each rank's own.

    Args:
        count, shift, mean_shifted, m2: 0-d float64 tensors: this rank's moments.
        comm: a process group, or ``None`` (one process: returned unchanged).

    One ``all_gather`` of 4 values per rank, merged by :func:`chan_merge` relative to the shift
    of the first rank that holds a value, which every rank returns: ``(x - shift) -
    mean_shifted`` is exact up to one rounding at any offset. The result is the same on every
    rank (same inputs, same operations).
    """
    if comm is None:
        return count, shift, mean_shifted, m2
    mine = torch.stack([count, shift, mean_shifted, m2]).to(torch.float64)
    _, world = world_position(comm)
    parts = [torch.empty_like(mine) for _ in range(world)]
    require_live(comm)
    dist.all_gather(parts, mine, group=comm)
    return chan_merge(*torch.stack(parts).unbind(1))


def std_plus_epsilon(std: Tensor, epsilon: float) -> Tensor:
    """``std + epsilon`` in place, with 1 where both are 0 (a constant group or batch and
    ``epsilon=0``), so that its centred values, exactly 0, stay 0 instead of becoming 0/0 = NaN.
    A NaN std (no value, or ``count <= correction``) stays NaN."""
    std.add_(epsilon)
    return std if epsilon > 0 else std.masked_fill_(std == 0, 1.0)
