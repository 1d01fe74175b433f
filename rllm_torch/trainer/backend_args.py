"""The keyword arguments a backend is built with: the caller's ``backend_args``, and what the
trainer already has for a backend that reads it: the tasks themselves (the torch backend takes
the alphabet of its character tokenizer and the response length from their text when they are
not set) and the run's checked :class:`~rllm_torch.rllm.config.AlgorithmConfig` (its losses)."""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["backend_args_for"]


def backend_args_for(backend_cls: type, backend_args: dict | None, algorithm_config: Any, *datasets: Any) -> dict:
    """``backend_args`` plus ``tasks`` (every task dict of ``datasets`` given as lists: training,
    validation) and ``algorithm_config``, each when ``backend_cls``'s constructor has a parameter
    of that name or takes any keyword (``**kwargs``, as
    :class:`~rllm_torch.trainer.protocol.BackendProtocol`'s does), and ``backend_args`` gives none.

    Examples:
        >>> class Reads:
        ...     def __init__(self, config, tasks=None): ...
        >>> backend_args_for(Reads, {"alphabet": "ab"}, None, [{"prompt": "a"}], None)
        {'alphabet': 'ab', 'tasks': [{'prompt': 'a'}]}
        >>> class Strict:
        ...     def __init__(self, config, ranks=None): ...
        >>> backend_args_for(Strict, None, None, [{"prompt": "a"}])
        {}
    """
    args = dict(backend_args or {})
    try:
        parameters = list(inspect.signature(backend_cls).parameters.values())
    except (TypeError, ValueError):  # no signature to read
        parameters = []

    def takes(name: str) -> bool:
        return name not in args and any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)

    if takes("tasks"):
        args["tasks"] = [task for dataset in datasets if isinstance(dataset, list) for task in dataset]
    if algorithm_config is not None and takes("algorithm_config"):
        args["algorithm_config"] = algorithm_config
    return args
