"""``TorchRolloutEngine``: serves many concurrent ``generate`` calls with one batched sample.

Workflows call ``await engine.generate(prompt)`` concurrently; calls made in the same turn of
the event loop are gathered (:class:`BatchedRolloutEngine`) and sampled together, here by
:func:`sample_completions` (``backend.rollout.engine=hf``; the vLLM engine is
:mod:`~rllm_torch.backends.torch_backend.vllm_rollout`).
"""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from dataclasses import dataclass, replace

import torch
from transformers import PreTrainedTokenizerBase

from rllm_torch.backends.torch_backend.micro_batches import stage_memory
from rllm_torch.backends.torch_backend.model import check_context, compute_autocast, context_length
from rllm_torch.backends.torch_backend.sampling import sample_completions
from rllm_torch.backends.torch_backend.tokenizer import encode_prompts
from rllm_torch.trainer.runtime.stop import StopRequested
from rllm_torch.trainer.workflow import SAMPLED_VERSIONS, ModelOutput, RolloutEngine

__all__ = ["TorchRolloutEngine", "BatchedRolloutEngine", "SamplingParams"]


@dataclass
class SamplingParams:
    """Sampling settings: ``temperature`` (0 = greedy), ``top_p``, ``max_new_tokens``."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 2


def model_outputs(
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: list[list[int]],
    responses: list[list[int]],
    logprobs: list[list[float]],
    reasons: list[str],
) -> list[ModelOutput]:
    """One :class:`ModelOutput` per sampled row, its text decoded without the final end token of
    a ``"stop"`` row (any other special token stays in the text, and fails an exact match)."""
    texts = tokenizer.batch_decode(
        [r[:-1] if f == "stop" else r for r, f in zip(responses, reasons, strict=True)], skip_special_tokens=False
    )
    return [
        ModelOutput(text=t, prompt_ids=p, completion_ids=r, logprobs=lp, finish_reason=f)
        for t, p, r, lp, f in zip(texts, prompt_ids, responses, logprobs, reasons, strict=True)
    ]


class BatchedRolloutEngine(RolloutEngine):
    """Gathers the ``generate`` calls made in one turn of the event loop and samples them in
    chunks of at most ``max_batch_size`` prompts with :meth:`_sample`; an error reaches every
    waiting call. Subclasses implement :meth:`_sample` (and :meth:`sync_weights` when they hold
    their own copy of the weights).

    Args:
        model, tokenizer: the policy and its tokenizer (eos ends a response).
        train_params, val_params: sampling settings for training and for validation.
        max_batch_size: at most this many prompts per sampling call.
        seed: seeds ``generator``, the rank's sampling generator (saved in checkpoints), on
            :meth:`_generator_device`.
        apply_chat_template: format each prompt as a user message with the tokenizer's chat
            template (:func:`~rllm_torch.backends.torch_backend.tokenizer.encode_prompts`).
        autocast_dtype: sample under ``torch.autocast`` in this dtype (``backend.dtype``; None: off).
        share_prompts: prefill each distinct prompt of a call once (``backend.share_prompts``; the
            ``hf`` engine: :func:`sample_completions`).

    Raises (from ``generate``, to every waiting call):
        ConfigError: a prompt and ``max_new_tokens`` do not fit in the model's context.
        OutOfMemoryError: sampling ran out of memory (naming the settings that lower it).
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
        autocast_dtype: torch.dtype | None = None,
        share_prompts: bool = False,
    ) -> None:
        self.model, self.tokenizer, self.apply_chat_template = model, tokenizer, apply_chat_template
        self.autocast_dtype, self.share_prompts = autocast_dtype, share_prompts
        self.train_params, self.val_params, self.max_batch_size = train_params, val_params, max_batch_size
        self.generator = torch.Generator(device=self._generator_device()).manual_seed(seed)
        self.validation = False
        self.greedy = False  # training's settings at temperature 0: remax's baseline rollouts
        self.version: int | None = None  # the policy version of the weights held (async training's sampler)
        self.sync_in_flight = False  # take staged weights at every sampling call (partial rollouts), not only at syncs
        self._staged: tuple[dict[str, torch.Tensor], int] | None = None
        self._pending: list[tuple[str, asyncio.Future]] = []
        self._flush_scheduled = False

    def _generator_device(self) -> torch.device:
        """Where the sampling generator lives: the model's device."""
        return next(self.model.parameters()).device

    def sync_weights(self) -> None:
        """Bring the sampler's weights up to the policy's (nothing to do when it samples from the
        policy itself), or take the weights :meth:`stage_weights` holds."""
        if self._staged is not None:
            weights, version = self._staged
            self._load_weights(weights)
            self._staged, self.version = None, version

    def stage_weights(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """Hold ``weights`` (the policy's parameters by name, copies the caller gives away) as
        policy version ``version``; the sampler takes them at its next :meth:`sync_weights`, and
        every completion sampled after that records ``version`` (``ModelOutput.info["policy_version"]``
        and the episode's :data:`~rllm_torch.trainer.workflow.SAMPLED_VERSIONS`)."""
        self._staged = (weights, version)

    def _load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Copy ``weights`` into the sampler's own copy of the policy."""
        raise NotImplementedError(f"{type(self).__name__} samples from the policy itself: it takes no staged weights")

    @property
    def params(self) -> SamplingParams:
        """The sampling settings in force: validation's, training's, or training's at temperature 0
        (:attr:`greedy`)."""
        if self.greedy:
            return replace(self.train_params, temperature=0.0)
        return self.val_params if self.validation else self.train_params

    async def generate(self, prompt: str | list[dict]) -> ModelOutput:
        """Sample one completion of ``prompt`` (a string, or a chat: rLLM's messages), batched with
        the other calls of this turn."""
        future = asyncio.get_running_loop().create_future()
        self._pending.append((prompt, future))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        output = await future
        if (versions := SAMPLED_VERSIONS.get()) is not None and "policy_version" in output.info:
            versions.append(output.info["policy_version"])
        return output

    def _flush(self) -> None:
        pending, self._pending, self._flush_scheduled = self._pending, [], False
        if self.sync_in_flight:  # partial rollouts: episodes in flight sample the newest staged weights
            self.sync_weights()
        for start in range(0, len(pending), self.max_batch_size):
            chunk = pending[start : start + self.max_batch_size]
            try:
                outputs = self._sample([prompt for prompt, _ in chunk])
            except (Exception, StopRequested) as exc:  # noqa: BLE001 - every waiting workflow gets the error
                for _, future in chunk:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), output in zip(chunk, outputs, strict=True):
                if self.version is not None:
                    output.info["policy_version"] = output.weight_version = self.version
                if not future.done():
                    future.set_result(output)

    @abstractmethod
    def _sample(self, prompts: list[str]) -> list[ModelOutput]:
        """One completion of each prompt, with :attr:`params`."""


