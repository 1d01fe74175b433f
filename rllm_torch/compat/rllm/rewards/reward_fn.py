"""``rllm.rewards.reward_fn``: rLLM's ``RewardFunction`` protocol, ``zero_reward`` and
``f1_reward_fn``, with rLLM's results. Re-exported from the one implementation
(:mod:`rllm_torch.rollouts.rllm_rewards`).

rLLM's ``math_reward_fn``, ``code_reward_fn`` and ``search_reward_fn`` (and their classes) need
rLLM's math grader, code sandboxes and search tools: importing one raises an ``ImportError`` that
says what to use here."""

from rllm_torch.rollouts.rllm_rewards import RewardConfig, RewardFunction, RewardInput, f1_reward_fn, zero_reward
from rllm_torch.trainer.workflow import RewardOutput

__all__ = ["RewardFunction", "zero_reward", "f1_reward_fn", "RewardOutput", "RewardConfig", "RewardInput"]

#: rLLM's names here that are not mirrored, and the rLLM module each comes from.
NOT_MIRRORED = {
    "math_reward_fn": "rllm.rewards.math_reward",
    "RewardMathFn": "rllm.rewards.math_reward",
    "code_reward_fn": "rllm.rewards.code_reward",
    "RewardCodeFn": "rllm.rewards.code_reward",
    "search_reward_fn": "rllm.rewards.search_reward",
    "RewardSearchFn": "rllm.rewards.search_reward",
}


def __getattr__(name: str) -> object:
    if name in NOT_MIRRORED:
        raise ImportError(
            f"rLLM's {name} ({NOT_MIRRORED[name]}) is not mirrored in rllm_torch: it needs rLLM's graders, "
            "sandboxes or tools. Pass your own reward_function(task_info, action) returning a RewardOutput, a "
            "float or a bool (with rLLM installed, a wrapper returning rLLM's result's .reward works)."
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
