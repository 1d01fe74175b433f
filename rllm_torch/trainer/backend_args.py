"""The keyword arguments a backend is built with: the caller's ``backend_args``, and the tasks
themselves for a backend that reads them (the torch backend takes the alphabet of its character
tokenizer and the response length from their text when they are not set)."""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["backend_args_with_tasks"]


def backend_args_with_tasks(backend_cls: type, backend_args: dict | None, *datasets: Any) -> dict:
    """``backend_args`` plus ``tasks``: every task dict of ``datasets`` given as lists (training,
    validation), when ``backend_cls``'s constructor has a ``tasks`` parameter or takes any keyword
    (``**kwargs``, as :class:`~rllm_torch.trainer.protocol.BackendProtocol`'s does), and
    ``backend_args`` gives none.

    Examples:
        >>> class Reads:
        ...     def __init__(self, config, tasks=None): ...
        >>> backend_args_with_tasks(Reads, {"alphabet": "ab"}, [{"prompt": "a"}], None)
        {'alphabet': 'ab', 'tasks': [{'prompt': 'a'}]}
        >>> class Strict:
        ...     def __init__(self, config, ranks=None): ...
        >>> backend_args_with_tasks(Strict, None, [{"prompt": "a"}])
        {}
    """
    args = dict(backend_args or {})
    try:
        parameters = inspect.signature(backend_cls).parameters.values()
    except (TypeError, ValueError):  # no signature to read
        parameters = []
    takes_tasks = any(p.name == "tasks" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
    if takes_tasks and "tasks" not in args:
        args["tasks"] = [task for dataset in datasets if isinstance(dataset, list) for task in dataset]
    return args
