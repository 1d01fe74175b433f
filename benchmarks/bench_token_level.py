"""The trainer's token-level path against verl's GRPO, in one process, on the same inputs.

    pip install -e ".[bench]"                      # verl 0.9.1 (optional extra; a separate venv is
                                                   # best: verl pins transformers < 5.11)
    python benchmarks/bench_token_level.py         # the token-level section of outputs/benchmarks/RESULTS.md
    python benchmarks/bench_token_level.py --write-results  # ... of the tracked benchmarks/RESULTS.md

Two workloads, 1 torch thread, float32, medians in ms:

* **token level**: ``B = 8192`` responses of ``T = 1024`` tokens (70% trained), groups of 8
  (equal) or of 1-16 (ragged): token rewards → sequence scores → GRPO → ``[B, T]`` advantages
  under the mask. Ours: ``sequence_scores`` + the estimator + ``broadcast_to_tokens`` into a
  preallocated buffer (and, for comparison, into a fresh tensor as verl does); verl:
  ``compute_grpo_vectorized_outcome_advantage`` and the per-row loop ``compute_grpo_outcome_advantage``
  on the same ``token_level_rewards``, ``response_mask`` and integer ``index``. The floor: one
  elementwise pass over ``[B, T]`` into a preallocated buffer (``torch.mul(x, 1, out=buf)``).
* **ragged, N = 1M**: one token per response (``T = 1``), groups of 1-16 in group-major order:
  the grouping work alone. Ours: ``GroupedRewards.from_flat(..., validate=False)`` + GRPO.

Every implementation's output is checked against ours (verl uses the sample std: ours runs with
``std_correction=1`` here) before it is timed.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from machine import cpu_name
from results import add_write_results, results_path

from rllm_torch import GroupedRewards, broadcast_to_tokens, grpo, sequence_scores

RESULTS = Path(__file__).parent / "RESULTS.md"
BEGIN, END = "<!-- token-level: written by bench_token_level.py -->", "<!-- /token-level -->"


def timed(fn, budget_s: float = 1.0, max_repeats: int = 25) -> float:
    fn()
    first = time.perf_counter()
    fn()
    once = time.perf_counter() - first
    times = []
    for _ in range(max(3, min(max_repeats, int(budget_s / max(once, 1e-6))))):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def group_sizes(n: int, layout: str, rng: np.random.Generator) -> np.ndarray:
    if layout == "equal":
        return np.full(n // 8, 8)
    sizes = rng.integers(1, 17, size=n // 4)
    sizes = sizes[: np.searchsorted(np.cumsum(sizes), n, side="right")]
    return np.append(sizes, n - sizes.sum()) if sizes.sum() < n else sizes


def make(n: int, t: int, layout: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    sizes = group_sizes(n, layout, rng)
    index = np.repeat(np.arange(len(sizes)), sizes)
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(n, t, generator=g) < 0.7).float() if t > 1 else torch.ones(n, 1)
    rewards = torch.zeros(n, t)
    rewards[:, -1] = torch.randint(0, 2, (n,), generator=g).float()  # an outcome reward on the last token
    if t > 1:
        rewards += 0.01 * torch.randn(n, t, generator=g) * mask  # and a shaped per-token part
    return rewards, mask, index, sizes


def ours(layout: str, index: np.ndarray, sizes: np.ndarray):
    """Our token-level path as a closure over fixed inputs (the group ids are made once, as a
    trainer makes them when it builds its batch)."""
    index_t = torch.from_numpy(index)
    num_groups, k = len(sizes), int(sizes[0])

    def run(rewards, mask, out=None):
        scores = sequence_scores(rewards)
        batch = (
            GroupedRewards.from_padded(scores.view(num_groups, k))
            if layout == "equal"
            else GroupedRewards.from_flat(scores, index_t, num_groups=num_groups, validate=False)
        )
        adv, _ = grpo(batch, std_correction=1)
        return broadcast_to_tokens(adv, mask, out=out)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true", help="print only")
    add_write_results(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from verl import __version__ as verl_version
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, compute_grpo_vectorized_outcome_advantage

    rows = []
    for layout in ("equal", "ragged"):
        rewards, mask, index, sizes = make(8192, 1024, layout)
        run = ours(layout, index, sizes)
        buffer = torch.empty_like(mask)
        want = run(rewards, mask, buffer).clone()
        verl_vec = lambda: compute_grpo_vectorized_outcome_advantage(rewards, mask, index)[0]  # noqa: E731
        verl_loop = lambda: compute_grpo_outcome_advantage(rewards, mask, index)[0]  # noqa: E731
        for name, fn in (("verl vectorized", verl_vec), ("verl loop", verl_loop)):
            torch.testing.assert_close(fn(), want, rtol=1e-4, atol=1e-4, msg=name)
        row = {
            "workload": f"8192 x 1024 tokens, {layout}",
            "ours (buffer)": timed(lambda: run(rewards, mask, buffer)),
            "ours (new tensor)": timed(lambda: run(rewards, mask)),
            "verl vectorized": timed(verl_vec),
            "verl loop": timed(verl_loop, budget_s=2.0, max_repeats=5),
            "floor": timed(lambda: torch.mul(rewards, 1.0, out=buffer)),
        }
        rows.append(row)
    rewards, mask, index, sizes = make(1 << 20, 1, "ragged")
    run = ours("ragged", index, sizes)
    want = run(rewards, mask)
    verl_vec = lambda: compute_grpo_vectorized_outcome_advantage(rewards, mask, index)[0]  # noqa: E731
    torch.testing.assert_close(verl_vec(), want, rtol=1e-4, atol=1e-4)
    buffer = torch.empty_like(mask)
    rows.append(
        {
            "workload": "N = 1M, ragged (1-16), T = 1",
            "ours (buffer)": timed(lambda: run(rewards, mask, buffer)),
            "ours (new tensor)": timed(lambda: run(rewards, mask)),
            "verl vectorized": timed(verl_vec),
            "verl loop": float("nan"),
            "floor": timed(lambda: torch.mul(rewards, 1.0, out=buffer)),
        }
    )
    table = [
        "| workload | ours, into a buffer | ours, new tensor | verl vectorized | verl loop | floor | verl vectorized / ours | ours / floor |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        table.append(
            f"| {r['workload']} | {r['ours (buffer)']:.2f} | {r['ours (new tensor)']:.2f} | {r['verl vectorized']:.2f} | "
            f"{r['verl loop']:.1f} | {r['floor']:.2f} | {r['verl vectorized'] / r['ours (buffer)']:.1f}x | "
            f"{r['ours (buffer)'] / r['floor']:.1f}x |"
        )
    cpu = cpu_name()
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    section = "\n".join(
        [
            BEGIN,
            "## Token-level path against verl",
            "",
            f"Run {stamp} with `python benchmarks/bench_token_level.py` on {cpu}, {os.cpu_count()} cores; torch "
            f"{torch.__version__} (1 thread), verl {verl_version}. Medians in ms; see the script's docstring.",
            "",
            *table,
            END,
        ]
    )
    print(section)
    if not args.no_write:
        results = results_path(RESULTS.name, args.write_results)
        text = results.read_text() if results.exists() else ""
        if BEGIN in text:
            text = text[: text.index(BEGIN)] + section + text[text.index(END) + len(END) :]
        else:
            text = text.rstrip("\n") + "\n\n" + section + "\n"
        results.write_text(text)


if __name__ == "__main__":
    main()
