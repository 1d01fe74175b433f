"""``rllm.trainer.algorithms.loss``: users' policy losses (rLLM's ``terminal-rl`` branch). Re-exported from the one implementation (:mod:`rllm_torch.compat.rllm`)."""

from rllm_torch.core.losses import LOSS_INPUTS, LossContext, register_loss

__all__ = ["LOSS_INPUTS", "LossContext", "register_loss"]
