"""Which ranks a packed batch spans, and the collectives its statistics use (docs/design.md §5).

A :class:`~rllm_torch.GroupedRewards` built with ``process_group=pg`` holds this rank's share of
a batch spread over the ranks of ``pg``; its :class:`~rllm_torch.core.segment.SegmentLayout` reduces
over them, so every estimator gives each rank the advantages one process would compute on the
concatenation of all ranks' batches. Two layouts:

* **split groups** (the default): group ids are global, every rank passes the same ``G``, and a
  group may be on one rank, on several, or on none. Group statistics are all-reduced: payload
  ``O(G)`` per rank, a fixed number of collectives per estimator call.
* **rank-local groups** (``local_groups=True``): every group is wholly on one rank (the trainer's
  case: the ``n`` rollouts of a prompt are sampled on the rank that holds the prompt); group ids
  and ``G`` are this rank's own. Group statistics need no communication; only batch statistics
  (``reinforce_plus_plus_baseline``, ``prpo``) are reduced, with ``O(1)`` payload.

Collectives go through ``torch.distributed`` on the process group's own backend: gloo for CPU
tensors, NCCL for CUDA tensors. Nothing here reads a tensor's data, so the estimator path stays
free of host-device synchronisation; only the optional input checks (``validate=True``) gather
a few Python values, once, before any statistic.
"""

from __future__ import annotations

import enum
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

import rllm_torch.core.errors as errors
from rllm_torch.core.errors import DistributedBatchError, DistributedSetupError

__all__ = [
    "ONE_PROCESS",
    "resolve_process_group",
    "check_backend_carries",
    "all_reduce_",
    "require_live",
    "world_position",
    "gather_objects",
    "agree_across_ranks",
]


class _OneProcess(enum.Enum):
    """The default of every ``process_group`` argument: the batch is all on this process. An
    enum member: one instance (``is ONE_PROCESS`` holds after copy and pickling), and a constant
    ``torch.compile`` traces through (an object built inside a compiled function, such as a
    ``TokenRewards``, takes it as a default)."""

    ONE_PROCESS = "ONE_PROCESS"

    def __repr__(self) -> str:
        return "ONE_PROCESS"


_BUILTIN_ERRORS = {"ValueError": ValueError, "TypeError": TypeError}

ONE_PROCESS = _OneProcess.ONE_PROCESS
"""``process_group=ONE_PROCESS`` (the default): no collective, the batch is all on this process.

``process_group=None`` means what it means in ``torch.distributed``: the default (WORLD) group,
which must be initialised. So ``torch.distributed.group.WORLD``, ``None`` before
``init_process_group``, fails loudly instead of silently computing per-rank statistics."""


def resolve_process_group(process_group: object) -> dist.ProcessGroup | None:
    """The ``ProcessGroup`` a batch reduces over, or ``None`` for one process (``ONE_PROCESS``).

    Raises:
        DistributedSetupError: ``torch.distributed`` is not initialised (``process_group`` given,
            or ``None``), ``process_group`` is not a ``ProcessGroup``, or this rank is not a member.
    """
    if process_group is ONE_PROCESS:
        return None
    if not dist.is_available() or not dist.is_initialized():
        raise DistributedSetupError(
            f"process_group={process_group!r} but torch.distributed is not initialised; call "
            "torch.distributed.init_process_group(...) first (torchrun sets its environment), or leave "
            "process_group out for a batch that is all on this process."
        )
    group = dist.group.WORLD if process_group is None else process_group
    if group is dist.GroupMember.NON_GROUP_MEMBER:  # what new_group returns on a rank outside it
        raise DistributedSetupError(
            f"this process (global rank {dist.get_rank()}) is not a member of the process group it was given "
            "(torch.distributed.new_group returns a placeholder on the ranks it leaves out); pass its batch "
            "only on the group's ranks, or pass a group this rank belongs to."
        )
    if not isinstance(group, dist.ProcessGroup):
        raise DistributedSetupError(
            f"process_group must be a torch.distributed.ProcessGroup (e.g. torch.distributed.group.WORLD), "
            f"got {type(process_group).__name__}."
        )
    if dist.get_rank(group) < 0:
        raise DistributedSetupError(
            f"this process (global rank {dist.get_rank()}) is not a member of the process group it was given."
        )
    return group


