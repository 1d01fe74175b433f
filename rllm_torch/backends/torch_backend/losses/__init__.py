"""Policy losses (``policy``) and their aggregation modes (``aggregation``): pure tensor math."""

from rllm_torch.backends.torch_backend.losses.aggregation import AGG_MODES, aggregate_loss, loss_normaliser, token_mean
from rllm_torch.backends.torch_backend.losses.policy import (
    LOSS_FNS,
    cispo_loss,
    cross_entropy_loss,
    dro_loss,
    importance_sampling_loss,
    policy_loss,
    ppo_clip_loss,
)

__all__ = [
    "LOSS_FNS",
    "AGG_MODES",
    "aggregate_loss",
    "loss_normaliser",
    "token_mean",
    "ppo_clip_loss",
    "importance_sampling_loss",
    "cispo_loss",
    "dro_loss",
    "cross_entropy_loss",
    "policy_loss",
]
