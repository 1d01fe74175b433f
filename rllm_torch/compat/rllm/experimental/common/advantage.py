"""``rllm.experimental.common.advantage`` (rLLM before 2026-06): the names of its path of today, :mod:`rllm_torch.compat.rllm.trainer.algorithms.advantage`."""

from rllm_torch.compat.rllm.trainer.algorithms.advantage import *  # noqa: F403
from rllm_torch.compat.rllm.trainer.algorithms.advantage import __all__  # noqa: F401
