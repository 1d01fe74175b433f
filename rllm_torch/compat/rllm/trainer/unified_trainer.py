"""``rllm.trainer.unified_trainer``: ``UnifiedTrainer``, ``TrainerState``, ``AgentTrainer``. Re-exported from the one implementation (:mod:`rllm_torch.compat.rllm`).

rLLM's private helpers of this module that its tests import are not mirrored: importing one raises
an ``ImportError`` that says what differs here."""

from rllm_torch.cli.agent_trainer import AgentTrainer
from rllm_torch.trainer.state import TrainerState
from rllm_torch.trainer.unified_trainer import UnifiedTrainer

__all__ = ["AgentTrainer", "TrainerState", "UnifiedTrainer"]

#: rLLM's private names here that its tests import, and why they are not mirrored.
NOT_MIRRORED = {
    "_enforce_async_train_batch_size": "in async mode rLLM sets data.train_batch_size to 1 (its steps take "
    "rllm.async_training.mini_batch_size task groups); here an async step takes rllm.async_training.mini_batch_size "
    "prompts (null: data.train_batch_size) and data.train_batch_size is left as given",
    "_detached_warm_queue": "it belongs to rLLM's sandbox warm queue (rllm.workflow.warm_queue_size) of its agent "
    "flows and sandbox hooks, which are not here: write the agent as a Workflow",
}


def __getattr__(name: str) -> object:
    """Raises ``ImportError`` for rLLM's private names that are not mirrored, saying what differs here."""
    if name in NOT_MIRRORED:
        raise ImportError(
            f"rLLM's rllm.trainer.unified_trainer.{name} is not mirrored in rllm_torch: {NOT_MIRRORED[name]}."
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
