"""What a run needs beyond one step: a SIGTERM honoured at a step boundary
(:mod:`~rllm_torch.trainer.runtime.stop`), checkpoints written atomically (:mod:`~rllm_torch.trainer.runtime.checkpoint`), the
run's save and resume (:mod:`~rllm_torch.trainer.runtime.run_checkpoint`) and what a resume may
change (:mod:`~rllm_torch.trainer.runtime.fingerprint`)."""

__all__: list[str] = []
