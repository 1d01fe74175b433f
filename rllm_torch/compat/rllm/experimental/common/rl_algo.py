"""``rllm.experimental.common.rl_algo`` (rLLM before 2026-06): the names of its path of today, :mod:`rllm_torch.compat.rllm.trainer.algorithms.rl_algo`."""

from rllm_torch.compat.rllm.trainer.algorithms.rl_algo import *  # noqa: F403
from rllm_torch.compat.rllm.trainer.algorithms.rl_algo import __all__  # noqa: F401
