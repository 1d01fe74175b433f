"""The embedded pure-PyTorch backend: a ``transformers`` causal LM, batched sampling, and the policy losses
(PPO, importance sampling, CISPO, DRO, cross-entropy) on packed token tensors."""

from rllm_torch.backends.torch_backend.backend import TorchBackend
from rllm_torch.backends.torch_backend.losses import (
    AGG_MODES,
    LOSS_FNS,
    aggregate_loss,
    cispo_loss,
    cross_entropy_loss,
    dro_loss,
    importance_sampling_loss,
    policy_loss,
    ppo_clip_loss,
    token_mean,
)
from rllm_torch.backends.torch_backend.rollout import SamplingParams, TorchRolloutEngine
from rllm_torch.backends.torch_backend.sampling import sample_completions, token_log_probs
from rllm_torch.backends.torch_backend.tokenizer import build_char_tokenizer

__all__ = [
    "TorchBackend",
    "TorchRolloutEngine",
    "SamplingParams",
    "sample_completions",
    "token_log_probs",
    "ppo_clip_loss",
    "importance_sampling_loss",
    "cispo_loss",
    "dro_loss",
    "cross_entropy_loss",
    "policy_loss",
    "aggregate_loss",
    "token_mean",
    "LOSS_FNS",
    "AGG_MODES",
    "build_char_tokenizer",
]
