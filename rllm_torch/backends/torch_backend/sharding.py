"""FSDP2 for the torch backend's policy (``backend.parallelism=fsdp`` under torchrun).

The policy is sharded with ``torch.distributed.fsdp.fully_shard``: each transformer block
(``model._no_split_modules``, e.g. ``GPT2Block``, ``LlamaDecoderLayer``) is one unit, then the
root (embeddings, final norm, the tied head). Each rank holds ``1 / W`` of every parameter, its
gradient and its AdamW state; a forward all-gathers one block at a time.

Sampling runs a different number of forwards on each rank (prompts of each rank stop at
different lengths), so forwards must not be collectives then: :func:`gathered_weights` gathers
the whole policy once on every rank for a sampling phase and reshards it after. Training and the
log-prob passes run one forward per call on every rank (a rank with no row runs a dummy one).

State goes through ``torch.distributed.checkpoint``: :func:`sharded_state` is what every rank
writes (its shards of the model and optimizer), :func:`full_model_state` the whole model on
rank 0, for ``save_pretrained``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from rllm_torch.core.errors import ConfigError
from rllm_torch.trainer.ranks import RunRanks

__all__ = ["shard_policy", "gathered_weights", "sharded_state", "load_sharded_state", "full_model_state"]


def shard_policy(
    root: torch.nn.Module, model: torch.nn.Module, ranks: RunRanks, *, param_dtype: torch.dtype | None = None
) -> torch.nn.Module:
    """``root`` (the module the forwards go through: the policy's
    :class:`~rllm_torch.backends.torch_backend.forward.PolicyScorer`) sharded in place over every
    rank (FSDP2): each transformer block of ``model`` one unit, ``root`` the last; returned for
    convenience. With ``param_dtype`` (bfloat16) the gathered parameters are cast to it for the
    forwards and gradients are reduced in float32 (``MixedPrecisionPolicy``); the shards, and
    AdamW's state, stay float32.

    Raises:
        ConfigError: the model names no block class to shard by (``_no_split_modules``).
    """
    blocks = set(getattr(model, "_no_split_modules", None) or ())
    if not blocks:
        raise ConfigError(
            f"backend.parallelism=fsdp: {type(model).__name__} names no transformer block class (_no_split_modules) to shard by."
        )
    device = next(model.parameters()).device
    mesh = init_device_mesh(device.type, (ranks.world_size,))
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype else None
    options = {"mesh": mesh} | ({"mp_policy": policy} if policy is not None else {})
    for module in model.modules():
        if type(module).__name__ in blocks:
            fully_shard(module, **options)
    fully_shard(root, **options)
    return root


def _units(model: torch.nn.Module) -> list[FSDPModule]:
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextmanager
def gathered_weights(model: torch.nn.Module) -> Iterator[None]:
    """Inside, every FSDP unit of ``model`` holds its full weights and forwards communicate
    nothing (any number of them per rank); after, the weights are sharded again. Every rank must
    enter together (the gather is a collective)."""
    units = _units(model)
    for unit in units:
        unit.set_reshard_after_forward(False)
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(True)


def sharded_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """This rank's shards of the model and optimizer state (``torch.distributed.checkpoint``'s
    form: save it with ``dcp.save``, load into it with ``dcp.load``)."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optimizer_state}


def load_sharded_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Set the model and optimizer from :func:`sharded_state`'s dict, filled by ``dcp.load``."""
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict on rank 0 (on CPU), ``{}`` on the others; every rank must call."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
