"""A pool of real processes in one gloo process group, kept alive across tests.

Each call sends a function and per-rank arguments to every rank and waits for all results with a
timeout; a rank that does not answer in time fails the test (and the pool is torn down), so a
bug that hangs a collective fails CI instead of hanging it. Functions must be importable by the
workers (module-level, in a module on ``sys.path``), as ``multiprocessing``'s spawn requires.
"""

from __future__ import annotations

import datetime
import faulthandler
import multiprocessing as mp
import os
import queue
import signal
import tempfile
import time
import traceback
from dataclasses import dataclass

CALL_TIMEOUT_S = 120.0
COLLECTIVE_TIMEOUT_S = 60.0


@dataclass
class RankError:
    """What a rank raised: the exception's class name and message (and the traceback, for failures)."""

    type_name: str
    message: str
    traceback: str

    def __repr__(self) -> str:
        return f"RankError({self.type_name}: {self.message})"


def _worker(rank: int, world_size: int, init_file: str, inbox, outbox) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the pool asks for stacks on a timeout
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    )
    while True:
        task = inbox.get()
        if task is None:
            break
        fn, args = task
        try:
            outbox.put((rank, fn(*args)))
        except Exception as exc:  # sent back to the test, which decides what is expected
            outbox.put((rank, RankError(type(exc).__name__, str(exc), traceback.format_exc())))
    dist.destroy_process_group()


class RankPool:
    """``world_size`` spawned processes, each rank ``r`` running ``fn(*args[r])`` on request."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        ctx = mp.get_context("spawn")
        self._dir = tempfile.TemporaryDirectory()
        init_file = os.path.join(self._dir.name, "init")
        self._inboxes = [ctx.Queue() for _ in range(world_size)]
        self._outbox = ctx.Queue()
        self._procs = [
            ctx.Process(target=_worker, args=(r, world_size, init_file, self._inboxes[r], self._outbox), daemon=True)
            for r in range(world_size)
        ]
        for p in self._procs:
            p.start()

    def run(self, fn, per_rank_args: list[tuple]) -> list:
        """Every rank's result (or :class:`RankError`), in rank order."""
        if len(per_rank_args) != self.world_size:
            raise ValueError(f"{len(per_rank_args)} argument tuples for {self.world_size} ranks")
        for inbox, args in zip(self._inboxes, per_rank_args, strict=True):
            inbox.put((fn, args))
        results: dict[int, object] = {}
        while len(results) < self.world_size:
            try:
                rank, value = self._outbox.get(timeout=CALL_TIMEOUT_S)
            except queue.Empty:
                missing = sorted(set(range(self.world_size)) - set(results))
                for rank in missing:  # where the silent ranks are stuck, on stderr
                    os.kill(self._procs[rank].pid, signal.SIGUSR1)
                time.sleep(1.0)
                self.close(force=True)
                answered = "; ".join(f"rank {r}: {v!r}" for r, v in sorted(results.items()))
                raise TimeoutError(
                    f"ranks {missing} did not answer {fn.__name__} within {CALL_TIMEOUT_S} s (the others: {answered})"
                ) from None
            results[rank] = value
        return [results[r] for r in range(self.world_size)]

    def run_ok(self, fn, per_rank_args: list[tuple]) -> list:
        """Like :meth:`run`, failing the test with the rank's traceback if any rank raised."""
        results = self.run(fn, per_rank_args)
        for rank, value in enumerate(results):
            if isinstance(value, RankError):
                raise AssertionError(f"rank {rank} raised {value.type_name}: {value.message}\n{value.traceback}")
        return results

    def close(self, force: bool = False) -> None:
        if not force:
            for inbox in self._inboxes:
                inbox.put(None)
            for p in self._procs:
                p.join(timeout=10)
        for p in self._procs:
            if p.is_alive():
                p.kill()
        self._dir.cleanup()
