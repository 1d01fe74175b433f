"""``backend.dtype`` on the machine at hand: the README's real-checkpoint recipe for a few steps
with its defaults (``auto``: each phase's dtype measured at start-up) beside the same command with
``backend.dtype=float32`` and ``backend.dtype=bfloat16``, in one run of this script, one command at
a time (alternating when ``--rounds`` > 1); and the float32 and bf16 matmul rates of the model's
own shapes, measured in the same run, as the floors the phases are read against.

    python benchmarks/bench_dtype.py                   # outputs/benchmarks/RESULTS_dtype.md
    python benchmarks/bench_dtype.py --write-results   # benchmarks/RESULTS_dtype.md

Each command: ``rllm-torch-train --config-name smollm2 rllm.trainer.total_batches=3
rllm.trainer.test_freq=0 rllm.trainer.val_before_train=false`` plus its dtype and an empty
``backend.dtype_cache`` of its own (so ``auto`` measures, as on a machine's first run); per run the median of
its steps' ``time/step``, ``time/generate`` and ``time/update``, and the start-up summary's
``precision`` row (what ``auto`` chose and the ratios it measured). The floors: GFLOP/s of
``[rows, 576] @ [576, 1536]`` (SmolLM2's MLP) at the decoding batch (64 rows) and at a training
micro-batch (4096 rows), and of the head, ``[1024, 576] @ [576, 49152]``, in float32 and in bf16
(bf16 weights, no cast in the timing), best of 5.

The other CPU kinds of these machines can be approximated on an Intel CPU with AMX by holding the
libraries to their instruction sets (inherited by every command the script runs, and named in the
results): an Intel CPU with AVX-512 BF16 and no AMX, ``ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16``
(oneDNN runs PyTorch's bf16 matmuls); an AMD CPU with AVX2 only, ``ONEDNN_MAX_CPU_ISA=AVX2
MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
from pathlib import Path

import torch
import transformers
from bench_pretrained_recipe import run
from bench_sampling import matmul_rate
from machine import cpu_name
from results import add_write_results, write_results_file

STEPS = ["rllm.trainer.total_batches=3", "rllm.trainer.test_freq=0", "rllm.trainer.val_before_train=false"]
SETTINGS = {"defaults (auto)": [], "float32": ["backend.dtype=float32"], "bfloat16": ["backend.dtype=bfloat16"]}
CAPS = ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY")
SHAPES = {
    "decode, 64 x 576 x 1536": (64, 576, 1536),
    "micro-batch, 4096 x 576 x 1536": (4096, 576, 1536),
    "head, 1024 x 576 x 49152": (1024, 576, 49152),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="runs of each setting, alternating")
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--out", type=Path, default=Path("outputs/bench_dtype"))
    parser.add_argument("--append", action="store_true", help="add the section to the results file")
    parser.add_argument("--title", default=None, help="the section's heading")
    parser.add_argument(
        "--floor-repeats",
        type=int,
        default=5,
        help="timed rounds of 10 matmuls per floor; 0: no floors (bf16 emulated: minutes)",
    )
    add_write_results(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    floors = {
        name: (
            matmul_rate(*shape, torch.float32, args.floor_repeats),
            matmul_rate(*shape, torch.bfloat16, args.floor_repeats),
        )
        for name, shape in SHAPES.items()
        if args.floor_repeats
    }
    results: dict[str, list[dict]] = {name: [] for name in args.settings}
    for round_ in range(args.rounds):
        for name in args.settings:
            run_dir = args.out.resolve() / f"{name.split()[0]}_{round_}"
            fresh = f"backend.dtype_cache={run_dir}.dtype_probe.json"  # measured at start-up, as a machine's first run
            (run_dir.parent / f"{run_dir.name}.dtype_probe.json").unlink(missing_ok=True)
            result = run(run_dir, [*STEPS, *SETTINGS[name], fresh])
            results[name].append(result)
    lines = [
        *([] if args.append else ["# backend.dtype measured: the recipe's defaults beside float32 and bfloat16", ""]),
        "## " + (args.title or "On this machine"),
        "",
        f"Run {datetime.datetime.now():%Y-%m-%d %H:%M} with `python benchmarks/bench_dtype.py "
        f"{' '.join(argv if argv is not None else sys.argv[1:])}` on {cpu_name()}, "
        f"{len(os.sched_getaffinity(0))} cores; torch {torch.__version__}, transformers {transformers.__version__}. "
        f"Each run: `rllm-torch-train --config-name smollm2 {' '.join(STEPS)}` plus its setting, one at a time; "
        "medians of its 3 steps. Instruction sets held by: "
        + (", ".join(f"`{k}={os.environ[k]}`" for k in CAPS if k in os.environ) or "nothing (the CPU's own)")
        + ".",
        "",
        f"Matmul rates measured in the same run (GFLOP/s, float32 / bf16 weights, best of {args.floor_repeats}): "
        + (
            "; ".join(f"{name}: {f32:.0f} / {bf16:.0f} ({bf16 / f32:.2f}x)" for name, (f32, bf16) in floors.items())
            or "not measured (--floor-repeats 0)"
        )
        + ".",
        "",
        "| setting | s / step | sampling s | update s | vs float32, s / step | what ran (start-up summary) | "
        "peak RSS | load before, after |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def median(result: dict, key: str) -> float:
        return statistics.median(r[key] for r in result["rows"] if "time/step" in r)

    reference = (
        statistics.median(median(r, "time/step") for r in results.get("float32", [])) if "float32" in results else None
    )
    for name, runs in results.items():
        for result in runs:
            step = median(result, "time/step")
            ratio = f"{step / reference:.2f}x" if reference else "-"
            lines.append(
                f"| {name} | {step:.1f} | {median(result, 'time/generate'):.1f} | {median(result, 'time/update'):.1f} "
                f"| {ratio} | {result['precision']} | {result['peak_gib']:.2f} GiB | "
                f"{result['load'][0]:.2f}, {result['load'][1]:.2f} |"
            )
    write_results_file("RESULTS_dtype.md", "\n".join(lines) + "\n", args.write_results, append=args.append)


if __name__ == "__main__":
    main()
