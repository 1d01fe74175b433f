"""``rllm.engine.rollout.rollout_engine``. Re-exported from the one implementation (:mod:`rllm_torch.compat.rllm`)."""

from rllm_torch.trainer.workflow import ModelOutput, RolloutEngine

__all__ = ["ModelOutput", "RolloutEngine"]
