"""``pkg://rllm.trainer.config``: rLLM's Hydra configs, here ``unified`` (rllm_torch's run config,
whose schema accepts rLLM's common keys: :mod:`rllm_torch.trainer.rllm_settings`)."""

__all__: list[str] = []
