"""``rllm.experimental.common.rejection_sampling`` (rLLM before 2026-06): the names of its path of today, :mod:`rllm_torch.compat.rllm.trainer.algorithms.rejection_sampling`."""

from rllm_torch.compat.rllm.trainer.algorithms.rejection_sampling import *  # noqa: F403
from rllm_torch.compat.rllm.trainer.algorithms.rejection_sampling import __all__  # noqa: F401
