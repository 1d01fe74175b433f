"""Batched sampling from a causal LM through ``transformers``' ``generate`` (KV cache, sampling
with temperature and top-p), recording each sampled token's log-prob as generation goes.

Prompts are left padded so every row's next token is at the last column; ``generate`` counts
position ids over real tokens, so padding does not shift positions, and the trainer's scoring
forward (:mod:`~rllm_torch.backends.torch_backend.forward`) does the same for right-padded rows.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor
from transformers import DynamicCache, GenerationConfig, LogitsProcessor, LogitsProcessorList

from rllm_torch.backends.torch_backend.forward import causal_lm
from rllm_torch.trainer.runtime.stop import stop_point

__all__ = [
    "sample_completions",
    "sample_next_tokens",
    "default_rollout_batch_size",
    "cache_keyword",
    "ROLLOUT_LOGITS_BYTES",
    "MAX_ROLLOUT_BATCH_SIZE",
]

ROLLOUT_LOGITS_BYTES = 256 * 2**20
"""One decoding step's float32 logits of a ``generate`` call by default: 256 MiB."""

MAX_ROLLOUT_BATCH_SIZE = 1024
"""Prompts per ``generate`` call at most by default, whatever the vocabulary (a small one's
logits would allow millions)."""


def default_rollout_batch_size(vocab_size: int) -> int:
    """Prompts per ``generate`` call (``backend.rollout_batch_size=null``) whose step logits take
    :data:`ROLLOUT_LOGITS_BYTES` in float32, at most :data:`MAX_ROLLOUT_BATCH_SIZE`: the
    sampling memory then does not grow with the batch (more calls instead). The KV cache grows
    with the rows and the tokens too: set ``backend.rollout_batch_size`` for long responses of a
    large model.

    Examples:
        >>> default_rollout_batch_size(151_936), default_rollout_batch_size(14)
        (441, 1024)
    """
    return max(1, min(MAX_ROLLOUT_BATCH_SIZE, ROLLOUT_LOGITS_BYTES // (4 * vocab_size)))


class _EndedRowsMaskWarning(logging.Filter):
    """Drops transformers' "We strongly recommend passing in an `attention_mask`" warning, which
    generate's own decode steps raise once a row has ended (its next input is the pad token,
    here also the end token) although generate masks those rows itself: it is about user inputs,
    and would mislead every training run's console."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "strongly recommend passing in an `attention_mask`" not in record.getMessage()


logging.getLogger("transformers.modeling_utils").addFilter(_EndedRowsMaskWarning())


_ROW_CHUNK_ELEMENTS = 2**25  # logits per chunk of rows the sampler works on at once (32M: 128 MiB in float32)


def sample_next_tokens(
    logits: Tensor, *, temperature: float, top_p: float = 1.0, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """One token per row from ``softmax(logits / temperature)`` cut to its nucleus ``top_p``, and
    its log-prob before the cut.

    Sampling is by inverse CDF: one uniform draw per row against the float64 cumulative sum of
    the (nucleus') probabilities, so a row costs one draw, not one per vocabulary entry (what
    ``torch.multinomial`` spends on CPU: half of ``generate``'s time at a 151,936-token vocabulary).
    ``temperature=0`` is greedy (the first maximum; log-prob at temperature 1). Rows are taken in
    chunks of :data:`_ROW_CHUNK_ELEMENTS` logits.

    Args:
        logits: ``[N, V]`` raw logits of one step, any float dtype and device.
        temperature: ``τ >= 0``. top_p: in ``(0, 1]``; the smallest set of most likely tokens
            whose probability reaches ``top_p`` (at least one), as nucleus sampling defines it.
        generator: the draws' generator, on ``logits``' device (None: torch's global one).

    Returns:
        ``(tokens, log_probs)``: ``[N]`` int64 and ``[N]`` float32 ``log softmax(logits / τ)``
        of each token (greedy: at ``τ = 1``).

    Source: Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration" (nucleus
    sampling), arXiv:1904.09751.
    """
    num_rows, vocab = logits.shape
    tokens_N = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    logp_N = torch.empty(num_rows, dtype=torch.float32, device=logits.device)
    rows = max(1, _ROW_CHUNK_ELEMENTS // max(vocab, 1))
    for start in range(0, num_rows, rows):
        chunk = slice(start, min(start + rows, num_rows))
        logp_cV = logits[chunk].float()
        if temperature > 0 and temperature != 1.0:
            logp_cV = logp_cV / temperature
        logp_cV = logp_cV.log_softmax(-1)
        if temperature > 0:
            tokens_N[chunk] = _inverse_cdf(logp_cV, top_p, generator)
        else:
            tokens_N[chunk] = logp_cV.argmax(-1)
        logp_N[chunk] = logp_cV.gather(1, tokens_N[chunk, None]).squeeze(1)
    return tokens_N, logp_N


def _inverse_cdf(logp_cV: Tensor, top_p: float, generator: torch.Generator | None) -> Tensor:
    """``[c]`` tokens drawn by inverse CDF from ``exp(logp_cV)`` (cut to the nucleus ``top_p``)."""
    uniform_c1 = torch.rand((logp_cV.shape[0], 1), generator=generator, device=logp_cV.device, dtype=torch.float64)
    last = logp_cV.shape[1] - 1
    if top_p >= 1.0:
        cdf_cV = logp_cV.double().exp_().cumsum_(-1)
        return torch.searchsorted(cdf_cV, uniform_c1 * cdf_cV[:, -1:], right=True).squeeze(1).clamp_(max=last)
    probs_cV, order_cV = logp_cV.double().exp_().sort(-1, descending=True)
    in_nucleus_cV = probs_cV.cumsum(-1).sub_(probs_cV) < top_p  # the mass before a token is below top_p
    cdf_cV = probs_cV.mul_(in_nucleus_cV).cumsum_(-1)
    rank_c1 = torch.searchsorted(cdf_cV, uniform_c1 * cdf_cV[:, -1:], right=True).clamp_(max=last)
    return order_cV.gather(1, rank_c1).squeeze(1)


class _Sampler(LogitsProcessor):
    """Samples each step's tokens itself (:func:`sample_next_tokens`, with the rollout's own
    generator) and records their log-probs; ``generate`` runs greedy over the one-hot scores it
    returns, so it takes exactly the sampled token. ``generate`` calls a custom processor with
    the step's raw float32 logits, before any warper of its own."""

    def __init__(self, temperature: float, top_p: float, generator: torch.Generator | None) -> None:
        self.temperature, self.top_p, self.generator = temperature, top_p, generator
        self.logp: list[Tensor] = []

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        stop_point()  # a SIGTERM: sampling is abandoned between two tokens (trainer/runtime/stop.py)
        tokens_N, logp_N = sample_next_tokens(
            scores, temperature=self.temperature, top_p=self.top_p, generator=self.generator
        )
        self.logp.append(logp_N)
        # generate's own float32 copy of the step's logits, overwritten: only the drawn token is finite
        return scores.fill_(float("-inf")).scatter_(1, tokens_N[:, None], 0.0)

    def log_probs(self, num_rows: int, device: torch.device) -> Tensor:
        """``[N, S]`` log-probs of the ``S`` sampled steps."""
        if not self.logp:
            return torch.zeros((num_rows, 0), device=device)
        return torch.stack(self.logp, 1)


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


def cache_keyword(model: torch.nn.Module) -> str:
    """The name a model's ``forward`` (and ``generate``) takes a KV cache by: ``cache`` from
    ``transformers`` 5.2x on, ``past_key_values`` before (still accepted there, with a warning)."""
    return "cache" if "cache" in inspect.signature(causal_lm(model).forward).parameters else "past_key_values"


def _shared_prompt_cache(
    model: torch.nn.Module, prompts: list[list[int]], pad_token_id: int, device: torch.device
) -> tuple[Tensor, Tensor, DynamicCache] | None:
    """The rows' left-padded ids and mask, and a KV cache of every column but the last, computed
    once per distinct prompt and repeated for its rows (a step's ``n`` rollouts of one prompt share
    its prefill: ``n`` times fewer prompt tokens through the model). None when no prompt repeats.

    The prefill runs at the positions ``generate`` gives the same columns (counted over real tokens,
    left padding at position 1, masked), so ``generate`` continues from the cache as from its own.
    """
    distinct: dict[tuple[int, ...], int] = {}
    row_of_N = torch.tensor([distinct.setdefault(tuple(p), len(distinct)) for p in prompts], device=device)
    if len(distinct) == len(prompts) or max(map(len, prompts)) < 2:
        return None
    ids_UT, mask_UT = _left_padded([list(p) for p in distinct], pad_token_id, device)
    positions_UT = (mask_UT.cumsum(-1) - 1).masked_fill_(mask_UT == 0, 1)
    cache = DynamicCache()
    model(
        input_ids=ids_UT[:, :-1],
        attention_mask=mask_UT[:, :-1],
        position_ids=positions_UT[:, :-1],
        use_cache=True,
        logits_to_keep=1,
        **{cache_keyword(model): cache},
    )
    cache.reorder_cache(row_of_N)  # each row's prompt's keys and values (index_select over the distinct ones)
    return ids_UT[row_of_N], mask_UT[row_of_N], cache


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
    share_prompts: bool = False,
    static_cache: bool | None = None,
) -> tuple[list[list[int]], list[list[float]], list[str]]:
    """Sample one completion per prompt, all prompts in one left-padded ``generate`` call.

    ``model.generate`` with the KV cache, ``eos_token_id`` and ``pad_token_id``, nothing from the
    model's own ``generation_config``; each step's token is drawn by :func:`sample_next_tokens`
    (temperature, nucleus ``top_p``, no top-k) from ``generator`` (each rank's own, saved in
    checkpoints, so a resumed run samples what an uninterrupted one would), and its log-prob
    recorded as generation goes: one step's ``[N, V]`` logits are held, not ``max_new_tokens`` of
    them. A row stops after it samples ``eos_token_id`` (kept in its response) or after
    ``max_new_tokens`` tokens. ``temperature=0`` is greedy decoding.

    With ``share_prompts`` (and the dynamic cache of short responses), prompts that repeat (a step's
    ``n`` rollouts of each task) are prefilled once and their keys and values repeated for each row
    (:func:`_shared_prompt_cache`; ``benchmarks/bench_sampling.py`` measures it): the same
    distribution, the logits equal to float32 rounding (another batch shape). ``static_cache``:
    ``generate``'s preallocated cache (None: from 128 new tokens on; prompts are then not shared).

    Returns:
        ``(response_ids, logprobs, finish_reasons)`` per prompt: the sampled ids, their
        log-probs under ``softmax(logits / temperature)`` before the top-p cut (the
        distribution the trainer's loss uses; greedy: temperature 1), and ``"stop"`` or ``"length"``.
    """
    device = next(model.parameters()).device
    static = max_new_tokens >= 128 if static_cache is None else static_cache
    shared = None if static or not share_prompts else _shared_prompt_cache(model, prompts, pad_token_id, device)
    ids_NT, mask_NT, cache = shared if shared is not None else (*_left_padded(prompts, pad_token_id, device), None)
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,  # greedy over the one-hot scores of the sampler's own draw
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        # a preallocated cache for long responses: the dynamic cache's per-step concatenation
        # cost 3.3 s against 1.9 s for 32 x 256 new tokens (default model, CPU), while for fewer
        # tokens the static cache's set-up costs more than it saves (64 tokens: 0.56 s vs 0.48 s)
        cache_implementation="static" if static else None,
    )
    sampler = _Sampler(temperature, top_p, generator)
    with _own_generation_defaults(model):
        sequences = model.generate(
            input_ids=ids_NT,
            attention_mask=mask_NT,
            generation_config=config,
            logits_processor=LogitsProcessorList([sampler]),
            **({cache_keyword(model): cache} if cache is not None else {}),
        )
    new_NS = sequences[:, ids_NT.shape[1] :]
    logp_NS = sampler.log_probs(new_NS.shape[0], new_NS.device)
    ended_NS = (new_NS == eos_token_id).long().cumsum(1)
    kept_NS = (ended_NS - (new_NS == eos_token_id).long()) == 0  # up to and including the first eos
    lengths = kept_NS.sum(1).tolist()
    responses = [row[:n] for row, n in zip(new_NS.cpu().tolist(), lengths, strict=True)]
    logprobs = [row[:n] for row, n in zip(logp_NS.cpu().tolist(), lengths, strict=True)]
    reasons = ["stop" if r and r[-1] == eos_token_id else "length" for r in responses]
    return responses, logprobs, reasons
