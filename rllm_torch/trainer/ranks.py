"""``RunRanks``: the processes of one training run, and the few collectives the trainer itself needs.

A run launched with ``torchrun`` (``torchrun --nproc_per_node=N -m rllm_torch.train ...``) has
``N`` processes; :func:`init_run_ranks` reads torchrun's environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) and initialises ``torch.distributed``: gloo when
the run is on CPU; ``cpu:gloo,cuda:nccl`` on CUDA (NCCL carries the CUDA tensors: gradients,
advantages; gloo the few host-side values: metrics, checkpoint states), one GPU per local rank.
Without torchrun the run is one process and nothing here communicates.

Every collective has the process group's timeout (``backend.dist_timeout_s``, default 600 s):
a rank that waits longer for its peers raises instead of hanging. Under torchrun a rank that
exits (an error, a kill) also makes torchrun stop the others at once.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from rllm_torch.core.distributed import ONE_PROCESS, agree_across_ranks
from rllm_torch.core.errors import DistributedSetupError

__all__ = ["RunRanks", "init_run_ranks", "shutdown", "torchrun_world_size"]


@dataclass(frozen=True)
class RunRanks:
    """Where this process stands in its run. The default: one process.

    Attributes:
        rank: this process's rank, ``0 .. world_size - 1``; rank 0 writes logs and checkpoints.
        world_size: the number of processes.
        local_rank: the rank on this machine (picks the GPU).
        process_group: the run's ``ProcessGroup``; ``None`` for one process.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    process_group: dist.ProcessGroup | None = None

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that prints, logs and writes checkpoints."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.process_group is not None

    @property
    def estimator_group(self) -> object:
        """The ``process_group`` argument of the estimator API: the group, or ``ONE_PROCESS``."""
        return self.process_group if self.distributed else ONE_PROCESS

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (one ``all_gather_object``); ``[obj]`` for one process."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.process_group)
        return out

    def reduce(self, values: list[float], op: str = "sum") -> list[float]:
        """Python numbers summed (``op="sum"``) or maxed (``"max"``) over the ranks, in float64, on CPU."""
        if not self.distributed or not values:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM, group=self.process_group)
        return tensor.tolist()

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is true on some rank (the same answer on every rank)."""
        return bool(self.reduce([float(flag)], "max")[0])

    def agree(self, error: Exception | None) -> None:
        """Raise on every rank the error that some rank hit (see :func:`~rllm_torch.core.distributed.agree_across_ranks`)."""
        if self.distributed:
            agree_across_ranks(self.process_group, error, {}, must_match=())
        elif error is not None:
            raise error

    def reduce_max_metrics(self, metrics: dict[str, float], prefix: str = "time/") -> None:
        """Replace every ``prefix*`` metric by its maximum over the ranks, in place (timings: the
        slowest rank sets the pace). Every rank must hold the same keys."""
        keys = sorted(k for k in metrics if k.startswith(prefix))
        metrics.update(zip(keys, self.reduce([float(metrics[k]) for k in keys], "max"), strict=True))


def shutdown(ranks: RunRanks, *, clean: bool) -> None:
    """Destroy the run's process group (no-op for one process). After a clean run every rank
    first waits at a barrier, so none tears the group down while another still talks on it;
    after an error it is destroyed at once (a barrier would wait for ranks that are gone)."""
    if not ranks.distributed or not dist.is_initialized():
        return
    if clean:
        dist.barrier(group=ranks.process_group)
    dist.destroy_process_group()


def torchrun_world_size() -> int | None:
    """``WORLD_SIZE`` when this process was started by ``torchrun`` (``RANK`` is set), else None."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    return int(os.environ["WORLD_SIZE"])


def init_run_ranks(device: str, timeout_s: float) -> RunRanks:
    """Initialise ``torch.distributed`` from torchrun's environment (no-op without torchrun).

    Args:
        device: ``backend.device``: ``auto`` (CUDA when available), ``cpu``, ``cuda`` or ``cuda:N``.
        timeout_s: the collective timeout, seconds.

    Returns:
        The run's :class:`RunRanks`; with CUDA, ``torch.cuda.set_device(local_rank)`` has been called.

    Raises:
        DistributedSetupError: CUDA asked for with fewer GPUs on this machine than local ranks,
            ``backend.device=cuda:N`` under torchrun (each local rank takes its own GPU), or a
            non-positive timeout. Every rank finds the same problem, so every rank raises.
    """
    world = torchrun_world_size()
    if world is None:
        return RunRanks()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", 0))
    if not timeout_s > 0:
        raise DistributedSetupError(f"backend.dist_timeout_s must be > 0 seconds, got {timeout_s!r}.")
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if cuda:
        if ":" in device:
            raise DistributedSetupError(
                f"backend.device={device!r} under torchrun: each local rank takes the GPU of its LOCAL_RANK; use backend.device=cuda."
            )
        count = torch.cuda.device_count()
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        if count == 0:
            raise DistributedSetupError(
                f"backend.device={device} but CUDA is not available on this machine; use backend.device=auto or cpu."
            )
        if local_rank >= count or local_world > count:
            raise DistributedSetupError(
                f"backend.device={device} with {count} GPU(s) on this machine but {local_world} local ranks "
                f"(this is local rank {local_rank}); launch at most {count} processes per machine "
                "(torchrun --nproc_per_node), or use backend.device=cpu."
            )
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(
            "cpu:gloo,cuda:nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=float(timeout_s))
        )
    return RunRanks(rank=rank, world_size=world, local_rank=local_rank, process_group=dist.group.WORLD)
