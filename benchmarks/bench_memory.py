"""Peak memory and seconds per step of one training step on real model shapes: our trainer and
TRL's ``GRPOTrainer`` side by side, on the same model, prompts, batch and settings.

    python3 -m venv .venv-trl && .venv-trl/bin/pip install torch==2.13.0   # the CPU build first
    .venv-trl/bin/pip install -e '.[bench-trl]'      # trl 1.16.0 (its own venv: see pyproject.toml)
    .venv-trl/bin/python benchmarks/bench_memory.py --write-results     # benchmarks/RESULTS_memory.md
    .venv-trl/bin/python benchmarks/bench_memory.py --cases small-32 --sides ours   # a quick look

Models (``benchmarks/real_models.py``, random weights, ``save_pretrained`` to a temporary directory
that both sides load): ``small``, Qwen2-shaped with Qwen2.5's vocabulary of 151,936 tokens, hidden
size 64, 2 layers (9.8M parameters); ``qwen2.5-0.5b``, Qwen2.5-0.5B's published shape (494M).
The task is the default arithmetic one (4-token prompts); a random model almost never samples the
end token, so every response runs to ``max_new_tokens``.

Cases: ``small-32`` and ``small-128`` the default batch (64 prompts x 8 rollouts) at 32 and 128
new tokens; ``small-32-x2`` the batch doubled (128 x 8, ours only: our memory should stay flat at
a fixed micro-batch budget); ``0.5b-64`` the 0.5B shape at 16 x 4 rollouts, 64 new tokens.

Settings, the same work on both sides (one sampling pass, GRPO advantages, one AdamW step over every
completion, token-mean PPO loss, no KL, no validation):

* ``float32``: float32, no activation checkpointing. Ours with its defaults (micro-batches of
  16,384 tokens, chunked log-probs); TRL with one micro-batch of every completion
  (``per_device_train_batch_size`` = completions, ``gradient_accumulation_steps=1``), as
  ``bench_trainer_vs_trl.py`` runs it.
* ``memory``: bfloat16 compute and activation checkpointing on both sides, and micro-batches of
  ``R`` rows (64 for the small model, 16 for 0.5B): TRL ``per_device_train_batch_size=R`` with
  ``gradient_accumulation_steps`` = completions / R (so one optimizer step per generation batch);
  ours ``backend.micro_batch_tokens`` = R x (prompt + max_new_tokens), the padded tokens of R rows.

Each (case, setting, side) is one subprocess, one at a time, with all of the machine's cores
(``torch`` threads = cores); its peak resident memory is the kernel's ``ru_maxrss`` of that process
(``os.wait4``: the whole process, model loading and the final checkpoint included), under an
address-space cap (``--cap-gb``) so a run that would exhaust the machine fails alone and is recorded
as out of memory. Seconds per step: ours ``time/step`` of ``metrics.jsonl`` (sampling, scoring, the
log-prob passes, advantages, the update), TRL from ``on_step_begin`` to ``on_step_end`` (the same
stages).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from bench_trainer_vs_trl import REPO, shared_overrides
from machine import cpu_name
from real_models import save_real_model
from results import add_write_results, results_path

PROMPT_TOKENS = 4  # "a+b=" with the real models' character-level tokenizer


@dataclass(frozen=True)
class Case:
    shape: str
    prompts: int
    rollouts: int
    new_tokens: int
    micro_rows: int  # rows per micro-batch of the memory setting
    peers: bool = True  # TRL runs it too (the doubled batch checks our own flatness only)

    @property
    def completions(self) -> int:
        return self.prompts * self.rollouts


CASES = {
    "small-32": Case("small", 64, 8, 32, 64),
    "small-128": Case("small", 64, 8, 128, 64),
    "small-32-x2": Case("small", 128, 8, 32, 64, peers=False),
    "0.5b-64": Case("qwen2.5-0.5b", 16, 4, 64, 16),
}
SETTINGS = ("float32", "memory")
SIDES = {"ours": "rllm_torch", "trl": "TRL GRPOTrainer"}


def ours_overrides(case: Case, setting: str, threads: int) -> list[str]:
    shared = [o for o in shared_overrides("arithmetic", 1) if not o.startswith("backend.num_threads=")]
    overrides = shared + [
        f"task.train_size={case.prompts}",
        f"data.train_batch_size={case.prompts}",
        f"rllm.rollout.n={case.rollouts}",
        f"rllm.rollout.max_new_tokens={case.new_tokens}",
        f"backend.num_threads={threads}",
        "rllm.trainer.logger=[jsonl]",
    ]
    if setting == "memory":
        overrides += [
            "backend.dtype=bfloat16",
            "backend.gradient_checkpointing=true",
            f"backend.micro_batch_tokens={case.micro_rows * (PROMPT_TOKENS + case.new_tokens)}",
        ]
    return overrides


def trl_args(case: Case, setting: str) -> dict:
    if setting == "float32":
        return {"per_device_train_batch_size": case.completions, "gradient_accumulation_steps": 1}
    return {
        "per_device_train_batch_size": case.micro_rows,
        "gradient_accumulation_steps": case.completions // case.micro_rows,
        "bf16": True,
        "gradient_checkpointing": True,
    }


def measure(command: list[str], log: Path, threads: int, cap_gb: float) -> dict:
    """Run ``command`` to its end; its wall time, exit status and peak RSS (GiB)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    cap = int(cap_gb * 2**30)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    start = time.perf_counter()
    with log.open("w") as sink:
        proc = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT, preexec_fn=limit)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"rc": proc.returncode, "wall_s": time.perf_counter() - start, "peak_gb": usage.ru_maxrss / 2**20}


