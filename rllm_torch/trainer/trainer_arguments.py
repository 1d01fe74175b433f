"""The keyword arguments ``UnifiedTrainer`` refuses: a misspelt one (named with the closest real
one), and rLLM's that this trainer does not implement (named as such), never ignored."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from rllm_torch.core.errors import UnknownArgumentError

__all__ = ["RLLM_ONLY_ARGUMENTS", "refuse_unknown_arguments"]

# rLLM's UnifiedTrainer reads these from its **kwargs (agent flows, the gateway and sandboxes,
# launcher-only names); each is a service of rLLM's that the torch trainer does not have
RLLM_ONLY_ARGUMENTS = {
    "agent_flow": "rLLM's agent flows",
    "evaluator": "rLLM's agent-flow evaluators",
    "hooks": "rLLM's agent-flow hooks",
    "backend_name": "rLLM's launcher (the backend here is the backend_cls argument)",
    "sandbox_backend": "rLLM's sandboxes",
    "sandbox_concurrency": "rLLM's sandboxes",
}


def refuse_unknown_arguments(given: Mapping[str, Any], where: Callable) -> None:
    """Raise for the first name of ``given`` (a ``**kwargs``) that ``where`` cannot honour.

    Args:
        given: the keyword arguments that matched no parameter of ``where``.
        where: the callable (a class: its ``__init__``) whose named parameters are the suggestions.

    Raises:
        UnknownArgumentError: a name of :data:`RLLM_ONLY_ARGUMENTS` (what it is and that it is not
            implemented here), or any other name (with the closest known one when there is one).
    """
    parameters = inspect.signature(where).parameters.values()
    known = [p.name for p in parameters if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    for name in given:
        if name in RLLM_ONLY_ARGUMENTS:
            raise UnknownArgumentError(
                f"{where.__name__}({name}=...) is {RLLM_ONLY_ARGUMENTS[name]}, which rllm_torch does not implement; "
                f"train with a workflow_class instead (docs/porting.md lists what is not here)."
            )
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}=?" if close else f"it takes: {', '.join(known)}."
        raise UnknownArgumentError(f"{where.__name__} got an unknown keyword argument {name}=; {hint}")
