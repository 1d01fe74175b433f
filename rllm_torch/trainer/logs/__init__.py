"""Where metrics go: :class:`~rllm_torch.trainer.logs.tracking.Tracking` and its sinks (the
console's progress bar and tables, ``metrics.jsonl``, TensorBoard, wandb), and the start-up
summary a run prints (:mod:`~rllm_torch.trainer.logs.summary`)."""

__all__: list[str] = []
