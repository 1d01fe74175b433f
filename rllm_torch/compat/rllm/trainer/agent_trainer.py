"""``rllm.trainer.agent_trainer``. Re-exported from the one implementation (:mod:`rllm_torch.compat.rllm`)."""

from rllm_torch.cli.agent_trainer import AgentTrainer

__all__ = ["AgentTrainer"]
