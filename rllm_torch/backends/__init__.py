"""Concrete training backends; the embedded default is :mod:`rllm_torch.backends.torch_backend`."""

__all__: list[str] = []
