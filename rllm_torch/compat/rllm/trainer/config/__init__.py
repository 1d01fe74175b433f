"""``pkg://rllm.trainer.config``: rLLM's Hydra configs used by its examples, ``unified`` and
``agent_ppo_trainer``, each here rllm_torch's run config, whose schema accepts rLLM's common keys
(:mod:`rllm_torch.trainer.rllm_settings`)."""

__all__: list[str] = []
