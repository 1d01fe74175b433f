"""The programs: ``rllm-torch-train`` (:mod:`~rllm_torch.cli.train_command`, its Hydra command line
:mod:`~rllm_torch.cli.command_line` over the trainer's schema :mod:`~rllm_torch.trainer.schema`,
and start-up checks :mod:`~rllm_torch.cli.config_checks`), ``rllm-torch-torchrun``
(:mod:`~rllm_torch.cli.launch`),
``rllm-torch-plot`` (:mod:`~rllm_torch.cli.plot`) and ``rllm-torch-demo``
(:mod:`~rllm_torch.cli.demo`). Nothing else in the package imports them (the top of
the layers: core, rLLM surface, trainer, then backends and rollouts, then the programs)."""

__all__: list[str] = []
