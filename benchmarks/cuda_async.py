"""Async training on a CUDA device, in real ``rllm-torch-train`` runs (``backend.device=cuda``):

1. staleness 0 with a sync every step is the synchronous run: every metric but the timings and
   the exported weights equal, on the GPU too (the update in its own thread, with its own
   CUDA stream use, sampling on the main thread);
2. steps per hour, sync against async at staleness 1, on ``task=guess`` whose environment waits
   50-200 ms per reply (the latency benchmark of ``bench_async.py``), and on the default task.

    python benchmarks/cuda_async.py --output RESULTS_cuda_async.md     # needs a CUDA device
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from machine import cpu_name  # noqa: E402
from train_runs import train_run  # noqa: E402

CUDA = ["backend.device=cuda", "rllm.trainer.log_table_every=0", "rllm.trainer.save_freq=0"]
ASYNC = ["rllm.async_training.enable=true"]


def _metrics(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "async/"))} for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=Path("RESULTS_cuda_async.md"))
    parser.add_argument("--out", type=Path, default=Path("outputs/cuda_async"))
    args = parser.parse_args()
    lines = [
        "# Async training on CUDA",
        "",
        f"Device: {torch.cuda.get_device_name()}; host: {cpu_name()}; torch {torch.__version__}, Python "
        f"{platform.python_version()}. Command: `python benchmarks/cuda_async.py` (the project's lent GPU machine).",
        "",
    ]
    base = [*CUDA, "rllm.trainer.total_batches=8", "rllm.trainer.test_freq=4"]
    sync = train_run(args.out / "eq_sync", base, "val/arithmetic/pass@1")
    streamed = train_run(args.out / "eq_async", [*base, *ASYNC], "val/arithmetic/pass@1")
    same_metrics = _metrics(sync["rows"]) == _metrics(streamed["rows"])
    weights = [
        (args.out / d / "checkpoints" / "final" / "model.safetensors").read_bytes() for d in ("eq_sync", "eq_async")
    ]
    lines += [
        "## Staleness 0, a sync every step = the synchronous run",
        "",
        f"Default task, 8 steps, validation every 4: metrics equal: **{same_metrics}**; exported weights "
        f"byte-identical: **{weights[0] == weights[1]}**.",
        "",
        "## Steps per hour (training time: the sum of time/step)",
        "",
        "| task | steps | sync steps/h | async staleness 1 steps/h | x sync | async staleness mean |",
        "|---|---|---|---|---|---|",
    ]
    for name, overrides, key in [
        (
            "guess, 50-200 ms per environment reply",
            ["--config-name", "guess", "task.env_latency_ms=[50,200]", "rllm.trainer.test_freq=48"],
            "val/guess/pass@1",
        ),
        ("default (arithmetic, no latency)", ["rllm.trainer.test_freq=48"], "val/arithmetic/pass@1"),
    ]:
        rates, stale = [], 0.0
        for extra in ([], [*ASYNC, "rllm.async_training.staleness_threshold=1"]):
            slug = name.split(",")[0].split(" ")[0] + ("_async" if extra else "_sync")
            done = train_run(args.out / slug, [*overrides, *CUDA, "rllm.trainer.total_batches=48", *extra], key)
            steps = [r for r in done["rows"] if "time/step" in r]
            rates.append(3600 / statistics.mean(r["time/step"] for r in steps[1:]))  # the first step warms up CUDA
            if extra:
                stale = statistics.mean(r["async/staleness_mean"] for r in steps)
        lines.append(f"| {name} | 48 | {rates[0]:.0f} | {rates[1]:.0f} | {rates[1] / rates[0]:.2f} | {stale:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    args.output.write_text(text)
    print(json.dumps({"same_metrics": same_metrics, "same_weights": weights[0] == weights[1]}))


if __name__ == "__main__":
    main()
