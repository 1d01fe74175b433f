"""``rllm.experimental.common`` (rLLM before 2026-06): the names of its path of today, :mod:`rllm_torch.compat.rllm.trainer.algorithms`."""

from rllm_torch.compat.rllm.trainer.algorithms import *  # noqa: F403
from rllm_torch.compat.rllm.trainer.algorithms import __all__  # noqa: F401
