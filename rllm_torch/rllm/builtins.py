"""The built-in estimators, registered under their :class:`~rllm_torch.rllm.config.rLLMAdvantageEstimator`
names: the core's tensor functions (:mod:`rllm_torch.core.estimators`), with rLLM's per-group list
functions (:mod:`~rllm_torch.rllm.arrays`) for the five rLLM has, and what each declares: what it
needs from the batch (the trainer asks the backend for it), whether a turn mode can run it and
whether its baseline is a group statistic. Imported once by :mod:`rllm_torch.rllm`, so every
import of the package has them."""

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
    calculate_echo_advantages,
    calculate_grpo_advantages,
    calculate_prpo_advantages,
    calculate_reinforce_advantages,
    calculate_reinforce_plus_plus_baseline_advantages,
    calculate_rloo_advantages,
)
from rllm_torch.rllm.config import rLLMAdvantageEstimator
from rllm_torch.rllm.registry import register_builtin

__all__: list[str] = []

#: Why a turn mode cannot run these (a turn mode runs the estimator on each turn's return, among
#: the members of the group still running at that turn).
_K_TURNS = "its k must not exceed the members still running at a turn, often fewer than rllm.rollout.n"

register_builtin(rLLMAdvantageEstimator.GRPO, calculate_grpo_advantages, grpo, group_baseline=True)
# ECHO's advantages are GRPO's (rLLM terminal-rl's calculate_echo_advantages); its run's loss defaults to `echo`
register_builtin(rLLMAdvantageEstimator.ECHO, calculate_echo_advantages, grpo, group_baseline=True)
register_builtin(rLLMAdvantageEstimator.RLOO, calculate_rloo_advantages, rloo, group_baseline=True)
register_builtin(rLLMAdvantageEstimator.REINFORCE, calculate_reinforce_advantages, reinforce)
register_builtin(
    rLLMAdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE,
    calculate_reinforce_plus_plus_baseline_advantages,
    reinforce_plus_plus_baseline,
    group_baseline=True,
)
register_builtin(rLLMAdvantageEstimator.PRPO, calculate_prpo_advantages, prpo)
register_builtin(rLLMAdvantageEstimator.OPO, None, opo, group_baseline=True)
register_builtin(rLLMAdvantageEstimator.PASS_AT_K, None, pass_at_k, per_turn=_K_TURNS, group_baseline=True)
register_builtin(rLLMAdvantageEstimator.GRPO_PASSK, None, grpo_passk, per_turn=_K_TURNS)
register_builtin(rLLMAdvantageEstimator.GPG, None, gpg)
register_builtin(
    rLLMAdvantageEstimator.GDPO,
    None,
    gdpo,
    needs=("reward_components",),
    per_turn="its reward components are per trajectory",
)
register_builtin(rLLMAdvantageEstimator.REINFORCE_PLUS_PLUS, None, reinforce_plus_plus, form="tokens")
register_builtin(rLLMAdvantageEstimator.GAE, None, gae, form="tokens", needs=("values",))
register_builtin(rLLMAdvantageEstimator.MAXRL, None, maxrl)
register_builtin("max_rl", None, maxrl)  # prime-rl's spelling of SkyRL's maxrl
register_builtin(
    rLLMAdvantageEstimator.REMAX,
    None,
    remax,
    needs=("baselines",),
    per_turn="its baseline is one greedy episode's reward per prompt, not per turn",
)
register_builtin(
    rLLMAdvantageEstimator.OPTIMAL_TOKEN_BASELINE,
    None,
    optimal_token_baseline,
    form="tokens",
    needs=("old_log_probs", "sum_pi_squared"),
)
