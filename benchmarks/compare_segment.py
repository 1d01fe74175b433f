"""This checkout's group centring against another version of ``rllm_torch/core/segment.py``, in one process.

    git show <commit>:rllm_torch/core/segment.py > /tmp/segment_before.py
    python benchmarks/compare_segment.py /tmp/segment_before.py

(A version from before the package's layout step, ``rllm_torch/segment.py`` at e.g. ``08fba75``
as ``RESULTS.md`` compares, imports the modules of that time, ``rllm_torch.distributed``: run it
from a checkout of that commit.)

Every estimator call runs on the same float32 rewards (N = 1M; equal groups of 8 and ragged groups
of 1-16, as ``bench_estimators.py``) once with each version's ``SegmentLayout`` reductions
(the whole class, as ``GroupedRewards.layout`` builds it; the estimators' own code is this
checkout's), interleaved repetition by repetition, so both see the same machine load. Prints
median milliseconds and their ratio (this checkout / the other); 1 thread.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from machine import cpu_name  # noqa: E402

import rllm_torch.core.grouping as grouping  # noqa: E402
import rllm_torch.core.segment as segment  # noqa: E402
from rllm_torch import GroupedRewards, compute_advantages  # noqa: E402

ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus_baseline")


def _layout_class(path: Path) -> type:
    spec = importlib.util.spec_from_file_location("segment_other", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SegmentLayout


def _batches(n: int) -> dict[str, callable]:
    rng = np.random.default_rng(0)
    equal = torch.from_numpy(rng.random(n, dtype=np.float32)).view(-1, 8)
    sizes = rng.integers(1, 17, size=n // 4)
    sizes = sizes[: np.searchsorted(np.cumsum(sizes), n, side="right")]
    sizes = np.append(sizes, n - sizes.sum()) if sizes.sum() < n else sizes
    index = torch.from_numpy(np.repeat(np.arange(len(sizes)), sizes))
    ragged = torch.from_numpy(rng.random(int(sizes.sum()), dtype=np.float32))
    return {
        "equal": lambda: GroupedRewards.from_padded(equal),
        "ragged": lambda: GroupedRewards.from_flat(ragged, index, num_groups=len(sizes)),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path, help="another version of rllm_torch/core/segment.py")
    parser.add_argument("--n", type=int, default=1 << 20)
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    versions = {"this": segment.SegmentLayout, "other": _layout_class(args.other)}
    print(f"machine: {cpu_name()}; torch {torch.__version__}, 1 thread; N = {args.n:,}; other = {args.other}")
    print("| groups | estimator | other ms | this ms | this / other |\n|---|---|---|---|---|")
    try:
        for layout, make in _batches(args.n).items():
            for estimator in ESTIMATORS:
                times = {name: [] for name in versions}
                for _ in range(args.repeats):
                    for name, cls in versions.items():
                        grouping.SegmentLayout = cls
                        batch = make()
                        _ = batch.layout  # built outside the timing
                        start = time.perf_counter()
                        compute_advantages(batch, estimator)
                        times[name].append(time.perf_counter() - start)
                this, other = (1e3 * statistics.median(times[k][3:]) for k in ("this", "other"))
                print(f"| {layout} | {estimator} | {other:.2f} | {this:.2f} | {this / other:.2f} |", flush=True)
    finally:
        grouping.SegmentLayout = segment.SegmentLayout


if __name__ == "__main__":
    main()