def step_seconds(metrics: Path) -> float | None:
    rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    times = [r["time/step"] for r in rows if "time/step" in r]
    return times[0] if times else None


def failure(log: Path) -> str:
    text = log.read_text()
    if any(s in text for s in ("can't allocate memory", "out of memory", "OutOfMemoryError", "MemoryError")):
        return "out of memory"
    return "failed: " + (text.strip().splitlines() or ["?"])[-1][:160]


def run_one(name: str, case: Case, setting: str, side: str, model_dir: Path, out: Path, args) -> dict:
    run_dir = out / f"{name}-{setting}-{side}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    overrides = ours_overrides(case, setting, args.threads)
    if side == "ours":
        command = [sys.executable, "-m", "rllm_torch.train", *overrides]
        command += [f"model.path={model_dir}", f"hydra.run.dir={run_dir}"]
        metrics = run_dir / "metrics.jsonl"
    else:
        spec = {
            "task": "arithmetic",
            "overrides": overrides,
            "model_dir": str(model_dir),
            "out": str(run_dir),
            "steps": 1,
            "threads": args.threads,
            "trl_args": trl_args(case, setting),
        }
        (run_dir / "trl_spec.json").write_text(json.dumps(spec, indent=1) + "\n")
        command = [sys.executable, str(REPO / "benchmarks" / "bench_trainer_vs_trl.py"), "--trl-worker"]
        command.append(str(run_dir / "trl_spec.json"))
        metrics = run_dir / "trl" / "metrics.jsonl"
    print(f"{name} {setting} {SIDES[side]} ...", flush=True)
    result = measure(command, run_dir / "run.log", args.threads, args.cap_gb)
    result["step_s"] = step_seconds(metrics)
    result["error"] = failure(run_dir / "run.log") if result["rc"] or result["step_s"] is None else None
    print(
        f"  peak {result['peak_gb']:.2f} GiB, step {result['step_s'] or float('nan'):.1f} s, "
        f"wall {result['wall_s']:.0f} s{'; ' + result['error'] if result['error'] else ''}",
        flush=True,
    )
    for heavy in run_dir.rglob("checkpoints"):  # the 0.5B model's checkpoints are gigabytes
        shutil.rmtree(heavy, ignore_errors=True)
    return result


