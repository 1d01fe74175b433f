"""``rllm.trainer.unified_trainer``: ``UnifiedTrainer``, ``TrainerState``, ``AgentTrainer``. Re-exported from the one implementation (:mod:`rllm_torch.compat.rllm`)."""

from rllm_torch.cli.agent_trainer import AgentTrainer
from rllm_torch.trainer.state import TrainerState
from rllm_torch.trainer.unified_trainer import UnifiedTrainer

__all__ = ["AgentTrainer", "TrainerState", "UnifiedTrainer"]
