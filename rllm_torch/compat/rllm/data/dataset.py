"""``rllm.data.dataset``: rLLM's ``Dataset`` and ``DatasetRegistry``, stored in rLLM's layout.
Re-exported from the one implementation (:mod:`rllm_torch.rollouts.rllm_data`)."""

from rllm_torch.rollouts.rllm_data import Dataset, DatasetRegistry

__all__ = ["Dataset", "DatasetRegistry"]
