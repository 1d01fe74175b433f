"""Micro-batches: the rows of a mini-batch split into forward/backward passes of at most
``backend.micro_batch_tokens`` padded tokens (verl's ``ppo_max_token_len_per_gpu``), rows of
similar length together so that little padding is computed; and out-of-memory errors that say
which stage failed and which setting lowers its memory, and the host memory a stage freed given
back to the operating system."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch
from torch import Tensor
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel

from rllm_torch.core.errors import ConfigError, OutOfMemoryError

__all__ = [
    "plan_micro_batches",
    "split_rows",
    "gradient_sync",
    "stage_memory",
    "release_host_memory",
    "map_host_tensors",
    "HOST_MMAP_THRESHOLD_BYTES",
]


def plan_micro_batches(lengths: list[int], budget: int | None) -> list[list[int]]:
    """Positions of ``lengths`` grouped into micro-batches: sorted by length, longest first, and
    packed greedily so that each micro-batch's rows times its longest row is at most ``budget``.

    Args:
        lengths: each row's real (unpadded) length in tokens.
        budget: padded tokens per micro-batch (``backend.micro_batch_tokens``); None: one
            micro-batch of every row.

    Returns:
        Lists of positions into ``lengths``, each non-empty; ``[]`` for no row.

    Raises:
        ConfigError: a row longer than ``budget`` (naming the setting and the row's length).

    Examples:
        >>> plan_micro_batches([3, 9, 4, 8, 2], 16)
        [[1], [3, 2], [0, 4]]
    """
    if not lengths:
        return []
    if budget is None:
        return [list(range(len(lengths)))]
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    if lengths[order[0]] > budget:
        raise ConfigError(
            f"backend.micro_batch_tokens={budget} is smaller than a row of {lengths[order[0]]} tokens (prompt and "
            f"response): raise it to {lengths[order[0]]} or more, or lower rllm.rollout.max_new_tokens."
        )
    plan, current = [], []
    for i in order:
        if current and (len(current) + 1) * lengths[current[0]] > budget:
            plan.append(current)
            current = []
        current.append(i)
    return plan + [current]


def split_rows(rows: Tensor, attention_mask: Tensor, budget: int | None) -> list[Tensor]:
    """:func:`plan_micro_batches` of ``rows`` (``[R]`` int64 indices into ``attention_mask``'s
    rows), as index tensors on ``rows``' device (one host sync for the lengths)."""
    lengths = attention_mask[rows].sum(-1).tolist()
    return [rows[torch.tensor(group, device=rows.device)] for group in plan_micro_batches(lengths, budget)]


def gradient_sync(module: torch.nn.Module, sync: bool) -> AbstractContextManager:
    """The context of one micro-batch's forward and backward through a training ``module``:
    with ``sync`` False (every micro-batch but a step's last), DDP's ``no_sync`` or FSDP2's
    ``set_requires_gradient_sync(False)``, so gradients accumulate locally and cross the ranks
    once per optimizer step; a no-op for a module that is neither."""
    if isinstance(module, DistributedDataParallel):
        return nullcontext() if sync else module.no_sync()
    if isinstance(module, FSDPModule):
        module.set_requires_gradient_sync(sync)
    return nullcontext()


_ALLOCATION_FAILURES = ("out of memory", "can't allocate memory", "not enough memory")


@contextmanager
def stage_memory(stage: str, advice: str) -> Iterator[None]:
    """Inside, an allocation failure (CUDA's ``torch.OutOfMemoryError``, the CPU allocator's
    ``RuntimeError``) becomes one :class:`OutOfMemoryError` naming ``stage`` and ``advice``.

    Raises:
        OutOfMemoryError: from the allocator's error (its ``__cause__``).
    """
    try:
        yield
        release_host_memory()
    except OutOfMemoryError:
        raise
    except RuntimeError as exc:  # torch.OutOfMemoryError is a RuntimeError too
        if not isinstance(exc, torch.OutOfMemoryError) and not any(s in str(exc) for s in _ALLOCATION_FAILURES):
            raise
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise OutOfMemoryError(f"out of memory while {stage} ({first_line}); {advice}") from exc


RELEASE_HOST_MEMORY_BYTES = 256 * 2**20
"""Freed heap memory below which :func:`release_host_memory` keeps it (256 MiB)."""


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


@functools.cache
def _glibc() -> tuple[Callable[[], _MallInfo2], Callable[[int], int], Callable[[int, int], int]] | None:
    try:
        libc = ctypes.CDLL(None)
        mallinfo2, malloc_trim, mallopt = libc.mallinfo2, libc.malloc_trim, libc.mallopt  # glibc 2.33 and later
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2
    return mallinfo2, malloc_trim, mallopt


HOST_MMAP_THRESHOLD_BYTES = 32 * 2**20
"""Host tensors of at least this size get pages of their own, returned when freed (32 MiB, glibc's
own largest dynamic threshold); smaller ones come from the heap, which keeps their pages for the
next allocation until :func:`release_host_memory` returns them."""

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def map_host_tensors(threshold_bytes: int = HOST_MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at ``threshold_bytes`` and its trim threshold at twice that
    (``mallopt``; where glibc's dynamic rule ends up, without depending on what was freed first):
    CPU tensors below the threshold come from the heap, which keeps the pages of those freed for
    the next ones, and the trainer returns the heap's freed pages between stages and before each
    optimizer step (:func:`release_host_memory`). Returns whether it was set (glibc only).

    Why: every page a fresh allocation touches costs a page fault and the kernel's zeroing. A
    training step allocates and frees its activations and temporaries (0.4-12 MiB each on
    SmolLM2-135M) thousands of times; mapped each on its own (the threshold fixed at 1 MiB, as
    issue 43 had it, to keep the freed ones out of the heap) they are faulted in every time. On
    the README recipe (Intel Xeon with AMX, 2 cores; ``benchmarks/RESULTS_pretrained.md``) the
    update's median went from 13.8-15.7 s to 8.3-9.2 s and the whole command from 6 min 31 s -
    7 min 18 s to 5 min 2 s - 5 min 28 s, at a peak of 3.83-3.90 GiB instead of 3.08-3.11: the
    heap's freed pages pinned between the gradients stay resident until the next
    :func:`release_host_memory`. The process-wide setting is made once by the torch backend
    on a CPU device.
    """
    if (glibc := _glibc()) is None:
        return False
    mallopt = glibc[2]
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold_bytes)) and bool(mallopt(_M_TRIM_THRESHOLD, 2 * threshold_bytes))


def release_host_memory(min_free_bytes: int = RELEASE_HOST_MEMORY_BYTES) -> bool:
    """Give the memory the C heap holds freed back to the operating system when it is at least
    ``min_free_bytes`` (glibc's ``mallinfo2`` and ``malloc_trim``; a no-op on other C libraries).
    Returns whether it did.

    CPU tensors under glibc's mmap threshold (32 MiB at most: activations, KV-cache pieces, a
    micro-batch's temporaries) come from the heap, which keeps their pages when they are freed, so a
    process's resident memory stays at its busiest moment's. After each stage and before each
    optimizer step the trainer returns them, the host's counterpart of verl's
    ``torch.cuda.empty_cache()`` between stages: at Qwen2.5-0.5B's shape (bf16, checkpointing,
    micro-batches of 16 rows) the heap held 1.45 GiB freed at the optimizer step, where weights,
    gradients and AdamW's moments peak together. Below the threshold the pages are kept: the next
    allocations would fault them in again, which cost the tiny default model about 25 ms a step.
    """
    if (glibc := _glibc()) is None:
        return False
    mallinfo2, malloc_trim, _ = glibc
    if mallinfo2().fordblks < min_free_bytes:
        return False
    malloc_trim(0)
    return True
