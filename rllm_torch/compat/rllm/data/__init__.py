"""``rllm.data``: rLLM's ``Dataset`` and ``DatasetRegistry`` (files in rLLM's layout under
``$RLLM_HOME/datasets``, ``~/.rllm/datasets`` or ``DatasetRegistry.set_dataset_dir(path)``).
Re-exported from the one implementation (:mod:`rllm_torch.rollouts.rllm_data`).

rLLM's other names here (its data loader and dataset enums) are not mirrored: importing one
raises an ``ImportError`` that says what to use here."""

from rllm_torch.rollouts.rllm_data import Dataset, DatasetRegistry

__all__ = ["Dataset", "DatasetRegistry"]

#: rLLM's names here that are not mirrored, and what to use instead.
NOT_MIRRORED = {
    "StatefulTaskDataLoader": "the trainer batches the rows itself (data.train_batch_size, data.seed)",
    "DatasetEnum": "register rows with DatasetRegistry.register_dataset and load them by name",
    "TrainDataset": "register rows with DatasetRegistry.register_dataset and load them by name",
    "TestDataset": "register rows with DatasetRegistry.register_dataset and load them by name",
    "DatasetConfig": "the run config's data.* keys",
    "DatasetMetadata": "DatasetRegistry.get_dataset_info(name)",
    "Problem": "rows are dicts in rLLM's format (question, ground_truth, data_source, ...)",
}


def __getattr__(name: str) -> object:
    """Raises ``ImportError`` for rLLM's names that are not mirrored, saying what to use here."""
    if name in NOT_MIRRORED:
        raise ImportError(f"rLLM's rllm.data.{name} is not mirrored in rllm_torch: {NOT_MIRRORED[name]}.")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
