"""``rllm.experimental.common.loss`` (rLLM before 2026-06): the names of its path of today, :mod:`rllm_torch.compat.rllm.trainer.algorithms.loss`."""

from rllm_torch.compat.rllm.trainer.algorithms.loss import *  # noqa: F403
from rllm_torch.compat.rllm.trainer.algorithms.loss import __all__  # noqa: F401
