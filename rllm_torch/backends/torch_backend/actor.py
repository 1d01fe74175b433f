"""The actor: the policy being trained (verl's name), with what it takes to train a real model.

One object holds the causal LM (with LoRA adapters when ``model.lora.r > 0``), its scoring module
(:class:`~rllm_torch.backends.torch_backend.forward.PolicyScorer`: chunked log-probs, autocast to
``backend.dtype``), the training wrapper of the scorer over the ranks (DDP, or FSDP2 under
``backend.parallelism=fsdp``), AdamW over the trainable parameters, and the frozen reference
policy of the KL terms (a copy of the initial policy, ``model.ref_path``, or, with LoRA, the same
model with its adapters disabled).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from transformers import PreTrainedTokenizerBase

from rllm_torch.backends.torch_backend.forward import PolicyScorer, causal_lm, check_linear_head, check_shared_prompts
from rllm_torch.backends.torch_backend.lora import (
    adapter_state,
    adapters_disabled,
    apply_lora,
    is_lora,
    load_adapter_state,
    save_merged,
)
from rllm_torch.backends.torch_backend.model import adamw, build_policy, context_length, enable_gradient_checkpointing
from rllm_torch.backends.torch_backend.optim_step import clipped_step
from rllm_torch.backends.torch_backend.precision import (
    PhaseProbe,
    Precision,
    ProbeShapes,
    choose_precision,
    measure_phases,
)
from rllm_torch.backends.torch_backend.probe_cache import cached_probe, machine_load, probe_key
from rllm_torch.core.errors import ConfigError, ModelNotFoundError
from rllm_torch.core.losses import losses_need
from rllm_torch.trainer.ranks import RunRanks
from rllm_torch.trainer.runtime.stop import add_stop_points

__all__ = ["Actor", "wrap_ddp"]


def wrap_ddp(module: torch.nn.Module, ranks: RunRanks, device: torch.device) -> torch.nn.Module:
    """``module`` in ``DistributedDataParallel`` over the ranks (the module itself on one process)."""
    if not ranks.distributed:
        return module
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(module, device_ids=device_ids, process_group=ranks.process_group)


class Actor:
    """The trained policy and its optimizer (see the module docstring).

    Args:
        config: the run config (``model``, ``backend``, ``rllm.algorithm``, ``rllm.rollout``).
        tokenizer: the policy's tokenizer (vocabulary size, pad token).
        device: where the model lives.
        ranks: the run's processes.
        losses: the losses in use (a loss that needs ``logp_ref`` gets a reference policy).
        probe_shapes: the run's shapes, timed in float32 and bfloat16 when ``backend.dtype`` asks
            for a measurement (:mod:`~rllm_torch.backends.torch_backend.precision`); the result is
            :attr:`precision` (each phase's dtype) and :attr:`compute_dtype` (the update's).

    Raises:
        ConfigError / ModelNotFoundError: a bad model, reference, LoRA, checkpointing or
            parallelism setting.
    """

    def __init__(
        self,
        config: DictConfig,
        tokenizer: PreTrainedTokenizerBase,
        device: torch.device,
        ranks: RunRanks,
        losses: Iterable[str] = (),
        *,
        probe_shapes: ProbeShapes,
    ) -> None:
        self.config, self.settings, self.tokenizer = config, config.backend, tokenizer
        self.device, self.ranks = device, ranks
        self.parallelism = self.settings.parallelism
        self.sharded = ranks.distributed and self.parallelism == "fsdp"
        self.base = build_policy(config.model, tokenizer, seed=self.settings.seed).to(device)
        algorithm = config.rllm.algorithm
        self.has_reference = bool(algorithm.use_kl_loss or algorithm.use_kl_in_reward) or losses_need(
            losses, "logp_ref"
        )
        lora = config.model.lora
        # the reference is copied before checkpointing or adapters change the model; with LoRA and no
        # model.ref_path it is the model itself with its adapters disabled
        own_reference = self.has_reference and (lora.r == 0 or config.model.ref_path is not None)
        self.ref_model = self._reference_policy(config.model) if own_reference else None
        if self.settings.gradient_checkpointing:
            enable_gradient_checkpointing(self.base)
        self.model = apply_lora(self.base, lora, seed=self.settings.seed) if lora.r > 0 else self.base
        add_stop_points(self.base)  # a SIGTERM is honoured between two blocks (trainer/runtime/stop.py)
        check_linear_head(self.model)
        # a model that builds its own attention mask scores rows one by one (the summary says why)
        self.unshared_reason = check_shared_prompts(self.model) if self.settings.share_prompts else None
        self.share_prompts = bool(self.settings.share_prompts) and self.unshared_reason is None
        scoring = dict(
            temperature=config.rllm.rollout.temperature,
            chunk_tokens=self.settings.log_prob_chunk_tokens,
            share_prompts=self.share_prompts,
        )
        self.scorer = PolicyScorer(self.model, **scoring)
        self.precision = self._choose_precision(probe_shapes)
        self.compute_dtype = self.scorer.autocast_dtype = self.precision.update
        scoring["autocast_dtype"] = self.compute_dtype
        self.ref_scorer = PolicyScorer(self.ref_model, **scoring) if self.ref_model is not None else self.scorer
        if self.sharded:
            from rllm_torch.backends.torch_backend.sharding import shard_policy

            self.train_model = shard_policy(self.scorer, causal_lm(self.model), ranks, param_dtype=self.compute_dtype)
            with torch.no_grad():  # FSDP2 takes the module of the first forward as its root: the scorer,
                self.dummy_loss()  # not the bare model that sampling runs (every rank builds it together)
            self.train_model.reshard()  # the root keeps its gathered weights after a forward
        else:
            self.train_model = wrap_ddp(self.scorer, ranks, device)
        self.parameters = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = adamw(self.parameters, lr=self.settings.lr, weight_decay=self.settings.weight_decay)

    def _choose_precision(self, shapes: ProbeShapes) -> Precision:
        """Each phase's dtype for ``backend.dtype`` (:func:`~.precision.choose_precision`), timing
        ``shapes`` on this policy and its scorer when the setting asks for a measurement, or taking
        the timings kept in ``backend.dtype_cache`` (:mod:`~.probe_cache`)."""

        def score(input_ids: Tensor, attention_mask: Tensor, dtype: torch.dtype | None) -> Tensor:
            self.scorer.autocast_dtype = dtype
            return self.scorer(input_ids, attention_mask).log_probs

        shapes = shapes.within(context_length(self.model))

        def probe() -> PhaseProbe:
            key = probe_key(self.model, self.device, shapes)
            measured = cached_probe(
                self.settings.dtype_cache,
                key,
                lambda: measure_phases(self.model, score, shapes, vocab_size=len(self.tokenizer)),
                load=machine_load if self.device.type == "cpu" else None,
            )
            return measured.averaged(self.ranks.process_group if self.ranks.distributed else None)

        pretrained = self.config.model.path is not None
        return choose_precision(self.settings.dtype, self.device, pretrained=pretrained, probe=probe)

    @property
    def lora(self) -> bool:
        return is_lora(self.model)

    def _reference_policy(self, model_config: DictConfig) -> torch.nn.Module:
        """The frozen reference policy: ``model.ref_path``, or a copy of the initial policy (built
        before any checkpoint is loaded, so a resumed run keeps the same reference).

        Raises:
            ConfigError / ModelNotFoundError: ``model.ref_path`` has no model, or a vocabulary of
                another size than the policy's (the log-probs would be of other tokens).
        """
        if model_config.ref_path is None:
            ref = copy.deepcopy(self.base)
        else:
            ref_config = OmegaConf.merge(model_config, {"path": model_config.ref_path})
            try:
                ref = build_policy(ref_config, self.tokenizer, key="model.ref_path").to(self.device)
            except ModelNotFoundError as exc:
                raise ModelNotFoundError(
                    f"model.ref_path={model_config.ref_path!r}: no model there (expected a directory with config.json, "
                    "as save_pretrained writes); leave model.ref_path unset for a frozen copy of the initial policy."
                ) from exc
            mine, theirs = self.base.config.vocab_size, ref.config.vocab_size
            if mine != theirs:
                raise ConfigError(
                    f"model.ref_path={model_config.ref_path!r} has a vocabulary of {theirs} tokens but the policy has {mine}: "
                    "the reference must share the policy's tokenizer; leave model.ref_path unset to use the initial policy."
                )
        return ref.eval().requires_grad_(False)

    def scoring_module(self) -> torch.nn.Module:
        """The module a no-gradient pass of the policy goes through: the sharded one under FSDP
        (its forwards are collectives), else the plain scorer (DDP's would sync buffers)."""
        return self.train_model if self.sharded else self.scorer

    def reference(self) -> tuple[torch.nn.Module, AbstractContextManager]:
        """The reference policy's scoring module and the context to score it in (LoRA: the
        adapters disabled).

        Raises:
            ConfigError: the run has no reference policy (no KL term).
        """
        if not self.has_reference:
            raise ConfigError("no reference policy: set rllm.algorithm.use_kl_loss=true or use_kl_in_reward=true.")
        if self.ref_model is not None:
            return self.ref_scorer, nullcontext()
        return self.scorer, adapters_disabled(self.model)

    def dummy_loss(self) -> Tensor:
        """A zero through a two-token forward of the training module: a rank with no row takes part
        in the collectives that the others' forwards (FSDP) and backwards (DDP, FSDP) run, and
        every parameter (the head included) gets its zero gradient."""
        dummy = torch.full((1, 2), self.tokenizer.pad_token_id, dtype=torch.int64, device=self.device)
        return self.train_model(dummy, torch.ones_like(dummy)).log_probs.sum() * 0.0

    def step(self) -> Tensor:
        """:func:`~rllm_torch.backends.torch_backend.optim_step.clipped_step` of the policy
        (``backend.grad_clip``); returns the gradient norm before clipping.

        Raises:
            NonFiniteGradientError: the norm is NaN or infinite (the step is not taken).
        """
        return clipped_step(self.parameters, self.optimizer, self.settings.grad_clip, what="policy")

    def sampling_weights(self) -> AbstractContextManager:
        """FSDP: the whole policy gathered for a sampling phase (ranks sample different numbers of
        tokens, so their forwards must not communicate); otherwise nothing to do."""
        if not self.sharded:
            return nullcontext()
        from rllm_torch.backends.torch_backend.sharding import gathered_weights

        return gathered_weights(self.train_model)

    def state_dict(self) -> dict[str, Any]:
        """The model's state (LoRA: the adapters only) and the optimizer's; ``{}`` under FSDP
        (its shards are :meth:`sharded_state_dict`)."""
        if self.sharded:
            return {}
        model = adapter_state(self.model) if self.lora else self.model.state_dict()
        return {"model": model, "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s dict."""
        if self.sharded:
            return
        if self.lora:
            load_adapter_state(self.model, state["model"])
        else:
            self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def sharded_state_dict(self) -> dict[str, Any]:
        """FSDP: this rank's model and optimizer shards, for ``torch.distributed.checkpoint``
        (keys are the model's own: the scorer registers the model's modules under their names)."""
        from rllm_torch.backends.torch_backend.sharding import sharded_state

        return sharded_state(self.train_model, self.optimizer)

    def load_sharded_state_dict(self, state: dict[str, Any]) -> None:
        from rllm_torch.backends.torch_backend.sharding import load_sharded_state

        load_sharded_state(self.train_model, self.optimizer, state)

    def save_pretrained(self, path: Path) -> bool:
        """Export the model with ``save_pretrained`` (LoRA: adapters merged into the base); rank 0
        writes and returns True. Under FSDP every rank must call (the weights are gathered)."""
        if self.sharded:
            from rllm_torch.backends.torch_backend.sharding import full_model_state

            state = full_model_state(self.train_model)
            if not self.ranks.is_main:
                return False
            unsharded = build_policy(self.config.model, self.tokenizer, seed=self.settings.seed)
            unsharded.load_state_dict(state)
            unsharded.save_pretrained(path)
            return True
        if not self.ranks.is_main:
            return False
        if self.lora:
            save_merged(self.model, path)
        else:
            self.model.save_pretrained(path)
        return True
