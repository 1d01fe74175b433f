"""Seconds per training step of the default task on 1 and 2 processes, and the communication per step.

    python benchmarks/bench_trainer_scaling.py            # writes outputs/benchmarks/RESULTS_trainer_scaling.md
    python benchmarks/bench_trainer_scaling.py --write-results  # the same into the tracked benchmarks/RESULTS_trainer_scaling.md
    python benchmarks/bench_trainer_scaling.py --steps 8  # a quick look, nothing written

Each configuration runs ``rllm-torch-train`` on the default task (64 prompts x 8 rollouts a
step, the 2-layer GPT-2, validation off) for ``--steps`` steps, twice:

* once plain: seconds per step from ``metrics.jsonl`` (``time/step``, the slowest rank's),
  median over the steps after the first 5;
* once under ``torch.profiler``: the communication time per step, the summed wall time of the
  collectives it recorded (``gloo:*`` / ``nccl:*`` events: DDP's gradient all-reduces, the
  estimators' and metrics' collectives), the slowest rank's. DDP's all-reduces overlap the
  backward pass, so this is time spent in communication, not time added to the step.

Configurations: one process without torchrun (the README's command) with 1 and 2 threads, and
torchrun with 1 and 2 processes of 1 thread each (the same global batch: each rank samples and
trains on 32 of the 64 prompts).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from machine import cpu_name
from results import add_write_results, results_path

RESULTS = Path(__file__).parent / "RESULTS_trainer_scaling.md"
WARMUP_STEPS = 5


def overrides(run_dir: Path, steps: int, threads: int) -> list[str]:
    return [
        f"rllm.trainer.total_batches={steps}",
        "rllm.trainer.val_before_train=false",
        "rllm.trainer.test_freq=0",
        "rllm.trainer.save_freq=0",
        "rllm.trainer.logger=[jsonl]",
        f"backend.num_threads={threads}",
        "backend.device=cpu",
        f"hydra.run.dir={run_dir}",
    ]


def worker(argv: list[str]) -> None:
    """Inside a launched process: the run, profiled when asked; each rank writes its communication time."""
    from hydra import compose, initialize_config_module

    from rllm_torch.cli.train_command import run

    profile, run_dir, rest = argv[0] == "profile", Path(argv[1]), argv[2:]
    with initialize_config_module("rllm_torch.configs", version_base=None):
        config = compose("train", overrides=[o for o in rest if not o.startswith("hydra.")])
    config.rllm.trainer.default_local_dir = str(run_dir)
    if not profile:
        run(config)
        return
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        run(config)
    comm_ms = sum(e.cpu_time_total / 1e3 for e in prof.key_averages() if e.key.startswith(("gloo:", "nccl:")))
    rank = int(os.environ.get("RANK", 0))
    (run_dir / f"comm_rank{rank}.json").write_text(json.dumps({"comm_ms": comm_ms}))


def launch(nproc: int | None, threads: int, steps: int, run_dir: Path, profile: bool) -> None:
    mode = "profile" if profile else "plain"
    args = [__file__, "--worker", mode, str(run_dir), *overrides(run_dir, steps, threads)]
    command = (
        [sys.executable, *args]
        if nproc is None
        else [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]
    )
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    subprocess.run(command, check=True, env=env, capture_output=True, timeout=1800)


def measure(label: str, nproc: int | None, threads: int, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        plain, profiled = Path(tmp) / "plain", Path(tmp) / "profiled"
        launch(nproc, threads, steps, plain, profile=False)
        rows = [json.loads(line) for line in (plain / "metrics.jsonl").read_text().splitlines()]
        step_s = [r["time/step"] for r in rows if "time/step" in r and r["step"] > WARMUP_STEPS]
        launch(nproc, threads, steps, profiled, profile=True)
        comm = max(json.loads(p.read_text())["comm_ms"] for p in profiled.glob("comm_rank*.json"))
    return {"label": label, "step_s": statistics.median(step_s), "comm_ms_per_step": comm / steps}


CONFIGS = [
    ("1 process, 1 thread (no torchrun)", None, 1),
    ("1 process, 2 threads (no torchrun)", None, 2),
    ("torchrun, 1 process", 1, 1),
    ("torchrun, 2 processes", 2, 1),
]


def table(rows: list[dict]) -> str:
    base = rows[0]["step_s"]
    lines = [
        "| configuration | s / step | speed-up vs 1 process, 1 thread | communication ms / step |",
        "|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['label']} | {r['step_s']:.3f} | {base / r['step_s']:.2f}x | {r['comm_ms_per_step']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="training steps per run (default 40)")
    add_write_results(parser)
    args = parser.parse_args()
    rows = [measure(label, nproc, threads, args.steps) for label, nproc, threads in CONFIGS]
    text = table(rows)
    print(text)
    if args.steps < 40:
        return
    cpu = cpu_name()
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    results = results_path(RESULTS.name, args.write_results)
    results.write_text(
        f"# Trainer scaling: measured {stamp}\n\n`python benchmarks/bench_trainer_scaling.py` ({args.steps} steps per run) "
        f"on {cpu}, {os.cpu_count()} cores, torch {torch.__version__}, gloo over loopback.\n\n{text}\n"
    )
    print(f"wrote {results}", file=sys.stderr)


if __name__ == "__main__":
    main()
