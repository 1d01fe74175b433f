"""``rllm.experimental`` (rLLM before 2026-06). Re-exported from the one implementation (:mod:`rllm_torch.compat.rllm`)."""

__all__ = []
