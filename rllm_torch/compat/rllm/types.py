"""``rllm.types``: the trajectory data model. Re-exported from the one implementation (:mod:`rllm_torch.compat.rllm`)."""

from rllm_torch.rllm.types import Action, Episode, Step, Trajectory, TrajectoryGroup

__all__ = ["Action", "Episode", "Step", "Trajectory", "TrajectoryGroup"]
