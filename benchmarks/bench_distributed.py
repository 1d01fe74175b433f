"""Estimators across gloo ranks: ours against the two ways peers move the batch, in one run.

    python benchmarks/bench_distributed.py              # 2 and 4 processes, writes outputs/benchmarks/RESULTS_distributed.md
    python benchmarks/bench_distributed.py --write-results  # the same into the tracked benchmarks/RESULTS_distributed.md
    python benchmarks/bench_distributed.py --quick      # smaller, no file written

Every rank holds ``N / W`` float32 rewards. Layouts: ``split`` (trajectory ``i`` on rank ``i % W``,
so every group is spread over the ranks; our split-groups layout) and ``local`` (contiguous
shares, each group whole on one rank; our rank-local layout, ``local_groups=True``). Methods:

* ``ours``: ``GroupedRewards.from_flat(..., process_group=WORLD, validate=False)`` + the estimator;
  statistics reduced where the data are (``O(G)`` all-reduces for split groups, ``O(1)`` for
  batch statistics, nothing else);
* (a) ``all-gather``: every rank all-gathers every reward (and, for ragged groups, every group
  id), computes the whole batch on one process and keeps its share (TRL's approach);
* (b) ``gather-scatter``: rank 0 gathers every reward (and group id), computes, scatters the
  advantages back (the single-controller approach of verl and RL2).

Time: per repeat, a barrier, then each rank's wall time; the repeat's time is the slowest rank's
(all-reduced max); the median over repeats is reported, in ms. Bytes: what each rank sends,
counted from the tensors passed to each collective with a ring model (all-reduce of ``S`` bytes:
``2 (W - 1) / W * S``; all-gather of ``s`` per rank: ``(W - 1) s``; gather/scatter: ``s`` per
non-root rank / ``(W - 1) s`` at the root), averaged over the ranks. Each process uses 1 thread.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from machine import cpu_name
from results import add_write_results, results_path

import rllm_torch
from rllm_torch import GroupedRewards, compute_advantages

ESTIMATORS = ("grpo", "reinforce_plus_plus_baseline")
WORLD_SIZES = (2, 4)
SIZES = (64 * 1024, 1024 * 1024)
RESULTS = Path(__file__).parent / "RESULTS_distributed.md"
NOTES_MARKER = "## Reading the numbers"


class ByteCounter:
    """Wraps ``torch.distributed``'s collectives to add up what this rank sends (ring model)."""

    NAMES = ("all_reduce", "all_gather_into_tensor", "all_gather", "gather", "scatter", "all_gather_object")

    def __init__(self, world: int, rank: int):
        self.world, self.rank, self.sent = world, rank, 0
        self._originals = {name: getattr(dist, name) for name in self.NAMES}

    def _bytes(self, name: str, args: tuple, kwargs: dict) -> int:
        w = self.world
        if name == "all_reduce":
            return int(2 * (w - 1) / w * args[0].numel() * args[0].element_size())
        if name == "all_gather_into_tensor":
            return (w - 1) * args[1].numel() * args[1].element_size()
        if name == "all_gather":
            return (w - 1) * args[1].numel() * args[1].element_size()
        if name == "gather":
            root = kwargs.get("dst", 0)
            return 0 if self.rank == root else args[0].numel() * args[0].element_size()
        if name == "scatter":
            root = kwargs.get("src", 0)
            chunks = args[1] if len(args) > 1 else kwargs.get("scatter_list")
            return sum(c.numel() * c.element_size() for c in chunks[1:]) if self.rank == root else 0
        return 0

    def __enter__(self):
        for name, fn in self._originals.items():

            def wrapped(*args, _name=name, _fn=fn, **kwargs):
                self.sent += self._bytes(_name, args, kwargs)
                return _fn(*args, **kwargs)

            setattr(dist, name, wrapped)
        return self

    def __exit__(self, *exc):
        for name, fn in self._originals.items():
            setattr(dist, name, fn)


