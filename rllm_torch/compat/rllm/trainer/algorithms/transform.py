"""``rllm.trainer.algorithms.transform``: episodes to trajectory groups. Re-exported from the one implementation (:mod:`rllm_torch.compat.rllm`)."""

from rllm_torch.trainer.pipeline.transform import (
    TransformConfig,
    default_traj_grouping_hook,
    transform_episodes_to_trajectory_groups,
)

_default_traj_grouping_hook = default_traj_grouping_hook  # rLLM's private name, which its trainer imports

__all__ = ["TransformConfig", "default_traj_grouping_hook", "transform_episodes_to_trajectory_groups"]
