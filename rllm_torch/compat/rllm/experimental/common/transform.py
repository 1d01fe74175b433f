"""``rllm.experimental.common.transform`` (rLLM before 2026-06): the names of its path of today, :mod:`rllm_torch.compat.rllm.trainer.algorithms.transform`."""

from rllm_torch.compat.rllm.trainer.algorithms.transform import *  # noqa: F403
from rllm_torch.compat.rllm.trainer.algorithms.transform import (
    __all__,  # noqa: F401
    _default_traj_grouping_hook,  # noqa: F401 - rLLM's private name
)
