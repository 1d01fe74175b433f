"""``VllmRolloutEngine`` (``backend.rollout.engine=vllm``): rollouts through a vLLM ``LLM``
colocated with the trainer, and the weight sync that keeps it on the trained policy.

Each process (each torchrun rank) holds its own engine, ``tensor_parallel_size=1``, running in
the trainer's process (vLLM's in-process engine: ``distributed_executor_backend="uni"`` for one
process, ``"external_launcher"`` under torchrun, as TRL's colocate mode), so the weight sync is a
copy between tensors of one process: :meth:`VllmRolloutEngine.sync_weights` hands the policy's
parameters, one at a time (with FSDP2, each gathered with ``full_tensor()`` on its own, never the
whole model at once), to vLLM's worker method ``reload_weights``, which loads them through the
model's own ``load_weights`` (vLLM's names and layouts), then drops the prefix cache of the old
weights. The engine starts from ``load_format="dummy"`` (only ``config.json`` is written, to a
temporary directory) and takes the policy's weights at its first sampling phase, so a resumed run
samples from the restored weights.

Sampling parameters come from ``rllm.rollout.*``: temperature (0: greedy), top-p, ``max_tokens``
= ``max_new_tokens``, stop at the tokenizer's end token, and ``n``: the identical prompts of one
batch (a task's ``n`` rollouts) are one request with ``n`` samples. Prompts go in as token ids
(``skip_tokenizer_init``), and each sampled token's log-prob comes back from vLLM
(``logprobs_mode="processed_logprobs"``: under ``softmax(logits / temperature)``, after top-p,
so with ``top_p < 1`` it is the truncated, renormalised distribution the token was drawn from;
the ``hf`` engine's are before the cut). Each request's seed is drawn from the rank's generator
(saved in checkpoints), so the rank's generator decides the samples, as with ``hf``.

Set-up errors are :class:`~rllm_torch.core.errors.ConfigError` at start-up, naming the setting: vLLM
not installed (with the extra to install), an architecture vLLM does not implement, a head size
vLLM's CPU attention does not take, ``backend.rollout.max_model_len`` shorter than a prompt plus
``rllm.rollout.max_new_tokens``.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from rllm_torch.backends.torch_backend.model import context_length
from rllm_torch.backends.torch_backend.rollout import BatchedRolloutEngine, SamplingParams, model_outputs
from rllm_torch.backends.torch_backend.tokenizer import encode_prompts
from rllm_torch.backends.torch_backend.vllm_setup import (
    CPU_KV_CACHE_BYTES,
    check_max_model_len,
    check_model,
    full_weights,
    global_rng_kept,
    import_vllm,
    kv_cache_context,
    kv_cache_errors_named,
    logging_below_error,
    quiet_logs,
)
from rllm_torch.trainer.workflow import ModelOutput

__all__ = ["VllmRolloutEngine", "sample_with_vllm"]


def sample_with_vllm(
    llm: Any,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    eos_token_id: int | None,
    temperature: float = 1.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[list[list[int]], list[list[float]], list[str]]:
    """One completion per prompt from a vLLM ``LLM``, in one ``generate`` call.

    Identical prompts form one request with ``n`` equal to their count (vLLM's parallel
    sampling: the prompt is prefilled once); each request's seed is drawn from ``generator`` (its
    ``n`` samples take ``seed + i``), so the samples are a function of the generator's state.
    ``temperature=0`` is greedy. A row stops after ``eos_token_id`` (kept in its response; None:
    never) or after ``max_new_tokens`` tokens.

    Returns:
        ``(response_ids, logprobs, finish_reasons)`` per prompt, in the order of ``prompts``:
        the sampled ids, their log-probs (nats, vLLM's ``processed_logprobs``: after temperature
        and top-p) and ``"stop"`` or ``"length"``, as :func:`~rllm_torch.backends.torch_backend.sampling.sample_completions`.
    """
    from vllm import SamplingParams as VllmSamplingParams

    rows_of: dict[tuple[int, ...], list[int]] = {}
    for row, ids in enumerate(prompts):
        rows_of.setdefault(tuple(ids), []).append(row)
    requests, params = [], []
    for ids, rows in rows_of.items():
        seed = int(torch.randint(0, 2**31 - len(rows), (1,), generator=generator))
        params.append(
            VllmSamplingParams(
                n=len(rows),
                temperature=temperature,
                top_p=top_p if temperature > 0 else 1.0,
                max_tokens=max_new_tokens,
                ignore_eos=True,  # not the model config's end token: ``eos_token_id`` alone, as generate is given
                stop_token_ids=[eos_token_id] if eos_token_id is not None else None,
                logprobs=0,
                seed=seed,
                detokenize=False,
            )
        )
        requests.append({"prompt_token_ids": list(ids)})
    responses: list[list[int]] = [[] for _ in prompts]
    logprobs: list[list[float]] = [[] for _ in prompts]
    reasons = ["length"] * len(prompts)
    for (_, rows), out in zip(rows_of.items(), llm.generate(requests, params, use_tqdm=False), strict=True):
        for row, completion in zip(rows, out.outputs, strict=True):
            ids = list(completion.token_ids)
            responses[row] = ids
            logprobs[row] = [float(step[token].logprob) for step, token in zip(completion.logprobs, ids, strict=True)]
            reasons[row] = "stop" if eos_token_id is not None and ids and ids[-1] == eos_token_id else "length"
    return responses, logprobs, reasons


class VllmRolloutEngine(BatchedRolloutEngine):
    """Batched sampling through a colocated vLLM engine (see the module docstring); the
    arguments before ``max_model_len`` are :class:`BatchedRolloutEngine`'s (the generator the
    requests' seeds are drawn from is on the CPU; ``seed`` also seeds vLLM's own).

    Args:
        max_model_len: the engine's context (None: the policy's ``max_position_embeddings``, or
            fewer when the KV cache has a byte budget: as many positions as it holds,
            :func:`~rllm_torch.backends.torch_backend.vllm_setup.kv_cache_context`).
        gpu_memory_utilization: share of the GPU's memory vLLM may take (CUDA).
        kv_cache_memory_bytes: the KV cache's size (None: on CPU :data:`CPU_KV_CACHE_BYTES`, on
            CUDA from ``gpu_memory_utilization``).
        enforce_eager: no CUDA graphs / compilation (faster start, slower decode on GPUs).
        dtype: the engine's dtype (None: the policy's parameter dtype).
        distributed: the run is several torchrun processes (``external_launcher``).

    Raises:
        ConfigError: see the module docstring.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        train_params: SamplingParams,
        val_params: SamplingParams,
        *,
        max_batch_size: int = 1024,
        seed: int = 0,
        apply_chat_template: bool = False,
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.3,
        kv_cache_memory_bytes: int | None = None,
        enforce_eager: bool = True,
        dtype: str | None = None,
        distributed: bool = False,
    ) -> None:
        super().__init__(
            model,
            tokenizer,
            train_params,
            val_params,
            max_batch_size=max_batch_size,
            seed=seed,
            apply_chat_template=apply_chat_template,
        )
        vllm = import_vllm()
        from vllm.platforms import current_platform

        on_cpu = current_platform.is_cpu()
        model = model.get_base_model() if hasattr(model, "get_base_model") else model  # LoRA: the base's config
        arch = check_model(vllm, model, on_cpu)
        if kv_cache_memory_bytes is None and on_cpu:
            kv_cache_memory_bytes = CPU_KV_CACHE_BYTES
        dtype = dtype or str(next(model.parameters()).dtype).removeprefix("torch.")
        self.max_model_len = max_model_len or context_length(model)
        if max_model_len is None and kv_cache_memory_bytes is not None:  # the context its KV-cache budget holds
            fits = kv_cache_context(model.config, int(kv_cache_memory_bytes), getattr(torch, dtype).itemsize)
            self.max_model_len = min(self.max_model_len or fits, fits)
        memory = (
            {"kv_cache_memory_bytes": int(kv_cache_memory_bytes)}
            if kv_cache_memory_bytes is not None
            else {"gpu_memory_utilization": gpu_memory_utilization}
        )
        self._config_dir = tempfile.TemporaryDirectory(prefix="rllm_torch_vllm_")
        config = model.config.__class__.from_dict(model.config.to_dict())
        config.architectures = [arch]
        config.save_pretrained(self._config_dir.name)
        # the engine in this process (its weights are then this process's tensors to copy into)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        set_num_threads = torch.set_num_threads  # vLLM's CPU worker replaces it process-wide
        # vLLM's set-up warnings are about what this engine does on purpose (no tokenizer, the
        # thread count it leaves alone): kept off the console; errors still show, and raise
        with global_rng_kept(), logging_below_error(), kv_cache_errors_named(self.max_model_len):
            self.llm = vllm.LLM(
                model=self._config_dir.name,
                load_format="dummy",
                skip_tokenizer_init=True,
                dtype=dtype,
                seed=seed,
                max_model_len=self.max_model_len,
                enforce_eager=enforce_eager,
                tensor_parallel_size=1,
                distributed_executor_backend="external_launcher" if distributed else "uni",
                enable_prefix_caching=True,
                generation_config="vllm",
                logprobs_mode="processed_logprobs",
                disable_log_stats=True,
                **memory,
            )
        torch.set_num_threads = set_num_threads
        quiet_logs()
        self._stale = True  # dummy weights until the first sync
        self.syncs = 0
        self.published_weights_only = False  # async training's sampler: only the staged (published) weights

    def _generator_device(self) -> torch.device:
        return torch.device("cpu")  # it draws the requests' seeds, on the host

    def mark_stale(self) -> None:
        """The policy's weights changed (an optimizer step): the next sampling phase syncs first."""
        self._stale = True

    def sync_weights(self) -> None:
        """Copy the policy's weights into the engine if they changed since the last sync (every
        rank must call together under FSDP2: each parameter is gathered on its own). As async
        training's sampler (:attr:`published_weights_only`): take the staged weights, if any
        (the policy may be mid-update in the trainer's thread)."""
        if self._staged is not None or self.published_weights_only:
            super().sync_weights()
        elif self._stale:
            self._load_weights(full_weights(self.model))

    def _load_weights(self, weights) -> None:
        """Load ``(name, tensor)`` pairs (a dict's too) into the engine (vLLM's ``reload_weights``)."""
        pairs = iter(weights.items()) if isinstance(weights, dict) else weights
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": pairs})
        self.llm.reset_prefix_cache()
        self._stale, self.syncs = False, self.syncs + 1

    def _sample(self, prompts: list[str]) -> list[ModelOutput]:
        params = self.params
        prompt_ids = encode_prompts(self.tokenizer, prompts, apply_chat_template=self.apply_chat_template)
        check_max_model_len(max(map(len, prompt_ids)), params.max_new_tokens, self.max_model_len)
        responses, logprobs, reasons = sample_with_vllm(
            self.llm,
            prompt_ids,
            max_new_tokens=params.max_new_tokens,
            eos_token_id=self.tokenizer.eos_token_id,
            temperature=params.temperature,
            top_p=params.top_p,
            generator=self.generator,
        )
        return model_outputs(self.tokenizer, prompt_ids, responses, logprobs, reasons)

    def shutdown(self) -> None:
        """Release the engine and its temporary config directory."""
        self.llm = None
        self._config_dir.cleanup()
