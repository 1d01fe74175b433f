"""Where the update reads each policy loss's options: the run settings its declaration names
(:class:`~rllm_torch.core.losses.BuiltinLoss`'s ``settings``; a registered loss's rLLM
parameters, :data:`~rllm_torch.core.losses.registry.RLLM_PARAMS`). Each of them is checked against
the run's schema when this module is imported, so a loss option without a setting stops the
import with a :class:`~rllm_torch.core.errors.LossDeclarationError` naming the loss, the option
and where to declare it, not the first update with a ``KeyError``."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from omegaconf import DictConfig

from rllm_torch.core.losses import check_loss_settings
from rllm_torch.rllm.plan import RoleLoss
from rllm_torch.trainer.schema import TrainConfig

__all__ = ["is_run_setting", "loss_params"]

_SCHEMA = TrainConfig()


def is_run_setting(key: str) -> bool:
    """Whether the dotted ``key`` (``"backend.tau_pos"``) is a setting of the run's schema
    (:class:`~rllm_torch.trainer.schema.TrainConfig`): a field of its sections, not a section."""
    node: Any = _SCHEMA
    for part in key.split("."):
        if not (dataclasses.is_dataclass(node) and part in {f.name for f in dataclasses.fields(node)}):
            return False
        node = getattr(node, part)
    return not dataclasses.is_dataclass(node)


check_loss_settings(is_run_setting)


def loss_params(loss: RoleLoss, config: DictConfig) -> dict[str, Any]:
    """``loss``'s ``LossContext.params`` in the run ``config`` (a typed run config): a built-in's
    options from their settings, a registered loss's rLLM parameters and
    ``rllm.algorithm.loss_params``."""

    def setting(key: str) -> Any:
        return functools.reduce(getattr, key.split("."), config)

    return loss.params(setting, config.rllm.algorithm.loss_params or {})
