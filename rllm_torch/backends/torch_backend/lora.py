"""LoRA adapters on the policy through ``peft`` (``model.lora.r > 0``; ``pip install 'rllm_torch[lora]'``).

Only the adapters train (and take AdamW state); the base weights stay frozen, so the frozen
reference policy of the KL terms is the same model with its adapters disabled (no second copy).
Checkpoints hold the adapters' weights; the exported model (``checkpoints/final``) has them merged
into the base, so it loads as a plain ``transformers`` model with ``model.path=``.

Source: Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", arXiv:2106.09685
(``W + (alpha / r) B A``); ``peft``'s ``LoraConfig`` names.
"""

from __future__ import annotations

import copy
import warnings
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rllm_torch.core.errors import ConfigError

__all__ = ["apply_lora", "is_lora", "adapters_disabled", "adapter_state", "load_adapter_state", "save_merged"]


def _peft() -> Any:
    try:
        import peft
    except ImportError as exc:
        raise ConfigError(
            "model.lora.r > 0 needs the peft package: pip install 'rllm_torch[lora]' (or set model.lora.r=0 to train "
            "the whole model)."
        ) from exc
    return peft


def apply_lora(model: nn.Module, settings: Any, *, seed: int = 0) -> nn.Module:
    """``model`` with LoRA adapters of ``settings`` (``model.lora``: ``r``, ``alpha``, ``dropout``,
    ``target_modules``: module names, or ``[all-linear]`` for every linear layer but the head),
    ``A`` initialised from ``seed`` (``B`` is 0: the adapted model starts as the base).

    Raises:
        ConfigError: peft is not installed, ``r``/``alpha`` not positive, ``dropout`` outside
            ``[0, 1)``, or ``target_modules`` matching no module of the model (the message lists
            the model's linear modules).
    """
    if settings.r < 1 or settings.alpha <= 0 or not 0 <= settings.dropout < 1:
        raise ConfigError(
            f"model.lora needs r >= 1, alpha > 0 and 0 <= dropout < 1, got r={settings.r}, alpha={settings.alpha}, "
            f"dropout={settings.dropout}."
        )
    peft = _peft()
    targets = list(settings.target_modules)
    if "lm_head" in targets:
        raise ConfigError(
            "model.lora.target_modules includes lm_head: the trainer's chunked log-probs read the head's weight "
            "directly; leave lm_head out (all-linear already does)."
        )
    from transformers.pytorch_utils import Conv1D  # GPT-2's linear layers, stored transposed

    config = peft.LoraConfig(
        fan_in_fan_out=any(isinstance(m, Conv1D) for m in model.modules()),
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules="all-linear" if targets == ["all-linear"] else targets,
        task_type="CAUSAL_LM",
    )
    try:
        device = next(model.parameters()).device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), warnings.catch_warnings():
            # peft reads transformers' deprecated ``is_gradient_checkpointing``: a warning no user can act on
            warnings.filterwarnings(
                "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
            )
            torch.manual_seed(seed)
            return peft.get_peft_model(model, config)
    except ValueError as exc:
        linear = sorted(
            {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear | Conv1D)}
            - {"lm_head"}
        )
        raise ConfigError(
            f"model.lora.target_modules={targets} matches no module of {type(model).__name__} ({exc}); its linear "
            f"modules are {linear} (or use [all-linear])."
        ) from exc


def is_lora(model: nn.Module) -> bool:
    """Whether ``model`` is a ``peft`` model (adapters on a frozen base)."""
    return hasattr(model, "disable_adapter") and hasattr(model, "get_base_model")


def adapters_disabled(model: nn.Module) -> AbstractContextManager:
    """Inside, a LoRA model computes its frozen base model (the reference policy); a no-op otherwise."""
    return model.disable_adapter() if is_lora(model) else nullcontext()


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapters' weights of a LoRA model (its checkpointed state)."""
    return _peft().get_peft_model_state_dict(model)


def load_adapter_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load :func:`adapter_state`'s dict into a LoRA model of the same settings.

    Raises:
        ConfigError: the checkpoint has no adapters or other ones (the run's model.lora changed).
    """
    result = _peft().set_peft_model_state_dict(model, state)
    missing = [k for k in getattr(result, "missing_keys", []) if "lora_" in k]
    if not state or missing or getattr(result, "unexpected_keys", []):
        raise ConfigError(
            "the checkpoint's LoRA adapters do not fit model.lora (other target modules or rank); resume with the "
            "run's own model.lora settings, or start a new run (rllm.trainer.resume_mode=disable)."
        )


def save_merged(model: nn.Module, path: str | Path) -> None:
    """``save_pretrained`` of a LoRA model with its adapters merged into the base weights (a
    plain ``transformers`` model; the training model keeps its adapters)."""
    merged = copy.deepcopy(model).merge_and_unload()
    merged.save_pretrained(path)
