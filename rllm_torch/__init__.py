"""rllm_torch: PyTorch-native, tensorized advantage estimation with rLLM's API.

Shape letters, used in docstrings and as suffixes of tensor names inside function bodies:

* ``N`` trajectories (flat order), ``G`` groups, ``K`` slots of the padded ``[G, K]`` layout
  (the largest group size), ``T`` tokens.

So ``rewards_GK`` is a padded ``[G, K]`` tensor, ``mean_G`` holds one value per group and
``adv_N`` one value per trajectory.

Quick start::

    import torch
    from rllm_torch import GroupedRewards, grpo

    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0]])  # 2 prompts x 4 rollouts
    advantages, returns = grpo(GroupedRewards.from_padded(rewards))       # [8], flat order
"""

from rllm_torch.advantage import collect_reward_and_advantage_from_trajectory_groups
from rllm_torch.config import AlgorithmConfig, rLLMAdvantageEstimator
from rllm_torch.core.distributed import ONE_PROCESS
from rllm_torch.core.errors import *  # noqa: F403 - re-exported public surface
from rllm_torch.core.errors import __all__ as _errors_all
from rllm_torch.core.labels import factorize_group_labels
from rllm_torch.core.packing import GroupedRewards
from rllm_torch.core.segment import segment_count, segment_mean, segment_sum, segment_var_mean
from rllm_torch.estimators import *  # noqa: F403 - re-exported public surface
from rllm_torch.estimators import __all__ as _estimators_all
from rllm_torch.trainer import *  # noqa: F403 - re-exported public surface
from rllm_torch.trainer import __all__ as _trainer_all
from rllm_torch.types import Episode, Step, TerminationReason, Trajectory, TrajectoryGroup
from rllm_torch.workflows import *  # noqa: F403 - re-exported public surface
from rllm_torch.workflows import __all__ as _workflows_all

__all__ = [
    "AlgorithmConfig",
    "rLLMAdvantageEstimator",
    "GroupedRewards",
    "ONE_PROCESS",
    "factorize_group_labels",
    "segment_count",
    "segment_sum",
    "segment_mean",
    "segment_var_mean",
    *_errors_all,
    *_estimators_all,
    "Step",
    "Trajectory",
    "TrajectoryGroup",
    "Episode",
    "TerminationReason",
    "collect_reward_and_advantage_from_trajectory_groups",
    *_trainer_all,
    *_workflows_all,
]

__version__ = "0.1.0"