def cell(result: dict | None, key: str, fmt: str) -> str:
    if result is None:
        return "-"
    if result["error"]:
        return f"{result['error'].split(':')[0]} (at {result['peak_gb']:.1f} GiB)" if key == "peak_gb" else "-"
    return fmt.format(result[key])


def ratio(results: dict, key: str) -> str:
    ours, trl = results.get("ours"), results.get("trl")
    if not ours or not trl or ours["error"] or trl["error"]:
        return "-"
    return f"{trl[key] / ours[key]:.2f}x"


def report(table: dict, args) -> str:
    try:  # --sides ours runs without TRL installed
        trl_version = importlib.metadata.version("trl")
    except importlib.metadata.PackageNotFoundError:
        trl_version = "not installed"
    lines = [
        "# Memory and time of one training step on real model shapes, against TRL",
        "",
        f"Run {datetime.datetime.now():%Y-%m-%d %H:%M} with `python benchmarks/bench_memory.py {' '.join(sys.argv[1:])}`"
        + (" (the other rows: the earlier run it updates)" if args.update else "")
        + f" on {cpu_name()}, {os.cpu_count()} cores, "
        f"{args.threads} torch thread(s) per run, one run at a time, address space capped at {args.cap_gb:g} GiB; "
        f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl_version}.",
        "",
        "Peak resident memory of the whole process (GiB) and seconds of the training step; TRL / ours above 1: "
        "TRL needs more. See the script's docstring for every setting.",
        "",
        "| case | setting | ours peak GiB | TRL peak GiB | TRL / ours | ours s / step | TRL s / step | TRL / ours |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, settings in sorted(table.items(), key=lambda item: list(CASES).index(item[0])):
        case = CASES[name]
        label = f"`{name}`: {case.shape}, {case.prompts} x {case.rollouts}, {case.new_tokens} new tokens"
        for setting, results in settings.items():
            ours, trl_ = results.get("ours"), results.get("trl")
            lines.append(
                f"| {label} | {setting} | {cell(ours, 'peak_gb', '{:.2f}')} | {cell(trl_, 'peak_gb', '{:.2f}')} | "
                f"{ratio(results, 'peak_gb')} | {cell(ours, 'step_s', '{:.1f}')} | {cell(trl_, 'step_s', '{:.1f}')} | "
                f"{ratio(results, 'step_s')} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=SETTINGS)
    parser.add_argument("--sides", nargs="+", default=list(SIDES), choices=list(SIDES))
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count(), help="torch threads per run (default: all cores)"
    )
    parser.add_argument("--cap-gb", type=float, default=18.0, help="address-space cap of each run in GiB (default 18)")
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "bench_memory")
    parser.add_argument(
        "--update", action="store_true", help="rerun only the selected runs, keep the others of <out>/results.json"
    )
    add_write_results(parser)
    args = parser.parse_args(argv)
    if "trl" in args.sides:
        import trl  # noqa: F401 - fail before our side runs for minutes
    args.out.mkdir(parents=True, exist_ok=True)
    saved = args.out / "results.json"
    table: dict = json.loads(saved.read_text()) if args.update and saved.is_file() else {}
    with tempfile.TemporaryDirectory(prefix="bench_memory_models_") as models:
        for name in args.cases:
            case = CASES[name]
            model_dir = Path(models) / case.shape
            if not model_dir.is_dir():
                save_real_model(model_dir, case.shape)
            for setting in args.settings:
                sides = [side for side in args.sides if side == "ours" or case.peers]
                runs = table.setdefault(name, {}).setdefault(setting, {})
                runs |= {side: run_one(name, case, setting, side, model_dir, args.out, args) for side in sides}
                (args.out / "results.json").write_text(json.dumps(table, indent=1) + "\n")
    text = report(table, args)
    target = results_path("RESULTS_memory.md", args.write_results)
    target.write_text(text)
    print(text)
    print(f"wrote {target}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
