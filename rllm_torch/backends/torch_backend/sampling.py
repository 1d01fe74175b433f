"""Batched sampling from a causal LM through ``transformers``' ``generate`` (KV cache, sampling
with temperature and top-p), recording each sampled token's log-prob as generation goes.

Prompts are left padded so every row's next token is at the last column; ``generate`` counts
position ids over real tokens, so padding does not shift positions, and the trainer's scoring
forward (:mod:`~rllm_torch.backends.torch_backend.forward`) does the same for right-padded rows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from rllm_torch.backends.torch_backend.forward import causal_lm

__all__ = ["sample_completions"]


class _EndedRowsMaskWarning(logging.Filter):
    """Drops transformers' "We strongly recommend passing in an `attention_mask`" warning, which
    generate's own decode steps raise once a row has ended (its next input is the pad token,
    here also the end token) although generate masks those rows itself: it is about user inputs,
    and would mislead every training run's console."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "strongly recommend passing in an `attention_mask`" not in record.getMessage()


logging.getLogger("transformers.modeling_utils").addFilter(_EndedRowsMaskWarning())


class _SampledLogProbs(LogitsProcessor):
    """Records ``log softmax(z / τ)`` of every sampled token from the raw logits ``z`` of its step.

    ``generate`` calls its processors with each step's raw float32 logits before the
    temperature and top-p warpers (a custom processor runs first); the token sampled from them is
    known at the next call (the last column of ``input_ids``), or, for the last step, from the
    returned sequences (:meth:`finish`). Only one step's logits are held, never all steps'."""

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature
        self.logp: list[Tensor] = []
        self._logits_NV: Tensor | None = None

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        if self._logits_NV is not None:
            self._take(input_ids[:, -1])
        self._logits_NV = scores
        return scores

    def _take(self, tokens_N: Tensor) -> None:
        scaled_NV = self._logits_NV.float()
        if self.temperature != 1.0:
            scaled_NV = scaled_NV / self.temperature
        picked_N = scaled_NV.gather(1, tokens_N[:, None]).squeeze(1)
        self.logp.append(picked_N - torch.logsumexp(scaled_NV, -1))

    def finish(self, last_tokens_N: Tensor) -> Tensor:
        """``[N, S]`` log-probs of the ``S`` sampled steps, given the last step's tokens."""
        if self._logits_NV is not None:
            self._take(last_tokens_N)
            self._logits_NV = None
        return torch.stack(self.logp, 1) if self.logp else last_tokens_N.new_zeros((last_tokens_N.shape[0], 0)).float()


@contextmanager
def _own_generation_defaults(model: torch.nn.Module) -> Iterator[None]:
    """Inside, ``model.generation_config`` is the library default, so a checkpoint's
    ``generation_config.json`` (Qwen2.5-Instruct's ``repetition_penalty=1.05``, ``top_k=20``, ...)
    cannot change the sampling distribution behind the sampler's back: it is what
    ``rllm.rollout.*`` says, the one the log-probs are of."""
    lm = causal_lm(model)
    saved = lm.generation_config
    lm.generation_config = GenerationConfig()
    try:
        yield
    finally:
        lm.generation_config = saved


def _left_padded(prompts: list[list[int]], pad_token_id: int, device: torch.device) -> tuple[Tensor, Tensor]:
    width = max(len(p) for p in prompts)
    ids_NT = torch.full((len(prompts), width), pad_token_id, dtype=torch.int64)
    mask_NT = torch.zeros((len(prompts), width), dtype=torch.int64)
    for i, p in enumerate(prompts):
        ids_NT[i, width - len(p) :], mask_NT[i, width - len(p) :] = torch.tensor(p, dtype=torch.int64), 1
    return ids_NT.to(device), mask_NT.to(device)


@torch.no_grad()
def sample_completions(
    model: torch.nn.Module,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    eos_token_id: int,
    pad_token_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[list[list[int]], list[list[float]], list[str]]:
    """Sample one completion per prompt, all prompts in one left-padded ``generate`` call.

    ``model.generate`` with the KV cache, ``do_sample`` with ``temperature`` and nucleus
    ``top_p`` (``top_k`` off, nothing else from the model's ``generation_config``),
    ``eos_token_id`` and ``pad_token_id``. A row stops after it samples ``eos_token_id`` (kept in
    its response) or after ``max_new_tokens`` tokens. ``temperature=0`` is greedy decoding.
    Each sampled token's log-prob is taken from its step's logits as generation goes
    (:class:`_SampledLogProbs`): one ``[N, V]`` step is held, not ``max_new_tokens`` of them.

    ``generate`` samples from torch's global generator; to keep each rank's own ``generator``
    (saved in checkpoints, so a resumed run samples what an uninterrupted one would), every
    call draws a seed from ``generator`` and samples under it inside ``torch.random.fork_rng``,
    leaving the global state untouched.

    Returns:
        ``(response_ids, logprobs, finish_reasons)`` per prompt: the sampled ids, their
        log-probs under ``softmax(logits / temperature)`` before the top-p cut (the
        distribution the trainer's loss uses; greedy: temperature 1), and ``"stop"`` or ``"length"``.
    """
    device = next(model.parameters()).device
    ids_NT, mask_NT = _left_padded(prompts, pad_token_id, device)
    sampling = temperature > 0
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=sampling,
        temperature=temperature if sampling else None,
        top_p=top_p if sampling else None,
        top_k=0 if sampling else None,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        # a preallocated cache for long responses: the dynamic cache's per-step concatenation
        # cost 3.3 s against 1.9 s for 32 x 256 new tokens (default model, CPU), while for fewer
        # tokens the static cache's set-up costs more than it saves (64 tokens: 0.56 s vs 0.48 s)
        cache_implementation="static" if max_new_tokens >= 128 else None,
    )
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device if generator else "cpu"))
    recorder = _SampledLogProbs(temperature if sampling else 1.0)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), _own_generation_defaults(model):
        torch.manual_seed(seed)
        sequences = model.generate(
            input_ids=ids_NT,
            attention_mask=mask_NT,
            generation_config=config,
            logits_processor=LogitsProcessorList([recorder]),
        )
    new_NS = sequences[:, ids_NT.shape[1] :]
    logp_NS = recorder.finish(new_NS[:, -1])
    ended_NS = (new_NS == eos_token_id).long().cumsum(1)
    kept_NS = (ended_NS - (new_NS == eos_token_id).long()) == 0  # up to and including the first eos
    lengths = kept_NS.sum(1).tolist()
    responses = [row[:n] for row, n in zip(new_NS.cpu().tolist(), lengths, strict=True)]
    logprobs = [row[:n] for row, n in zip(logp_NS.cpu().tolist(), lengths, strict=True)]
    reasons = ["stop" if r and r[-1] == eos_token_id else "length" for r in responses]
    return responses, logprobs, reasons
