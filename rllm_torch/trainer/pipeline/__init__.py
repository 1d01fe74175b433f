"""The trainer's data pipeline, in the order a step runs it: episodes to trajectory groups
(:mod:`~rllm_torch.trainer.pipeline.transform`, with compact filtering), rejection sampling and
DAPO's dynamic sampling, the backend's token batch (:mod:`~rllm_torch.trainer.pipeline.token_batch`)
and its advantages (:mod:`~rllm_torch.trainer.pipeline.token_advantages`); validation's pass@k. Each
stage's config object is built once by :func:`~rllm_torch.trainer.config_checks.check_run_config`."""

__all__: list[str] = []