def check_backend_carries(group: dist.ProcessGroup, device: torch.device) -> None:
    """Raise :class:`DistributedSetupError` when ``group``'s backend cannot carry tensors on ``device``
    (an NCCL-only group and CPU tensors)."""
    if str(dist.get_backend(group)) == "nccl" and device.type != "cuda":
        raise DistributedSetupError(
            f"the process group's backend is NCCL, which carries CUDA tensors, but the rewards are on {device}; "
            "move them to this rank's GPU, or use a gloo group (torch.distributed.new_group(backend='gloo'))."
        )


def world_position(group: dist.ProcessGroup | None) -> tuple[int, int]:
    """``(rank, world_size)`` within ``group``; ``(0, 1)`` for one process."""
    return (0, 1) if group is None else (dist.get_rank(group), dist.get_world_size(group))


def require_live(group: dist.ProcessGroup) -> None:
    """Raise :class:`DistributedSetupError` when ``torch.distributed`` was shut down since ``group``
    was given (a collective on a destroyed group would quietly do nothing, and a batch would get
    this rank's statistics only). A Python check: no synchronisation."""
    if not dist.is_initialized():
        raise DistributedSetupError(
            "this batch was built with a process group, but torch.distributed has been shut down since "
            "(destroy_process_group); build the batch again without process_group, or compute before shutting down."
        )


def all_reduce_(tensor: Tensor, group: dist.ProcessGroup | None, op: str = "sum") -> Tensor:
    """``tensor`` reduced in place over ``group`` (``op`` ``"sum"`` or ``"max"``); unchanged for one process.

    One ``torch.distributed.all_reduce`` call on ``tensor``'s device, asynchronous with respect
    to the host (no synchronisation on CUDA).

    Raises:
        DistributedSetupError: ``torch.distributed`` was shut down (see :func:`require_live`).
    """
    if group is not None:
        require_live(group)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM, group=group)
    return tensor


def gather_objects(obj: Any, group: dist.ProcessGroup | None) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order: one ``all_gather_object``; ``[obj]`` for
    one process (``group`` None)."""
    if group is None:
        return [obj]
    require_live(group)
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def agree_across_ranks(
    group: dist.ProcessGroup, error: Exception | None, facts: dict[str, Any], *, must_match: tuple[str, ...]
) -> list[dict[str, Any]]:
    """The input check that needs the other ranks: one ``all_gather_object`` of ``(error, facts)``.

    Every rank learns every rank's result, so every rank raises the same error (none waits in a
    collective for a rank that already failed).

    Args:
        group: the process group.
        error: the error this rank's own input checks raised (an ``rllm_torch`` error, or a
            ``ValueError`` / ``TypeError``), or ``None``.
        facts: small Python values describing this rank's batch.
        must_match: keys of ``facts`` that must be equal on every rank that gives them.

    Returns:
        Every rank's ``facts``, in rank order.

    Raises:
        RLLMTorchError: the error of the lowest failing rank (same class; the message names the
            rank), on every rank.
        DistributedBatchError: else, for the first key of ``must_match`` that differs, naming
            the value on each rank.
    """
    require_live(group)
    rank, world = world_position(group)
    mine = (None if error is None else (type(error).__name__, str(error)), facts)
    gathered: list = [None] * world
    dist.all_gather_object(gathered, mine, group=group)
    for other, (failure, _) in enumerate(gathered):
        if failure is not None:
            if other == rank:
                raise error
            cls = getattr(errors, failure[0], None) or _BUILTIN_ERRORS.get(failure[0], DistributedBatchError)
            raise cls(f"rank {other} of {world} rejected its input: {failure[1]}")
    all_facts = [f for _, f in gathered]
    for key in must_match:
        values = [f[key] for f in all_facts if key in f]  # a rank may leave a fact out (it has none)
        if any(v != values[0] for v in values):
            listing = ", ".join(f"rank {r}: {f[key]}" for r, f in enumerate(all_facts) if key in f)
            raise DistributedBatchError(
                f"{key} differs across the ranks of the process group ({listing}); every rank must pass the same {key}."
            )
    return all_facts
