"""``rllm.experimental.common.config`` (rLLM before 2026-06): the names of its path of today, :mod:`rllm_torch.compat.rllm.trainer.algorithms.config`."""

from rllm_torch.compat.rllm.trainer.algorithms.config import *  # noqa: F403
from rllm_torch.compat.rllm.trainer.algorithms.config import __all__  # noqa: F401
