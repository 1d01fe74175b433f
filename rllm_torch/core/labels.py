"""Turn arbitrary group labels (strings, sparse or negative ints, tuples) into dense group ids."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import torch
from torch import Tensor

from rllm_torch.core.errors import InvalidGroupIndexError

__all__ = ["factorize_group_labels"]


def factorize_group_labels(labels: Sequence[Hashable] | np.ndarray | Tensor) -> tuple[Tensor, list]:
    """Dense group ids for arbitrary labels, numbered in order of first appearance.

    Args:
        labels: ``[N]`` labels: a sequence of hashables (strings, ints, tuples, ...), a 1-D numpy
            array, or a 1-D integer tensor (any device).

    Returns:
        ``(group_index, unique_labels)``: ``group_index`` is an ``[N]`` int64 tensor (on the
        labels' device for a tensor, else CPU) with values ``0..G-1``; ``unique_labels[g]`` is the
        label of group ``g``, so ``unique_labels[group_index[i]] == labels[i]``.

    Raises:
        InvalidGroupIndexError: ``labels`` is not 1-D, or a label is ``None`` or unhashable.

    Examples:
        >>> idx, uniq = factorize_group_labels(["b", "a", "b", -7])
        >>> idx.tolist(), uniq
        ([0, 1, 0, 2], ['b', 'a', -7])

    A tensor is factorized on its device with ``torch.unique`` (one host sync for the number of
    groups).
    """
    if isinstance(labels, Tensor):
        if labels.dim() != 1 or labels.dtype.is_floating_point or labels.is_complex():
            raise InvalidGroupIndexError(
                f"label tensor must be 1-D with an integer dtype, got shape {tuple(labels.shape)} and dtype {labels.dtype}."
            )
        uniq_U, inverse_N = torch.unique(labels, sorted=True, return_inverse=True)
        # renumber sorted ids by first appearance
        first_U = torch.full((uniq_U.numel(),), labels.numel(), dtype=torch.int64, device=labels.device)
        first_U.scatter_reduce_(0, inverse_N, torch.arange(labels.numel(), device=labels.device), "amin")
        order_U = torch.argsort(first_U)
        rank_U = torch.empty_like(order_U).scatter_(0, order_U, torch.arange(order_U.numel(), device=labels.device))
        return rank_U[inverse_N], uniq_U[order_U].tolist()
    if isinstance(labels, np.ndarray) and labels.ndim != 1:
        raise InvalidGroupIndexError(f"labels must be 1-D, got shape {labels.shape}.")
    ids: dict[Hashable, int] = {}
    index = np.empty(len(labels), dtype=np.int64)
    for pos, label in enumerate(labels.tolist() if isinstance(labels, np.ndarray) else labels):
        if label is None:
            raise InvalidGroupIndexError(f"label at position {pos} is None; every trajectory needs a group label.")
        try:
            index[pos] = ids.setdefault(label, len(ids))
        except TypeError as exc:
            raise InvalidGroupIndexError(f"label at position {pos} ({label!r}) is not hashable: {exc}") from exc
    return torch.from_numpy(index), list(ids)
