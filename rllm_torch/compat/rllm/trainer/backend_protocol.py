"""``rllm.trainer.backend_protocol``. Re-exported from the one implementation (:mod:`rllm_torch.compat.rllm`)."""

from rllm_torch.trainer.protocol import BackendProtocol

__all__ = ["BackendProtocol"]
