"""Tensor-native advantage estimators, their registry, and rLLM's list-of-arrays functions.

The built-ins are registered under ``rLLMAdvantageEstimator`` values. Outcome (group)
estimators, on a :class:`~rllm_torch.GroupedRewards`: ``grpo``, ``rloo``, ``reinforce``,
``reinforce_plus_plus_baseline`` and ``prpo`` (each with rLLM's per-group function too),
``opo``, ``pass_at_k``, ``grpo_passk``, ``gpg`` and ``gdpo`` (several rewards per trajectory). Token-level estimators, on a :class:`TokenRewards`:
``reinforce_plus_plus`` and ``gae``.
"""

from rllm_torch.config import rLLMAdvantageEstimator
from rllm_torch.core.estimators import (
    gae,
    gdpo,
    gpg,
    grpo,
    grpo_passk,
    opo,
    pass_at_k,
    pass_at_k_rewards,
    prpo,
    reinforce,
    reinforce_plus_plus,
    reinforce_plus_plus_baseline,
    rloo,
)
from rllm_torch.core.tokens import TokenRewards, broadcast_to_tokens, discounted_returns, masked_whiten, sequence_scores
from rllm_torch.estimators.arrays import (
    calculate_grpo_advantages,
    calculate_grpo_advantages_per_group,
    calculate_prpo_advantages,
    calculate_reinforce_advantages,
    calculate_reinforce_plus_plus_baseline_advantages,
    calculate_rloo_advantages,
    calculate_rloo_advantages_per_group,
)
from rllm_torch.estimators.registry import (
    compute_advantages,
    estimator_options,
    get_rllm_adv_estimator,
    get_tensor_adv_estimator,
    is_token_level,
    register_builtin,
    register_rllm_adv_estimator,
    registered_estimator_names,
)

__all__ = [
    "grpo",
    "rloo",
    "reinforce",
    "reinforce_plus_plus_baseline",
    "prpo",
    "opo",
    "pass_at_k",
    "pass_at_k_rewards",
    "grpo_passk",
    "gpg",
    "gdpo",
    "reinforce_plus_plus",
    "gae",
    "compute_advantages",
    "TokenRewards",
    "sequence_scores",
    "broadcast_to_tokens",
    "discounted_returns",
    "masked_whiten",
    "is_token_level",
    "estimator_options",
    "get_rllm_adv_estimator",
    "get_tensor_adv_estimator",
    "register_rllm_adv_estimator",
    "registered_estimator_names",
    "calculate_grpo_advantages",
    "calculate_reinforce_advantages",
    "calculate_reinforce_plus_plus_baseline_advantages",
    "calculate_rloo_advantages",
    "calculate_prpo_advantages",
    "calculate_grpo_advantages_per_group",
    "calculate_rloo_advantages_per_group",
]

register_builtin(rLLMAdvantageEstimator.GRPO, calculate_grpo_advantages, grpo)
register_builtin(rLLMAdvantageEstimator.RLOO, calculate_rloo_advantages, rloo)
register_builtin(rLLMAdvantageEstimator.REINFORCE, calculate_reinforce_advantages, reinforce)
register_builtin(
    rLLMAdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE,
    calculate_reinforce_plus_plus_baseline_advantages,
    reinforce_plus_plus_baseline,
)
register_builtin(rLLMAdvantageEstimator.PRPO, calculate_prpo_advantages, prpo)
register_builtin(rLLMAdvantageEstimator.OPO, None, opo)
register_builtin(rLLMAdvantageEstimator.PASS_AT_K, None, pass_at_k)
register_builtin(rLLMAdvantageEstimator.GRPO_PASSK, None, grpo_passk)
register_builtin(rLLMAdvantageEstimator.GPG, None, gpg)
register_builtin(rLLMAdvantageEstimator.GDPO, None, gdpo)
register_builtin(rLLMAdvantageEstimator.REINFORCE_PLUS_PLUS, None, reinforce_plus_plus, form="tokens")
register_builtin(rLLMAdvantageEstimator.GAE, None, gae, form="tokens")
