"""``rllm.agents``. Re-exported from the one implementation (:mod:`rllm_torch.compat.rllm`)."""

from rllm_torch.compat.rllm.agents.agent import Action, BaseAgent, Episode, Step, Trajectory

__all__ = ["Action", "BaseAgent", "Episode", "Step", "Trajectory"]
