"""``rllm.agents.agent``: the data types and ``BaseAgent``. Re-exported from the one implementation (:mod:`rllm_torch.compat.rllm`)."""

from rllm_torch.rllm.types import Action, Episode, Step, Trajectory, TrajectoryGroup
from rllm_torch.trainer.workflow import BaseAgent

__all__ = ["Action", "BaseAgent", "Episode", "Step", "Trajectory", "TrajectoryGroup"]
