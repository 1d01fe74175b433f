"""``TaskDataLoader``: batches of ``(task_id, task)`` pairs from a list of task dicts."""

from __future__ import annotations

import random
from collections.abc import Iterator

__all__ = ["TaskDataLoader"]


class TaskDataLoader:
    """Batches of ``batch_size`` tasks (the last one may be smaller); with ``shuffle`` the order
    changes every epoch, from ``random.Random(seed + epoch)`` (reproducible). The epoch is the
    one given to :meth:`set_epoch`, else the number of earlier passes.

    With ``world_size > 1`` every rank builds the same global batches and yields its share of
    each: the contiguous slice ``[rank * b // W, (rank + 1) * b // W)`` of a batch of ``b`` tasks
    (disjoint, equal when ``W`` divides ``b``; a short last batch leaves some ranks one task fewer,
    or none). Every rank has the same number of batches.

    A task's id is ``f"{prefix}-{position in the dataset}"``, so rollouts of one row share it.
    """

    def __init__(
        self,
        rows: list[dict],
        batch_size: int,
        *,
        shuffle: bool = False,
        seed: int = 0,
        prefix: str = "task",
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}.")
        self.rows, self.batch_size, self.shuffle, self.seed, self.prefix = list(rows), batch_size, shuffle, seed, prefix
        self.rank, self.world_size = rank, world_size
        self._epoch = 0

    def __len__(self) -> int:
        return -(-len(self.rows) // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """The next pass yields epoch ``epoch``'s order."""
        self._epoch = epoch

    def __iter__(self) -> Iterator[list[tuple[str, dict]]]:
        order = list(range(len(self.rows)))
        if self.shuffle:
            random.Random(self.seed + self._epoch).shuffle(order)
        self._epoch += 1
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            share = batch[self.rank * len(batch) // self.world_size : (self.rank + 1) * len(batch) // self.world_size]
            yield [(f"{self.prefix}-{i}", self.rows[i]) for i in share]
