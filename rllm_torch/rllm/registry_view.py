"""rLLM's ``RLLM_ADV_ESTIMATOR_REGISTRY``: the registry (:mod:`~rllm_torch.rllm.registry`) seen as
rLLM's dict of name → the function rLLM's code calls. It lives above the registry, the
dispatch and the arrays forms, which it reads, so none of them imports it back."""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from enum import Enum

from rllm_torch.rllm.arrays import get_rllm_adv_estimator
from rllm_torch.rllm.dispatch import get_tensor_adv_estimator
from rllm_torch.rllm.registry import register_rllm_adv_estimator, registered_estimator_names, registration

__all__ = ["RLLM_ADV_ESTIMATOR_REGISTRY"]


class _EstimatorRegistry(MutableMapping):
    """A live view of the registry: ``[name]`` is the function rLLM's code would call
    (:func:`~rllm_torch.rllm.arrays.get_rllm_adv_estimator`; a token-level estimator's tensor
    function, :func:`~rllm_torch.rllm.dispatch.get_tensor_adv_estimator`); assigning a name
    registers an ``"arrays"`` estimator (rLLM's form); names cannot be deleted.

    Raises:
        KeyError: ``[name]`` of a name that is not registered (a dict's error, as in rLLM).
        TypeError: ``del`` of a name.
    """

    def __getitem__(self, name: object) -> Callable:
        if name not in self:
            raise KeyError(name)
        if registration(name).form == "tokens":
            return get_tensor_adv_estimator(name)
        return get_rllm_adv_estimator(name)

    def __setitem__(self, name: object, fn: Callable) -> None:
        register_rllm_adv_estimator(name, form="arrays")(fn)

    def __delitem__(self, name: object) -> None:
        raise TypeError(
            "registered estimators cannot be removed; register another function under the name to replace it."
        )

    def __iter__(self) -> Iterator[str]:
        return iter(registered_estimator_names())

    def __len__(self) -> int:
        return len(registered_estimator_names())

    def __contains__(self, name: object) -> bool:
        return (name.value if isinstance(name, Enum) else name) in registered_estimator_names()


RLLM_ADV_ESTIMATOR_REGISTRY: MutableMapping = _EstimatorRegistry()
