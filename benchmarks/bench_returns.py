"""Discounted returns over ``[B, T]`` (REINFORCE++'s reverse scan, and GAE's with ``gamma * lam``):
our time-major scan against the alternatives, in one run, with their errors against float64.

    python benchmarks/bench_returns.py                  # writes outputs/benchmarks/RESULTS_returns.md
    python benchmarks/bench_returns.py --write-results  # the same into the tracked benchmarks/RESULTS_returns.md

Methods (float32 rewards with a random response mask, 10% untrained tokens):

* ``ours``: :func:`rllm_torch.core.returns.discounted_returns`; ``gamma = 1`` a reverse
  cumulative sum, else the closed form over blocks of 64 tokens, all blocks at once,
  ``G_t = gamma^-c_t * revcumsum(gamma^c r)_t`` (``c``: trained tokens before each position in
  its block) plus the next block's first return, carried by a loop of ``T / 64`` steps on
  ``[B]`` vectors;
* ``time-major scan``: ``T`` fused multiply-adds on contiguous ``[B]`` rows of the transposed
  tensors (our first implementation);
* ``batch-major scan``: the same recurrence on ``[:, t]`` columns of the ``[B, T]`` tensors
  (strided), as verl's ``compute_reinforce_plus_plus_outcome_advantage`` loops (verl also
  multiplies the running return by the mask, which resets it at untrained tokens; here it skips
  them, as ours).

Errors are max ``|G - G_float64|`` over the batch, relative to ``max |G_float64|``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from machine import cpu_name
from results import add_write_results, results_path

from rllm_torch.core.returns import discounted_returns

BLOCK = 64


def batch_major_loop(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    out = torch.zeros_like(rewards)
    running = rewards.new_zeros(rewards.shape[0])
    factor = torch.where(mask > 0, gamma, 1.0).to(rewards.dtype)
    for t in range(rewards.shape[1] - 1, -1, -1):
        running = rewards[:, t] + factor[:, t] * running
        out[:, t] = running
    return out * mask


def time_major_scan(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """``T`` fused multiply-adds ``G_t = r_t + f_t G_{t+1}`` on contiguous ``[B]`` rows of the
    transposed tensors (``f = gamma`` on trained tokens, 1 elsewhere)."""
    factor_TB = torch.where(mask > 0, torch.tensor(gamma, dtype=rewards.dtype), 1.0).T.contiguous()
    rewards_TB = rewards.T.contiguous()
    out_TB = torch.empty_like(rewards_TB)
    running = rewards_TB.new_zeros(rewards_TB.shape[1])
    for t in range(rewards_TB.shape[0] - 1, -1, -1):
        running = torch.addcmul(rewards_TB[t], factor_TB[t], running, out=out_TB[t])
    return out_TB.T.contiguous().mul_(mask)


def timed(fn, budget_s: float = 1.0) -> float:
    fn()
    times = []
    while sum(times) < budget_s or len(times) < 3:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        if len(times) >= 20:
            break
    return 1e3 * statistics.median(times)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).abs().max() / want.abs().max().clamp(min=1e-30))


def run(shapes: list[tuple[int, int]], gammas: list[float]) -> list[dict]:
    rows = []
    for batch, width in shapes:
        gen = torch.Generator().manual_seed(batch + width)
        mask = (torch.rand(batch, width, generator=gen) > 0.1).float()
        rewards = torch.randn(batch, width, generator=gen) * mask
        for gamma in gammas:
            want = discounted_returns(rewards.double(), mask.double(), gamma)
            methods = {"ours": lambda g=gamma: discounted_returns(rewards, mask, g)}
            methods["time-major scan"] = lambda g=gamma: time_major_scan(rewards, mask, g)
            methods["batch-major scan"] = lambda g=gamma: batch_major_loop(rewards, mask, g)
            ours_ms = None
            for name, fn in methods.items():
                ms = timed(fn)
                ours_ms = ms if name == "ours" else ours_ms
                row = dict(
                    shape=f"{batch} x {width}", gamma=gamma, method=name, ms=ms, error=relative_error(fn(), want)
                )
                row["vs_ours"] = ms / ours_ms
                rows.append(row)
                print(
                    f"{row['shape']:>12}  gamma={gamma:<5} {name:<20} {ms:9.2f} ms  x{row['vs_ours']:.2f}  err {row['error']:.1e}",
                    flush=True,
                )
    return rows


def write(rows: list[dict], path: Path) -> None:
    machine = f"{cpu_name()}, {os.cpu_count()} cores"
    lines = [
        "# Discounted returns over [B, T]: our scan against the alternatives",
        "",
        f"Run {datetime.datetime.now():%Y-%m-%d %H:%M} with `python benchmarks/bench_returns.py` on {machine}; "
        f"torch {torch.__version__} ({torch.get_num_threads()} thread(s)). Float32 rewards, 10% untrained tokens; "
        "medians in ms; error = max |G - G_float64| / max |G_float64|. See the script's docstring.",
        "",
        "| B x T | gamma | method | ms | time / ours | relative error |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['shape']} | {r['gamma']} | {r['method']} | {r['ms']:.2f} | {r['vs_ours']:.2f}x | {r['error']:.1e} |"
        for r in rows
    ]
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="1024x1024,256x4096,8192x128", help="comma-separated BxT")
    parser.add_argument("--gammas", default="0.99,1.0")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", default=None, help="results file (default: see --write-results)")
    add_write_results(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    rows = run(shapes, [float(g) for g in args.gammas.split(",")])
    write(rows, Path(args.output) if args.output else results_path("RESULTS_returns.md", args.write_results))
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
