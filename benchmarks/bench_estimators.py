"""Estimator speed: rllm_torch against four references and a memory floor, in one run.

    python benchmarks/bench_estimators.py                 # CPU, writes outputs/benchmarks/RESULTS.md
    python benchmarks/bench_estimators.py --write-results # the same into the tracked benchmarks/RESULTS.md
    python benchmarks/bench_estimators.py --device cuda   # our estimators and the floor on CUDA

Columns (milliseconds, median of repeats): ``ours`` the estimator on packed rewards;
``ours+pack`` packing included (equal groups: ``from_padded`` of the ``[G, 8]`` tensor; ragged:
``from_flat`` of the flat tensor + dense group ids, validated); (b) ``loop`` a
per-group numpy loop as rLLM's reference page; (c) ``dict`` a per-trajectory Python dict loop;
(d) ``bincount`` label factorizing (``np.unique``) + ``np.bincount``; (e) ``floor`` one
elementwise pass over the same reward tensor into a preallocated output; ``compiled`` (equal
groups) the estimator inside ``torch.compile(fullgraph=True)``, as a user's compiled loop runs it.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from machine import cpu_name  # noqa: E402
from references import dict_loop, factorize_bincount, per_group_loop  # noqa: E402
from results import add_write_results, results_path  # noqa: E402

import rllm_torch  # noqa: E402
from rllm_torch import GroupedRewards, compute_advantages  # noqa: E402

ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus_baseline")
TOKEN_LEVEL_SECTION = "<!-- token-level: written by bench_token_level.py -->"
SIZES = (8 * 1024, 64 * 1024, 1024 * 1024, 4 * 1024 * 1024)


def timed(fn, device: str, budget_s: float = 0.5, max_repeats: int = 15) -> float:
    """Median wall time of ``fn`` in ms: one warm-up, then repeats within ``budget_s``."""

    def once() -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    first = once()
    repeats = 1 if first > budget_s else max(3, min(max_repeats, int(budget_s / max(first, 1e-6))))
    return 1e3 * statistics.median(once() for _ in range(repeats))


def make_batch(n: int, layout: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(rewards [N] float32, sizes [G])``: equal groups of 8, or ragged groups of 1-16."""
    rng = np.random.default_rng(seed)
    if layout == "equal":
        sizes = np.full(n // 8, 8)
    else:
        sizes = rng.integers(1, 17, size=n // 4)
        sizes = sizes[: np.searchsorted(np.cumsum(sizes), n, side="right")]
        sizes = np.append(sizes, n - sizes.sum()) if sizes.sum() < n else sizes
    return rng.random(int(sizes.sum()), dtype=np.float32), sizes


def check_against_float64(estimator: str, ours: np.ndarray, labels: np.ndarray, rewards: np.ndarray) -> None:
    """Our float32 advantages against the float64 reference, within what float32 allows: 1e-3,
    plus for ``grpo`` the rounding of the group mean (a few float32 ulps of the rewards) divided
    by the group's std, which is large for a group of near-equal rewards (std ~1e-6)."""
    reference = factorize_bincount(estimator, labels, rewards.astype(np.float64))
    tolerance = np.full_like(reference, 1e-3)
    if estimator == "grpo":
        counts = np.bincount(labels)
        mean = np.bincount(labels, rewards.astype(np.float64)) / counts
        m2 = np.bincount(labels, (rewards - mean[labels]) ** 2)
        std = np.sqrt(m2 / np.maximum(counts - 1, 1))
        tolerance += 4 * np.finfo(np.float32).eps * np.abs(rewards).max() / (std[labels] + 1e-6)
    error = np.abs(ours - reference)
    if not np.all(error <= tolerance):
        worst = int(np.argmax(error - tolerance))
        raise AssertionError(
            f"{estimator}: trajectory {worst} is {ours[worst]!r}, the float64 reference {reference[worst]!r} "
            f"(tolerance {tolerance[worst]:.3g})"
        )


def compiled_dense(estimator: str):
    """``estimator`` on a ``[G, K]`` reward tensor, compiled whole (what a user's compiled loop gets)."""
    fn = getattr(rllm_torch, estimator)
    return torch.compile(lambda rewards_GK: fn(GroupedRewards.from_padded(rewards_GK))[0], dynamic=True, fullgraph=True)


def run(sizes: tuple[int, ...], device: str, slow_limit: int, compile_dense: bool) -> list[dict]:
    compiled = {est: compiled_dense(est) for est in ESTIMATORS} if compile_dense else {}
    rows = []
    for n in sizes:
        for layout in ("equal", "ragged"):
            rewards_np, sizes_np = make_batch(n, layout, seed=n)
            labels_np = np.repeat(np.arange(len(sizes_np)), sizes_np)
            groups = np.split(rewards_np, np.cumsum(sizes_np)[:-1])
            rewards = torch.from_numpy(rewards_np).to(device)
            group_index = torch.from_numpy(labels_np).to(device)
            num_groups = len(sizes_np)

            def pack():
                if layout == "equal":
                    return GroupedRewards.from_padded(rewards.view(num_groups, 8))
                return GroupedRewards.from_flat(rewards, group_index, num_groups=num_groups)

            packed = pack()
            compute_advantages(packed, "grpo")  # builds the cached layout
            out = torch.empty_like(rewards)
            floor = timed(lambda: torch.neg(rewards, out=out), device)
            labels_list, rewards_list = labels_np.tolist(), rewards_np.astype(np.float64).tolist()
            for est in ESTIMATORS:
                ours_adv = compute_advantages(packed, est)[0].cpu().numpy()
                check_against_float64(est, ours_adv, labels_np, rewards_np)
                row = dict(n=int(rewards_np.size), layout=layout, estimator=est, floor=floor)
                row["ours"] = timed(lambda: compute_advantages(packed, est), device)
                row["ours+pack"] = timed(lambda: compute_advantages(pack(), est), device)
                row["compiled"] = float("nan")
                if est in compiled and layout == "equal":
                    rewards_GK = rewards.view(num_groups, 8)
                    np.testing.assert_allclose(compiled[est](rewards_GK).cpu().numpy(), ours_adv, rtol=1e-4, atol=1e-4)
                    row["compiled"] = timed(lambda: compiled[est](rewards_GK), device)
                row["bincount"] = timed(lambda: factorize_bincount(est, labels_np, rewards_np), "cpu")
                slow = n <= slow_limit
                row["loop"] = timed(lambda: per_group_loop(est, groups), "cpu", budget_s=2.0) if slow else float("nan")
                row["dict"] = (
                    timed(lambda: dict_loop(est, labels_list, rewards_list), "cpu", budget_s=2.0)
                    if slow
                    else float("nan")
                )
                rows.append(row)
                print(format_row(row), flush=True)
    return rows


HEADER = "| N | groups | estimator | ours ms | ours+pack ms | ours compiled ms | (b) loop ms | (c) dict ms | (d) bincount ms | (e) floor ms | (b)/ours | (d)/ours | ours/floor | compiled/floor |"


def _fmt(value: float, spec: str, suffix: str = "") -> str:
    return "n/a" if value != value else f"{value:{spec}}{suffix}"  # NaN: not measured


def format_row(r: dict) -> str:
    ratio = lambda a, b: _fmt(r[a] / r[b], ".1f", "x")  # noqa: E731
    return (
        f"| {r['n']:,} | {r['layout']} | {r['estimator']} | {r['ours']:.3f} | {r['ours+pack']:.3f} | {_fmt(r['compiled'], '.3f')} | {_fmt(r['loop'], '.1f')} | "
        f"{_fmt(r['dict'], '.1f')} | {r['bincount']:.2f} | {r['floor']:.3f} | {_fmt(r['loop'] / r['ours'], '.0f', 'x')} | {ratio('bincount', 'ours')} | "
        f"{ratio('ours', 'floor')} | {ratio('compiled', 'floor')} |"
    )


def machine(device: str) -> str:
    cpu = cpu_name()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    text = f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB; torch {torch.__version__} ({torch.get_num_threads()} threads), numpy {np.__version__}, Python {platform.python_version()}"
    if device == "cuda":
        text += f"; GPU: {torch.cuda.get_device_name()}"
    return text


def write_results(path: Path, rows: list[dict], device: str, command: str) -> None:
    lines = [
        f"# Estimator benchmark ({device})",
        "",
        f"Run {datetime.date.today().isoformat()} with `{command}` on: {machine(device)}.",
        "",
        "Float32 rewards; equal = groups of 8, ragged = groups of 1-16 (uniform). Times are medians in ms.",
        "(b)/(c) run only up to the size given by --slow-limit (nan above it).",
        "",
        HEADER,
        "|" + "---|" * (HEADER.count("|") - 1),
        *[format_row(r) for r in rows],
        "",
    ]
    old = path.read_text() if path.exists() else ""
    kept = old[old.index(TOKEN_LEVEL_SECTION) :] if TOKEN_LEVEL_SECTION in old else ""  # bench_token_level.py's
    path.write_text("\n".join(lines) + ("\n" + kept if kept else ""))


def sync_check(device: str) -> str:
    """Run every built-in under ``torch.cuda.set_sync_debug_mode("error")``: any host-device
    sync (``.item()``, ``nonzero``, data-dependent shapes) raises."""
    rewards = torch.rand(1024, 8, device=device)
    flat, index = torch.rand(5000, device=device), torch.randint(0, 700, (5000,), device=device)
    batches = [
        GroupedRewards.from_padded(rewards),
        GroupedRewards.from_flat(flat, index, num_groups=700, validate=False),
    ]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for batch in batches:
            for name in ("grpo", "rloo", "reinforce", "reinforce_plus_plus_baseline", "prpo", "grpo_passk", "gpg"):
                compute_advantages(batch, name)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return "sync check: all built-ins ran under set_sync_debug_mode('error') on dense and ragged batches without a host sync"


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument(
        "--slow-limit", type=int, default=4 * 1024 * 1024, help="largest N for the slow references (b) and (c)"
    )
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile column")
    parser.add_argument("--output", type=Path, default=None, help="results file ('-' to skip writing)")
    add_write_results(parser)
    args = parser.parse_args(argv)
    args.output = args.output or results_path("RESULTS.md", args.write_results)
    print(f"machine: {machine(args.device)}\n{HEADER}", flush=True)
    if args.device == "cuda":
        print(sync_check(args.device), flush=True)
    rows = run(tuple(args.sizes), args.device, args.slow_limit, compile_dense=not args.no_compile)
    if str(args.output) != "-":
        write_results(
            args.output,
            rows,
            args.device,
            "python benchmarks/bench_estimators.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        )
    return rows


if __name__ == "__main__":
    main()
