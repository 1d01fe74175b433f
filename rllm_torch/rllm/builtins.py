"""The built-in estimators, registered under their :class:`~rllm_torch.rllm.config.rLLMAdvantageEstimator`
names: the core's tensor functions (:mod:`rllm_torch.core.estimators`), with rLLM's per-group list
functions (:mod:`~rllm_torch.rllm.arrays`) for the five rLLM has. Imported once by
:mod:`rllm_torch.rllm`, so every import of the package has them."""

from rllm_torch.core.estimators import (
    gae,
    gdpo,
    gpg,
    grpo,
    grpo_passk,
    maxrl,
    opo,
    optimal_token_baseline,
    pass_at_k,
    prpo,
    reinforce,
    reinforce_plus_plus,
    reinforce_plus_plus_baseline,
    remax,
    rloo,
)
from rllm_torch.rllm.arrays import (
    calculate_grpo_advantages,
    calculate_prpo_advantages,
    calculate_reinforce_advantages,
    calculate_reinforce_plus_plus_baseline_advantages,
    calculate_rloo_advantages,
)
from rllm_torch.rllm.config import rLLMAdvantageEstimator
from rllm_torch.rllm.registry import register_builtin

__all__: list[str] = []

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
register_builtin(rLLMAdvantageEstimator.MAXRL, None, maxrl)
register_builtin("max_rl", None, maxrl)
register_builtin(rLLMAdvantageEstimator.REMAX, None, remax)  # prime-rl's spelling of SkyRL's maxrl
register_builtin(rLLMAdvantageEstimator.OPTIMAL_TOKEN_BASELINE, None, optimal_token_baseline, form="tokens")
