"""Batched sampling from a causal LM and per-token log-probs (pure functions of tensors).

Prompts are left padded so every row's next token is at the last column; position ids are
counted over real tokens, so padding does not shift positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["sample_completions", "token_log_probs", "top_p_filter"]


def top_p_filter(logits_NV: Tensor, top_p: float) -> Tensor:
    """Logits with every token outside the smallest set of cumulative probability ``>= top_p``
    set to ``-inf`` (nucleus sampling, Holtzman et al. 2019, arXiv:1904.09751). ``top_p=1``: unchanged."""
    if top_p >= 1.0:
        return logits_NV
    sorted_NV, order_NV = torch.sort(logits_NV, descending=True, dim=-1)
    cum_NV = sorted_NV.softmax(-1).cumsum(-1)
    drop_NV = cum_NV - sorted_NV.softmax(-1) >= top_p  # keep the token that crosses top_p
    sorted_NV = sorted_NV.masked_fill(drop_NV, float("-inf"))
    return torch.empty_like(logits_NV).scatter_(-1, order_NV, sorted_NV)


def _forward_logits(model: torch.nn.Module, input_ids_NT: Tensor, attention_mask_NT: Tensor) -> Tensor:
    position_ids_NT = (attention_mask_NT.cumsum(-1) - 1).clamp(min=0)
    return model(
        input_ids=input_ids_NT, attention_mask=attention_mask_NT, position_ids=position_ids_NT, use_cache=False
    ).logits


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
    """Sample one completion per prompt, all prompts in one batch.

    Each step runs the model on the whole sequence so far (no KV cache: responses are short).
    A row stops after it samples ``eos_token_id`` (kept in its response) or after
    ``max_new_tokens`` tokens. ``temperature=0`` is greedy decoding.

    Returns:
        ``(response_ids, logprobs, finish_reasons)`` per prompt: the sampled ids, their
        log-probs under ``softmax(logits / temperature)`` before the top-p cut (the
        distribution the trainer's loss uses; greedy: temperature 1), and ``"stop"`` or ``"length"``.
    """
    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    ids_NT = torch.full((len(prompts), width), pad_token_id, dtype=torch.int64)
    mask_NT = torch.zeros((len(prompts), width), dtype=torch.int64)
    for i, p in enumerate(prompts):
        ids_NT[i, width - len(p) :], mask_NT[i, width - len(p) :] = torch.tensor(p, dtype=torch.int64), 1
    ids_NT, mask_NT = ids_NT.to(device), mask_NT.to(device)
    alive_N = torch.ones(len(prompts), dtype=torch.bool, device=device)
    new_ids, new_logp, new_alive = [], [], []
    for _ in range(max_new_tokens):
        logits_NV = _forward_logits(model, ids_NT, mask_NT)[:, -1].float()
        scaled_NV = logits_NV / (temperature if temperature > 0 else 1.0)
        if temperature > 0:
            probs_NV = top_p_filter(scaled_NV, top_p).softmax(-1)
            token_N = torch.multinomial(probs_NV, 1, generator=generator).squeeze(1)
        else:
            token_N = scaled_NV.argmax(-1)
        logp_N = scaled_NV.log_softmax(-1).gather(1, token_N[:, None]).squeeze(1)
        token_N = torch.where(alive_N, token_N, torch.full_like(token_N, pad_token_id))
        new_ids.append(token_N), new_logp.append(logp_N), new_alive.append(alive_N)
        ids_NT = torch.cat([ids_NT, token_N[:, None]], 1)
        mask_NT = torch.cat([mask_NT, alive_N[:, None].long()], 1)
        alive_N = alive_N & (token_N != eos_token_id)
        if not bool(alive_N.any()):
            break
    ids_NS, logp_NS, kept_NS = (torch.stack(x, 1).cpu() for x in (new_ids, new_logp, new_alive))
    lengths = kept_NS.sum(1).tolist()
    responses = [row[:n] for row, n in zip(ids_NS.tolist(), lengths, strict=True)]
    logprobs = [row[:n] for row, n in zip(logp_NS.tolist(), lengths, strict=True)]
    reasons = ["stop" if r and r[-1] == eos_token_id else "length" for r in responses]
    return responses, logprobs, reasons


def token_log_probs(
    model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, *, temperature: float = 1.0
) -> Tensor:
    """``[N, T]`` float32 log-prob of each token given the tokens before it, under
    ``softmax(logits / temperature)``; column 0 (no context) is 0. Right-padded rows.

    Args:
        input_ids: ``[N, T]`` int64. attention_mask: ``[N, T]``, 1 on real tokens.
    """
    logits_NTV = _forward_logits(model, input_ids, attention_mask)[:, :-1].float()
    if temperature > 0:
        logits_NTV = logits_NTV / temperature
    logp_NT = torch.gather(F.log_softmax(logits_NTV, -1), 2, input_ids[:, 1:, None]).squeeze(2)
    return F.pad(logp_NT, (1, 0))
