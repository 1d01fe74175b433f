"""The README's real-checkpoint command as a user runs it, timed: ``rllm-torch-train --config-name
smollm2`` (SmolLM2-135M-Instruct from its GGUF file, its defaults), once per seed, one run at a
time; the validation curve (pass@1 and pass@2 at every validation), the wall time of the whole
command, its peak resident memory and its step times by stage, with the machine and its load.

    python benchmarks/bench_pretrained_recipe.py                   # outputs/benchmarks/RESULTS_pretrained.md
    python benchmarks/bench_pretrained_recipe.py --write-results   # benchmarks/RESULTS_pretrained.md
    python benchmarks/bench_pretrained_recipe.py --heldout /tmp/subtraction --set rllm.trainer.total_batches=10
        # the held-out check: the same recipe on a task it does not name (benchmarks/subtraction_task.py)

Seeds: ``seed=S backend.seed=S`` (S = ``--seeds``, default 0 1; seed 0 is the command as printed).
Wall time: the process from start to exit (start-up, the GGUF conversion when its cache is empty,
training, validations, checkpoints, the export). Peak memory: the process's ``ru_maxrss`` (``wait4``).
``--append`` adds the section to the results file instead of replacing it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import transformers
from machine import cpu_name
from results import add_write_results, write_results_file
from subtraction_task import write_task

COMMAND = ["-m", "rllm_torch.train", "--config-name", "smollm2"]


def run(run_dir: Path, overrides: list[str]) -> dict:
    """One run of the recipe with ``overrides`` into ``run_dir`` (emptied first): its metrics rows,
    wall time (s), peak RSS (GiB) and the load average before and after."""
    shutil.rmtree(run_dir, ignore_errors=True)
    command = [sys.executable, *COMMAND, *overrides, f"hydra.run.dir={run_dir}"]
    print(" ".join(command), flush=True)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with (run_dir.parent / f"{run_dir.name}.log").open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        raise RuntimeError(f"the run failed; see {run_dir.parent / f'{run_dir.name}.log'}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    precision = precision_row(run_dir.parent / f"{run_dir.name}.log")
    return {
        "rows": rows,
        "wall_s": wall,
        "peak_gib": usage.ru_maxrss / 2**20,
        "load": (load, os.getloadavg()[0]),
        "precision": precision,
    }


def precision_row(log: Path) -> str:
    """The start-up summary's ``precision`` row of a run's log: the dtypes the run computed in."""
    for line in log.read_text().splitlines():
        if line.strip().startswith("precision"):
            return line.strip().removeprefix("precision").strip()
    return "(no precision row)"


def validation_cells(rows: list[dict]) -> tuple[list[int], dict[int, str]]:
    """The validation steps and, for each, ``"pass@1 (pass@2)"`` of the first data source."""
    cells = {}
    for row in rows:
        ones = sorted(k for k in row if k.startswith("val/") and k.endswith("/pass@1"))
        if ones:
            two = ones[0].replace("/pass@1", "/pass@2")
            cells[row["step"]] = f"{row[ones[0]]:.3f}" + (f" ({row[two]:.3f})" if two in row else "")
    return sorted(cells), cells


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more overrides of the recipe")
    parser.add_argument("--heldout", type=Path, default=None, help="train on the subtraction task written here")
    parser.add_argument("--out", type=Path, default=Path("outputs/bench_pretrained"))
    parser.add_argument("--title", default=None)
    parser.add_argument("--append", action="store_true")
    add_write_results(parser)
    args = parser.parse_args(argv)
    overrides = list(args.set)
    if args.heldout is not None:
        overrides = ["task=file", *write_task(args.heldout), *overrides]
    runs = {}
    for seed in args.seeds:
        seeded = [] if seed == 0 else [f"seed={seed}", f"backend.seed={seed}"]
        runs[seed] = run(args.out.resolve() / f"seed_{seed}", [*overrides, *seeded])
    steps = sorted({s for r in runs.values() for s in validation_cells(r["rows"])[0]})
    lines = [
        f"# {args.title or 'The README recipe: rllm-torch-train --config-name smollm2'}",
        "",
        f"Run {datetime.datetime.now():%Y-%m-%d %H:%M} with `python benchmarks/bench_pretrained_recipe.py "
        f"{' '.join(argv if argv is not None else sys.argv[1:])}` on {cpu_name()}, "
        f"{len(os.sched_getaffinity(0))} cores; torch {torch.__version__}, transformers {transformers.__version__}. "
        "Each run is the whole command, one at a time; the load average (1 min) before and after each run is given "
        "(the machine is shared: other work there slows a run).",
        "",
        f"Overrides: `{' '.join(overrides) or '(none: the command as printed)'}`; seed S adds `seed=S backend.seed=S`.",
        "",
        "| run | " + " | ".join(f"val pass@1 (pass@2), step {s}" for s in steps) + " | wall time (whole command) "
        "| s / step, mean | sampling s (median) | update s (median) | peak RSS | load before, after | dtypes (start-up "
        "summary) |",
        "|---|" + "---|" * len(steps) + "---|---|---|---|---|---|---|",
    ]
    for seed, result in runs.items():
        _, cells = validation_cells(result["rows"])
        trained = [r for r in result["rows"] if "time/step" in r]
        minutes, seconds = divmod(round(result["wall_s"]), 60)
        lines.append(
            f"| seed {seed} | "
            + " | ".join(cells.get(s, "-") for s in steps)
            + f" | {minutes} min {seconds} s | {statistics.fmean(r['time/step'] for r in trained):.1f} | "
            f"{statistics.median(r['time/generate'] for r in trained):.1f} | "
            f"{statistics.median(r['time/update'] for r in trained):.1f} | {result['peak_gib']:.2f} GiB | "
            f"{result['load'][0]:.2f}, {result['load'][1]:.2f} | {result['precision']} |"
        )
    write_results_file("RESULTS_pretrained.md", "\n".join(lines) + "\n", args.write_results, append=args.append)


if __name__ == "__main__":
    main()
