"""The policy: a ``transformers`` causal LM, loaded from a local directory or built from a small
config with random weights."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    GPT2Config,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from rllm_torch.backends.torch_backend.pretrained import pretrained_dir
from rllm_torch.core.errors import ConfigError, ModelNotFoundError
from rllm_torch.trainer.schema import ARCHITECTURES, COMPUTE_DTYPES

__all__ = [
    "build_policy",
    "resolve_device",
    "enable_gradient_checkpointing",
    "compute_autocast",
    "adamw",
    "context_length",
    "check_context",
    "DTYPES",
]

DTYPES = COMPUTE_DTYPES  # backend.dtype, declared in the schema


def build_policy(
    model_config: Any, tokenizer: PreTrainedTokenizerBase, *, seed: int = 0, key: str = "model.path"
) -> PreTrainedModel:
    """The policy model, in float32 and train mode.

    Args:
        model_config: the ``model`` config group: ``path`` (a local directory saved with
            ``save_pretrained``, or a ``.gguf`` file converted once into one under
            ``gguf_cache_dir``: :mod:`~rllm_torch.backends.torch_backend.pretrained`; None: build
            from the fields below), ``arch`` (gpt2 | llama),
            ``num_layers``, ``hidden_size``, ``num_heads``, ``max_positions``.
        tokenizer: gives the vocabulary size and the special token ids.
        seed: seeds the random initialisation.
        key: the setting that gave ``model_config.path``, named in errors (``model.ref_path`` for the reference).

    Raises:
        ModelNotFoundError: ``path`` is not a directory with a model, nor a ``.gguf`` file.
        ConfigError: a ``.gguf`` file without the ``gguf`` extra or of an architecture
            ``transformers`` cannot load, an unknown ``arch``, ``hidden_size`` not divisible by ``num_heads``, or a
            tokenizer with more tokens than the loaded model's embedding.
    """
    if model_config.path is not None:
        path = pretrained_dir(model_config.path, cache_dir=getattr(model_config, "gguf_cache_dir", None), key=key)
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"{key}={str(path)!r}: no model there (expected a directory with config.json, as save_pretrained writes, or a .gguf file). Leave model.path unset to build a small random model."
            )
        model = AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, dtype=torch.float32, config=_plain_config(path)
        ).train()
        rows = model.get_input_embeddings().num_embeddings
        if len(tokenizer) > rows:
            raise ConfigError(
                f"{key}={str(path)!r}: the tokenizer has {len(tokenizer)} tokens but the model's embedding (its vocabulary) "
                f"has {rows} rows, so ids beyond it would index out of range; save the model after "
                "model.resize_token_embeddings(len(tokenizer)), or use the tokenizer it was trained with."
            )
        return model
    arch, hidden, heads = model_config.arch, model_config.hidden_size, model_config.num_heads
    if arch not in ARCHITECTURES:
        raise ConfigError(f"model.arch={arch!r} is not one of {ARCHITECTURES}.")
    if hidden % heads:
        raise ConfigError(f"model.hidden_size={hidden} must be divisible by model.num_heads={heads}.")
    ids = {
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.eos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if arch == "gpt2":
        config = GPT2Config(
            n_layer=model_config.num_layers,
            n_embd=hidden,
            n_head=heads,
            n_positions=model_config.max_positions,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **ids,
        )
    else:
        config = LlamaConfig(
            num_hidden_layers=model_config.num_layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=heads,
            intermediate_size=4 * hidden,
            max_position_embeddings=model_config.max_positions,
            **ids,
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    return model.float().train()


def _plain_config(path: Path) -> PretrainedConfig:
    """``path``'s model config, less a GGUF ``quantization_config`` that a hand conversion left in
    its ``config.json`` (``from_pretrained(dir, gguf_file=...)`` then ``save_pretrained`` of its
    weights in a plain model): the weights there are plain tensors (GGUF's loader dequantises),
    but the entry would make ``transformers`` refuse to save the trained model at the export."""
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    quantization = getattr(config, "quantization_config", None)
    method = (
        quantization.get("quant_method")
        if isinstance(quantization, dict)
        else getattr(quantization, "quant_method", None)
    )
    if str(getattr(method, "value", method)).lower() == "gguf":
        del config.quantization_config
    return config


def context_length(model: torch.nn.Module) -> int | None:
    """The most positions ``model`` takes (``config.max_position_embeddings``, GPT-2's
    ``n_positions``), or None when its config does not say."""
    config = getattr(model, "config", None)
    return getattr(config, "max_position_embeddings", None)


def check_context(longest_prompt: int, max_new_tokens: int, context: int | None) -> None:
    """Raise :class:`ConfigError` when a prompt of ``longest_prompt`` tokens and
    ``max_new_tokens`` new ones do not fit in ``context`` positions (None: no limit known): a
    learned position table would be indexed out of range, and rotary positions beyond the
    trained range are silently wrong.

    Raises:
        ConfigError: naming ``rllm.rollout.max_new_tokens``, the longest prompt and the fixes.
    """
    if context is not None and longest_prompt + max_new_tokens > context:
        room = context - longest_prompt
        lower = f"lower rllm.rollout.max_new_tokens to {room} or less, " if room > 1 else ""
        raise ConfigError(
            f"the longest prompt has {longest_prompt} tokens and rllm.rollout.max_new_tokens={max_new_tokens}: "
            f"{longest_prompt + max_new_tokens} positions, beyond the model's context of {context}; {lower}shorten the "
            f"prompts, or use a model with a longer context (model.max_positions={longest_prompt + max_new_tokens} or more "
            "for a model built from scratch)."
        )


def resolve_device(name: str, *, local_rank: int | None = None) -> torch.device:
    """``"auto"``: CUDA when available, else CPU; otherwise ``torch.device(name)``. With a
    ``local_rank`` (a torchrun process), CUDA means that rank's GPU, ``cuda:{local_rank}``.

    Raises:
        ConfigError: an unknown device name, or ``cuda`` requested without CUDA.
    """
    if local_rank is not None and (name == "cuda" or (name == "auto" and torch.cuda.is_available())):
        return torch.device("cuda", local_rank)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(f"backend.device={name!r} is not a device name ({exc}).") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("backend.device=cuda but CUDA is not available; use backend.device=auto or cpu.")
    return device


def compute_autocast(device: torch.device | str, dtype: torch.dtype | None) -> AbstractContextManager:
    """``torch.autocast`` to ``dtype`` on ``device``'s type (:mod:`~.precision` chooses it), or a
    no-op for None (float32)."""
    if dtype is None:
        return nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)


def adamw(params: list[torch.nn.Parameter], *, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` over ``params``, with PyTorch's fused kernel when every parameter is
    on a CPU or CUDA device (float32 state either way).

    The fused kernel updates a tensor in one pass; the default for-loop form of a CPU optimizer
    allocates ``sqrt(v)`` and its bias-corrected copy of each tensor, 1.1 GB for Qwen2.5-0.5B's
    151,936 x 896 embedding, at the moment every weight, gradient and moment is resident (the
    peak of a step). It is also the default of ``transformers``' Trainer (``adamw_torch_fused``).
    """
    fused = bool(params) and all(p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True if fused else None)


def enable_gradient_checkpointing(model: PreTrainedModel, *, key: str = "backend.gradient_checkpointing") -> None:
    """Recompute each transformer block's activations in the backward (``transformers``'
    ``activation_checkpointing_enable``, formerly ``gradient_checkpointing_enable``, with
    PyTorch's non-reentrant checkpoint).

    Raises:
        ConfigError: the model's class does not support it (naming ``key``).
    """
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ConfigError(
            f"{key}=true but {type(model).__name__} does not support gradient checkpointing; set {key}=false."
        )
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x's name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
