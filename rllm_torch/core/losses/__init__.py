"""Policy losses (``policy``; PPO and GSPO in ``ppo``), the importance ratio per token or
sequence, PPO's clipped surrogate, the dual clip and the approximate KL (``ratio``), their
aggregation modes and the one object that holds them (``aggregation``), what a loss is called
with (``context``) and a built-in loss's declaration (``declaration``), the entropy bonus (``entropy``), the KL estimators to a
reference policy (``kl``), the critic's value loss (``value``), the rollout correction's
importance weights (``rollout_correction``), the registry of users' losses (``registry``) and
rLLM's ``echo``, registered there (``echo``): pure tensor math."""

from rllm_torch.core.losses.aggregation import AGG_MODES, Aggregation, aggregate_loss, loss_normaliser, token_mean
from rllm_torch.core.losses.context import LossContext
from rllm_torch.core.losses.declaration import BuiltinLoss
from rllm_torch.core.losses.echo import echo_loss
from rllm_torch.core.losses.entropy import entropy_bonus
from rllm_torch.core.losses.kl import KL_ESTIMATORS, bias_corrected_kl, canonical_kl_name, kl_penalty
from rllm_torch.core.losses.policy import (
    LOSS_FNS,
    PINNED_AGG_MODES,
    POLICY_LOSSES,
    cispo_loss,
    cross_entropy_loss,
    dro_loss,
    importance_sampling_loss,
    loss_options,
    loss_requirement,
    policy_loss,
)
from rllm_torch.core.losses.ppo import gspo_loss, ppo_clip_loss, vanilla_loss
from rllm_torch.core.losses.ratio import IMPORTANCE_SAMPLING_LEVELS, dual_clip, log_importance_ratio
from rllm_torch.core.losses.registry import (
    LOSS_INPUTS,
    RegisteredLoss,
    check_loss_settings,
    check_registered_loss,
    loss_names,
    losses_need,
    register_loss,
    registered_loss,
    resolve_loss,
)
from rllm_torch.core.losses.rollout_correction import (
    TIS_MODES,
    importance_weight_stats,
    rollout_importance_weights,
    summarise_importance_weights,
)
from rllm_torch.core.losses.rollout_rejection import ROLLOUT_RS_OPTIONS, parse_rollout_rs, rollout_rejection_mask
from rllm_torch.core.losses.token_selection import high_entropy_mask, off_policy_sequence_mask
from rllm_torch.core.losses.value import clipped_value_loss

__all__ = [
    "LOSS_FNS",
    "PINNED_AGG_MODES",
    "LossContext",
    "RegisteredLoss",
    "LOSS_INPUTS",
    "register_loss",
    "registered_loss",
    "loss_names",
    "losses_need",
    "check_registered_loss",
    "check_loss_settings",
    "resolve_loss",
    "Aggregation",
    "BuiltinLoss",
    "gspo_loss",
    "vanilla_loss",
    "POLICY_LOSSES",
    "loss_options",
    "loss_requirement",
    "AGG_MODES",
    "KL_ESTIMATORS",
    "kl_penalty",
    "bias_corrected_kl",
    "high_entropy_mask",
    "off_policy_sequence_mask",
    "canonical_kl_name",
    "clipped_value_loss",
    "aggregate_loss",
    "loss_normaliser",
    "token_mean",
    "ppo_clip_loss",
    "echo_loss",
    "importance_sampling_loss",
    "cispo_loss",
    "dro_loss",
    "cross_entropy_loss",
    "policy_loss",
    "IMPORTANCE_SAMPLING_LEVELS",
    "log_importance_ratio",
    "dual_clip",
    "entropy_bonus",
    "TIS_MODES",
    "ROLLOUT_RS_OPTIONS",
    "parse_rollout_rs",
    "rollout_rejection_mask",
    "rollout_importance_weights",
    "importance_weight_stats",
    "summarise_importance_weights",
]