class TorchRolloutEngine(BatchedRolloutEngine):
    """Batched sampling from the training model itself with :func:`sample_completions`
    (arguments: :class:`BatchedRolloutEngine`).

    Raises (from ``generate``, to every waiting call):
        ConfigError: a prompt and ``max_new_tokens`` do not fit in the model's context.
    """

    def _sample(self, prompts: list[str]) -> list[ModelOutput]:
        params = self.params
        prompt_ids = encode_prompts(self.tokenizer, prompts, apply_chat_template=self.apply_chat_template)
        check_context(max(map(len, prompt_ids)), params.max_new_tokens, context_length(self.model))
        was_training = self.model.training
        self.model.eval()
        autocast = compute_autocast(next(self.model.parameters()).device, self.autocast_dtype)
        advice = (
            f"lower backend.rollout_batch_size (now {self.max_batch_size}; prompts per generate call) or "
            f"rllm.rollout.max_new_tokens (now {params.max_new_tokens}), or set backend.dtype=bfloat16"
        )
        try:
            with stage_memory("sampling", advice), autocast:
                responses, logprobs, reasons = sample_completions(
                    self.model,
                    prompt_ids,
                    max_new_tokens=params.max_new_tokens,
                    eos_token_id=self.tokenizer.eos_token_id,
                    pad_token_id=self.tokenizer.pad_token_id,
                    temperature=params.temperature,
                    top_p=params.top_p,
                    generator=self.generator,
                    share_prompts=self.share_prompts,
                )
        finally:
            self.model.train(was_training)
        return model_outputs(self.tokenizer, prompt_ids, responses, logprobs, reasons)

    def _load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Copy ``weights`` into this engine's model (async training's sampler holds its own copy)."""
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, tensor in weights.items():
                params[name].copy_(tensor)
