"""Turn-level advantages: the speed of :func:`~rllm_torch.core.estimators.turns.turn_level_advantages`
against a per-trajectory loop and against broadcast, on the same batch, in one run.

    python benchmarks/bench_turns.py                  # writes outputs/benchmarks/RESULTS_turns.md
    python benchmarks/bench_turns.py --write-results  # the same into the tracked benchmarks/RESULTS_turns.md

Batches: ``G`` groups of ``n`` trajectories with 1 to ``K`` turns each (uniform), float64 turn
rewards, ``gamma = 0.9``, RLOO. Methods:

* ``turn_level``: ours, from flat tensors (the returns on an ``[N, K]`` view, then RLOO on
  (group, turn) segments); the packing (:meth:`GroupedTurns.from_flat`, which reads the ids
  once) timed with it;
* ``broadcast``: ours, the trajectory's RLOO advantage on each of its turns (same packing);
* ``per-trajectory loop``: the turn-level numbers written as rLLM's per-step code would: a
  Python loop over trajectories for the returns, a dict of (group, turn) members, and a loop
  for each turn's leave-one-out baseline (checked equal to ours).

Times are medians of ``--repeats`` calls after one warm-up, in milliseconds.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from machine import cpu_name  # noqa: E402
from results import add_write_results, results_path  # noqa: E402

from rllm_torch.core.estimators import broadcast_advantages, rloo, turn_level_advantages  # noqa: E402
from rllm_torch.core.turns import GroupedTurns  # noqa: E402

GAMMA = 0.9


def make_batch(groups: int, size: int, max_turns: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    turns_N = torch.randint(1, max_turns + 1, (groups * size,), generator=gen)
    trajectory_M = torch.repeat_interleave(torch.arange(groups * size), turns_N)
    rewards_M = torch.randn(trajectory_M.shape[0], generator=gen, dtype=torch.float64)
    return rewards_M, trajectory_M, torch.arange(groups * size) // size, groups


def ours(rewards_M, trajectory_M, group_N, groups, scheme):
    turns = GroupedTurns.from_flat(rewards_M, trajectory_M, group_N, num_groups=groups)
    return scheme(turns, rloo)[0] if scheme is broadcast_advantages else scheme(turns, rloo, gamma=GAMMA)[0]


def per_trajectory_loop(rewards_M, trajectory_M, group_N, groups):
    rewards, trajectory, group = rewards_M.tolist(), trajectory_M.tolist(), group_N.tolist()
    by_trajectory: dict[int, list[int]] = defaultdict(list)
    for m, n in enumerate(trajectory):
        by_trajectory[n].append(m)
    returns = [0.0] * len(rewards)
    members: dict[tuple[int, int], list[int]] = defaultdict(list)
    for n, turns in by_trajectory.items():
        running = 0.0
        for t in range(len(turns) - 1, -1, -1):
            running = rewards[turns[t]] + GAMMA * running
            returns[turns[t]] = running
        for t, m in enumerate(turns):
            members[(group[n], t)].append(m)
    out = [0.0] * len(rewards)
    for ms in members.values():
        total = sum(returns[m] for m in ms)
        for m in ms:
            out[m] = returns[m] - (total - returns[m]) / (len(ms) - 1) if len(ms) > 1 else returns[m]
    return torch.tensor(out, dtype=torch.float64)


def timed(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    add_write_results(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sizes = [(64, 8, 4), (256, 8, 8), (1024, 16, 8), (512, 8, 32)]
    lines = [
        "# Turn-level advantages: ours against a per-trajectory loop and broadcast",
        "",
        f"{datetime.date.today()}, {cpu_name()}, {os.cpu_count()} cores, {args.threads} thread(s), torch {torch.__version__}.",
        "Command: `python benchmarks/bench_turns.py` (median of "
        f"{args.repeats} calls, ms; gamma {GAMMA}, RLOO, float64; packing from flat tensors included).",
        "",
        "| groups x size, turns 1..K | turns M | turn_level | broadcast | per-trajectory loop | loop / turn_level | turn_level / broadcast |",
        "|---|---|---|---|---|---|---|",
    ]
    for groups, size, max_turns in sizes:
        batch = make_batch(groups, size, max_turns)
        want = per_trajectory_loop(*batch)
        torch.testing.assert_close(ours(*batch, turn_level_advantages), want, rtol=1e-9, atol=1e-9)
        t_turn = timed(lambda b=batch: ours(*b, turn_level_advantages), args.repeats)
        t_broadcast = timed(lambda b=batch: ours(*b, broadcast_advantages), args.repeats)
        t_loop = timed(lambda b=batch: per_trajectory_loop(*b), max(3, args.repeats // 4))
        lines.append(
            f"| {groups} x {size}, K={max_turns} | {batch[0].shape[0]} | {t_turn:.2f} | {t_broadcast:.2f} | "
            f"{t_loop:.2f} | {t_loop / t_turn:.1f}x | {t_turn / t_broadcast:.2f} |"
        )
    path = results_path("RESULTS_turns.md", args.write_results)
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
