"""The programs: ``rllm-torch-train`` (:mod:`~rllm_torch.cli.train`, with its Hydra schema
:mod:`~rllm_torch.cli.run_config` and start-up checks :mod:`~rllm_torch.cli.config_checks`),
``rllm-torch-plot`` (:mod:`~rllm_torch.cli.plot`) and ``rllm-torch-demo``
(:mod:`~rllm_torch.cli.demo`). The library (tensor core, rLLM's surface, the trainer) does not
import them."""

__all__: list[str] = []
