"""The shared half of the TRL side-by-side benchmarks (``bench_trainer_vs_trl.py``,
``bench_memory.py``): our config for a task as ``rllm-torch-train`` composes it, the settings both
trainers share, and TRL's ``GRPOTrainer`` run in a subprocess of its own (``--trl-worker``), which
records each step and the ``GRPOConfig`` it trained with."""

from __future__ import annotations

import importlib.resources
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from rllm_torch.backends.torch_backend.model import build_policy
from rllm_torch.backends.torch_backend.tokenizer import load_tokenizer
from rllm_torch.rollouts.catalog import build_task
from rllm_torch.rollouts.task import Task
from rllm_torch.trainer.model_defaults import apply_model_defaults

__all__ = [
    "EXPERIMENT",
    "TRL_SETTINGS",
    "config_name",
    "shared_overrides",
    "compose_config",
    "save_initial_model",
    "TaskReward",
    "trl_worker",
]

# the GRPOConfig fields that set TRL's memory and speed, recorded with each run (trl/settings.json)
TRL_SETTINGS = ("bf16", "gradient_checkpointing", "per_device_train_batch_size", "gradient_accumulation_steps")

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
    (run_dir / "settings.json").write_text(json.dumps({k: getattr(args, k) for k in TRL_SETTINGS}) + "\n")
    trainer.train()
    metrics.close()
    trainer.save_model(str(run_dir / "final"))
    tokenizer.save_pretrained(run_dir / "final")
