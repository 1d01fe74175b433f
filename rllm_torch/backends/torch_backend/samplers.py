"""The torch backend's sampling engines (:class:`Samplers`): the main engine, which samples the
training episodes of a synchronous run and every validation, and async training's sampler, with
the weights each phase samples on. ``hf``: :class:`~.rollout.TorchRolloutEngine` (``transformers``'
``generate`` over the policy itself, or over a copy of it for async training); ``vllm``: a
colocated :class:`~.vllm_rollout.VllmRolloutEngine`, which holds weights of its own synced after
optimizer steps (``backend.rollout``)."""

from __future__ import annotations

import copy
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from omegaconf import DictConfig

from rllm_torch.backends.torch_backend.actor import Actor
from rllm_torch.backends.torch_backend.rollout import SamplingParams, TorchRolloutEngine
from rllm_torch.backends.torch_backend.vllm_rollout import VllmRolloutEngine
from rllm_torch.backends.torch_backend.vllm_setup import full_weights
from rllm_torch.trainer.ranks import RunRanks

__all__ = ["Samplers"]


class Samplers:
    """The sampling engines of one backend, built on first use (:meth:`build`, :meth:`build_async`).

    Args:
        actor: the policy (its model, optimizer, shared-prompt setting and sampling weights).
        tokenizer: the policy's tokenizer.
        config: the backend's run config (``rllm.rollout``, ``backend.rollout``, ``backend.seed``,
            ``rllm.async_training.partial_rollout``).
        ranks: the run's processes (rank ``r`` samples with seed ``backend.seed + r``).
        compute_dtype: the policy's compute dtype (``hf``: autocast; ``vllm``: its dtype by default).
        apply_chat_template: prompts go through the tokenizer's chat template.
    """

    def __init__(
        self,
        actor: Actor,
        tokenizer: Any,
        config: DictConfig,
        ranks: RunRanks,
        *,
        compute_dtype: torch.dtype,
        apply_chat_template: bool,
    ) -> None:
        self.actor, self.tokenizer, self.config, self.ranks = actor, tokenizer, config, ranks
        self.compute_dtype, self.apply_chat_template = compute_dtype, apply_chat_template
        self.main: TorchRolloutEngine | VllmRolloutEngine | None = None
        self.async_sampler: TorchRolloutEngine | VllmRolloutEngine | None = None

    def _hf(self, model: torch.nn.Module, train: SamplingParams, val: SamplingParams, size: int) -> TorchRolloutEngine:
        return TorchRolloutEngine(
            model,
            self.tokenizer,
            train,
            val,
            max_batch_size=size,
            seed=self.config.backend.seed + self.ranks.rank,  # each rank its own rollouts
            apply_chat_template=self.apply_chat_template,
            autocast_dtype=self.compute_dtype,
            share_prompts=self.actor.share_prompts,
        )

    def build(self, max_batch_size: int) -> TorchRolloutEngine | VllmRolloutEngine:
        """The main engine, with ``rllm.rollout``'s training and validation sampling settings and
        ``max_batch_size`` prompts per sampling call."""
        r, engine = self.config.rllm.rollout, self.config.backend.rollout
        train = SamplingParams(r.temperature, r.top_p, r.max_new_tokens)
        val = SamplingParams(r.val_temperature, r.val_top_p, r.max_new_tokens)
        if engine.engine != "vllm":
            self.main = self._hf(self.actor.model, train, val, max_batch_size)
            return self.main
        self.main = vllm_engine = VllmRolloutEngine(  # issue 18: colocated, synced after optimizer steps
            self.actor.model,
            self.tokenizer,
            train,
            val,
            max_batch_size=max_batch_size,
            seed=self.config.backend.seed + self.ranks.rank,
            apply_chat_template=self.apply_chat_template,
            max_model_len=engine.max_model_len,
            gpu_memory_utilization=engine.gpu_memory_utilization,
            kv_cache_memory_bytes=engine.kv_cache_memory_bytes,
            enforce_eager=engine.enforce_eager,
            dtype=engine.dtype or ("bfloat16" if self.compute_dtype == torch.bfloat16 else None),
            distributed=self.ranks.distributed,
        )
        self.actor.optimizer.register_step_post_hook(lambda *_: vllm_engine.mark_stale())
        return vllm_engine

    def build_async(self) -> TorchRolloutEngine | VllmRolloutEngine:
        """Async training's sampler, at policy version 0 until :meth:`publish`, sampling with
        training's settings and the rank's one sampling generator (the checkpoint's).

        ``hf``: an engine over its own copy of the policy (the policy's weights' memory once more).
        ``vllm``: the vLLM engine itself, which holds its own weights already (it then takes only
        the published ones); validation, which samples the current policy, gets an ``hf`` engine
        over the policy in its place."""
        main = self.main
        on_vllm = isinstance(main, VllmRolloutEngine)
        # hf: as it is, requires_grad too (sampling runs under no_grad, and a frozen copy takes
        # other kernels: its log-probs then differ from the policy's in the last bits)
        model = self.actor.model if on_vllm else copy.deepcopy(self.actor.model)
        hf = self._hf(model, main.train_params, main.val_params, main.max_batch_size)
        if on_vllm:  # vLLM samples the training episodes, hf over the policy validates
            main.published_weights_only = True
            self.main, engine = hf, main
        else:  # the copy samples with the run's one generator (the checkpoint's)
            hf.generator, engine = main.generator, hf
        engine.version = 0
        engine.sync_in_flight = bool(self.config.rllm.async_training.partial_rollout)
        self.async_sampler = engine
        return engine

    def publish(self, version: int) -> None:
        """Stage the policy's weights as ``version`` in the async sampler, which takes them between
        batches (or, with ``partial_rollout``, at its next sampling call): copies of the trainable
        parameters for the ``hf`` sampler (with LoRA only the adapters: the frozen base is its
        already); for vLLM every weight by the base model's names, LoRA merged
        (:func:`~rllm_torch.backends.torch_backend.vllm_setup.full_weights`)."""
        model = self.actor.model
        if isinstance(self.async_sampler, VllmRolloutEngine):
            weights = {name: tensor.clone() for name, tensor in full_weights(model)}
        else:
            weights = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
        self.async_sampler.stage_weights(weights, version)

    @property
    def training(self) -> TorchRolloutEngine | VllmRolloutEngine:
        """The engine that samples the training episodes (async training with vLLM: its sampler)."""
        return self.async_sampler if isinstance(self.async_sampler, VllmRolloutEngine) else self.main

    def weights(self, rollout: Any = None) -> AbstractContextManager:
        """The weights a sampling phase runs on. The vLLM engine holds its own copy: it is synced
        here if an optimizer step changed the policy (under FSDP one parameter at a time, every
        rank together); async training's sampler takes its staged weights. The main ``hf`` engine
        runs on the policy itself: under FSDP, gathered whole for the phase (:meth:`Actor.sampling_weights`).
        ``rollout``: the engine of the phase (None: the main one)."""
        rollout = rollout if rollout is not None else self.main
        rollout.sync_weights()  # a no-op for the main hf engine
        own_weights = isinstance(rollout, VllmRolloutEngine) or rollout is not self.main
        return nullcontext() if own_weights else self.actor.sampling_weights()

    def shutdown(self) -> None:
        """Release the vLLM engine (the sampler's, in async training) at the end of the run, not
        whenever the garbage collector gets to it: vLLM's process-wide parallel state goes with it,
        which a later engine in the same process (a second run) would otherwise lose mid-run."""
        for engine in {id(e): e for e in (self.main, self.async_sampler)}.values():
            if isinstance(engine, VllmRolloutEngine) and engine.llm is not None:
                engine.shutdown()
