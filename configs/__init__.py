"""Hydra configs of ``rllm-torch-train`` (shipped in the wheel): ``train.yaml`` and the
``model``, ``task`` and ``backend`` groups."""

__all__: list[str] = []