def make_share(n: int, groups: str, layout: str, world: int, rank: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """This rank's ``(rewards, global group ids, G)`` from one global batch. Equal groups, split:
    members ``j = rank, rank + W, ...`` of every group, as a ``[G, 8 / W]`` tensor (ids unused);
    ragged, split: trajectory ``i`` on rank ``i % W``; local: whole groups, cut near ``N / W``."""
    rng = np.random.default_rng(n)
    if groups == "equal":
        sizes = np.full(n // 8, 8)
    else:
        sizes = rng.integers(1, 17, size=n // 4)
        sizes = sizes[: np.searchsorted(np.cumsum(sizes), n, side="right")]
        sizes = np.append(sizes, n - sizes.sum()) if sizes.sum() < n else sizes
    rewards = rng.random(n, dtype=np.float32)
    index = np.repeat(np.arange(len(sizes)), sizes)
    if layout == "split" and groups == "equal":
        share = rewards.reshape(-1, 8)[:, rank::world]
        return torch.from_numpy(share.copy()), torch.from_numpy(index.reshape(-1, 8)[:, rank::world].copy()), len(sizes)
    if layout == "split":
        mine = slice(rank, None, world)
    else:  # whole groups: cut at the group boundaries nearest to equal shares
        starts = np.concatenate([[0], np.cumsum(sizes)])
        cuts = [0] + [int(starts[np.searchsorted(starts, r * n // world)]) for r in range(1, world)] + [n]
        mine = slice(cuts[rank], cuts[rank + 1])
    return torch.from_numpy(rewards[mine].copy()), torch.from_numpy(index[mine].copy()), len(sizes)


def _gather_padded(values_N: torch.Tensor, sizes: list[int], root: int | None) -> torch.Tensor | None:
    """Every rank's ``values`` concatenated in rank order, padded to the largest share for the
    collective (to every rank, or to ``root`` only: ``None`` elsewhere)."""
    width = max(sizes)
    padded = torch.zeros(width, dtype=values_N.dtype)
    padded[: values_N.numel()] = values_N
    if root is None:
        out = torch.empty(len(sizes) * width, dtype=values_N.dtype)
        dist.all_gather_into_tensor(out, padded)
        parts = out.split(width)
    else:
        parts = [torch.empty_like(padded) for _ in sizes] if dist.get_rank() == root else None
        dist.gather(padded, parts, dst=root)
        if parts is None:
            return None
    return torch.cat([p[:size] for p, size in zip(parts, sizes, strict=True)])


def _share_sizes(values_N: torch.Tensor) -> list[int]:
    sizes = torch.empty(dist.get_world_size(), dtype=torch.int64)
    dist.all_gather_into_tensor(sizes, torch.tensor([values_N.numel()]))
    return sizes.tolist()


def ours(rewards, index, num_groups, estimator, layout, groups):
    world_group = dist.group.WORLD
    if layout == "split" and groups == "equal":  # [G, 8 / W]: this rank's members of every group
        batch = GroupedRewards.from_padded(rewards, process_group=world_group, validate=False)
    elif layout == "split":
        batch = GroupedRewards.from_flat(
            rewards, index, num_groups=num_groups, validate=False, process_group=world_group
        )
    elif groups == "equal":  # this rank's groups of 8
        batch = GroupedRewards.from_padded(
            rewards.view(-1, 8), process_group=world_group, local_groups=True, validate=False
        )
    else:  # this rank's groups, renumbered from 0 (a contiguous share: subtract the first id)
        local = index - index[0]
        batch = GroupedRewards.from_flat(
            rewards, local, num_groups=int(local[-1]) + 1, validate=False, process_group=world_group, local_groups=True
        )
    return compute_advantages(batch, estimator)[0]


def _whole_batch(everything, ids, num_groups, layout, groups, world):
    """The single-process batch of the gathered rewards (ids gathered only for ragged groups)."""
    if groups == "ragged":
        return GroupedRewards.from_flat(everything, ids, num_groups=num_groups, validate=False)
    if layout == "split":  # rank-major [W, G, 8 / W] -> [G, 8]
        everything = everything.view(world, num_groups, -1).transpose(0, 1).reshape(num_groups, 8)
    return GroupedRewards.from_padded(everything.view(-1, 8))


def _own_part(adv_N, sizes, layout, groups, world, rank):
    if groups == "equal" and layout == "split":
        return adv_N.view(-1, world, 8 // world)[:, rank]
    start = sum(sizes[:rank])
    return adv_N[start : start + sizes[rank]]


def all_gather_everything(rewards, index, num_groups, estimator, layout, groups):
    world, rank = dist.get_world_size(), dist.get_rank()
    flat = rewards.reshape(-1)
    # equal groups: equal shares and the layout known from the order, so only the rewards travel
    sizes = [flat.numel()] * world if groups == "equal" else _share_sizes(flat)
    everything = _gather_padded(flat, sizes, None)
    ids = _gather_padded(index, sizes, None) if groups == "ragged" else None
    adv_N = compute_advantages(_whole_batch(everything, ids, num_groups, layout, groups, world), estimator)[0]
    return _own_part(adv_N, sizes, layout, groups, world, rank)


def gather_scatter(rewards, index, num_groups, estimator, layout, groups):
    world, rank = dist.get_world_size(), dist.get_rank()
    flat = rewards.reshape(-1)
    sizes = [flat.numel()] * world if groups == "equal" else _share_sizes(flat)
    everything = _gather_padded(flat, sizes, 0)
    ids = _gather_padded(index, sizes, 0) if groups == "ragged" else None
    width = max(sizes)
    out = torch.empty(width, dtype=torch.float32)
    chunks = None
    if rank == 0:
        adv_N = compute_advantages(_whole_batch(everything, ids, num_groups, layout, groups, world), estimator)[0]
        parts = [_own_part(adv_N, sizes, layout, groups, world, r).reshape(-1) for r in range(world)]
        chunks = [torch.nn.functional.pad(part, (0, width - part.numel())) for part in parts]
    dist.scatter(out, chunks, src=0)
    return out[: flat.numel()].view_as(rewards)


METHODS = {"ours": ours, "(a) all-gather": all_gather_everything, "(b) gather-scatter": gather_scatter}


def timed(fn, repeats: int) -> float:
    """Median over repeats of the slowest rank's wall time, in ms."""
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        fn()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(1e3 * elapsed.item())
    return statistics.median(times)


def worker(rank: int, world: int, init_file: str, sizes: tuple[int, ...], repeats: int, out_file: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300)
    )
    rows = []
    for n in sizes:
        for groups in ("equal", "ragged"):
            for layout in ("split", "local"):
                rewards_N, index_N, num_groups = make_share(n, groups, layout, world, rank)
                for estimator in ESTIMATORS:
                    args = (rewards_N, index_N, num_groups, estimator, layout, groups)
                    want = all_gather_everything(*args)
                    row = dict(world=world, n=n, groups=groups, layout=layout, estimator=estimator)
                    for name, method in METHODS.items():
                        got = method(*args)
                        if not torch.allclose(got.reshape(-1), want.reshape(-1), rtol=1e-4, atol=1e-5):
                            raise RuntimeError(f"{name} disagrees with (a) on {row}")
                        with ByteCounter(world, rank) as counter:
                            method(*args)
                        sent = torch.tensor([float(counter.sent)], dtype=torch.float64)
                        dist.all_reduce(sent)
                        row[name] = (timed(lambda m=method: m(*args), repeats), sent.item() / world)
                    rows.append(row)
    if rank == 0:
        torch.save(rows, out_file)
    dist.destroy_process_group()


def run(world_sizes, sizes, repeats) -> list[dict]:
    rows = []
    for world in world_sizes:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "rows.pt")
            mp.start_processes(
                worker,
                args=(world, os.path.join(tmp, "init"), sizes, repeats, out),
                nprocs=world,
                start_method="spawn",
            )
            rows += torch.load(out)
    return rows


def table(rows: list[dict]) -> str:
    head = (
        "| ranks | N | groups | layout | estimator | ours ms | (a) ms | (b) ms | (a)/ours time | (b)/ours time "
        "| ours bytes/rank | (a) bytes/rank | (b) bytes/rank | (a)/ours bytes |\n|" + "---|" * 14
    )
    lines = [head]
    for r in rows:
        (t0, b0), (ta, ba), (tb, bb) = r["ours"], r["(a) all-gather"], r["(b) gather-scatter"]
        ratio = f"{ba / b0:.0f}x" if b0 else "inf (ours sends nothing)"
        est = "reinforce++ baseline" if r["estimator"] == "reinforce_plus_plus_baseline" else r["estimator"]
        lines.append(
            f"| {r['world']} | {r['n'] // 1024}k | {r['groups']} | {r['layout']} | {est} | {t0:.2f} | {ta:.2f} | {tb:.2f} "
            f"| {ta / t0:.1f}x | {tb / t0:.1f}x | {b0:,.0f} | {ba:,.0f} | {bb:,.0f} | {ratio} |"
        )
    return "\n".join(lines)


def machine() -> str:
    cpu = cpu_name()
    return (
        f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}, "
        f"rllm_torch {rllm_torch.__version__}, gloo over loopback, 1 thread per process"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 8k only, 2 ranks, 3 repeats; print, write nothing")
    add_write_results(parser)
    args = parser.parse_args()
    results = results_path(RESULTS.name, args.write_results)
    if args.quick:
        print(table(run((2,), (8 * 1024,), 3)))
        return
    rows = run(WORLD_SIZES, SIZES, 9)
    text = table(rows)
    print(text)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    old = results.read_text() if results.exists() else ""
    notes = old[old.index(NOTES_MARKER) :] if NOTES_MARKER in old else ""  # hand-written, kept
    results.write_text(
        f"# Estimators across ranks: measured {stamp}\n\n`python benchmarks/bench_distributed.py` on {machine()}.\n"
        "See the script's docstring for the methods, the layouts and how time and bytes are counted.\n\n"
        f"{text}\n\n{notes}"
    )
    print(f"wrote {results}", file=sys.stderr)


if __name__ == "__main__":
    main()
