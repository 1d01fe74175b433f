"""The policy's scoring forward: per-token log-probs (and entropies) of a ``transformers`` causal
LM over right-padded rows, with the head applied in chunks (:mod:`.logprobs`), and
:class:`PolicyScorer`, the module the trainer's passes go through (and DDP / FSDP2 wrap).

The model's body (``model.base_model``: embeddings, blocks, final norm) runs on the rows cut to
their longest real row; only the positions asked for (the trained response tokens) reach the
head, so neither the prompt's nor the padding's ``[T, V]`` logits are ever formed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rllm_torch.backends.torch_backend.logprobs import chunked_token_log_probs
from rllm_torch.backends.torch_backend.model import compute_autocast
from rllm_torch.backends.torch_backend.shared_prompts import SHARED_ATTENTION, pack_rows
from rllm_torch.core.errors import ConfigError

__all__ = [
    "TokenScores",
    "causal_lm",
    "token_log_probs",
    "token_scores",
    "check_linear_head",
    "check_shared_prompts",
    "on_real_columns",
    "PolicyScorer",
]


class TokenScores(NamedTuple):
    """``log_probs``, ``entropy`` and ``sum_pi_squared`` (``Σ_v π_v²`` of each position's
    distribution): ``[N, T]`` float32 (the last two None unless asked for); column ``t`` scores
    token ``t`` given the tokens before it; 0 where not computed."""

    log_probs: Tensor
    entropy: Tensor | None
    sum_pi_squared: Tensor | None = None


def causal_lm(model: nn.Module) -> nn.Module:
    """The ``transformers`` causal LM inside ``model`` (a PEFT model's base model, else ``model``)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def token_scores(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    positions: Tensor | None = None,
    temperature: float = 1.0,
    chunk_tokens: int | None = None,
    with_entropy: bool = False,
    with_sum_pi_squared: bool = False,
    share_prompts: bool = False,
) -> TokenScores:
    """Log-prob of each token given the tokens before it under ``softmax(logits / temperature)``,
    and the entropy of that distribution, at ``positions``.

    With ``share_prompts`` (and ``positions``), rows that begin with the same prompt run it once,
    packed with their continuations (:mod:`~rllm_torch.backends.torch_backend.shared_prompts`);
    the values and gradients are those of the rows, to float32 rounding (another summation order).

    Args:
        model: a ``transformers`` causal LM with a linear head (or a PEFT model around one).
        input_ids: ``[N, T]`` int64, right padded. attention_mask: ``[N, T]``, 1 on real tokens.
        positions: ``[N, T]`` bool or 0/1, the tokens to score (None: every real token); column 0
            has no context and is never scored.
        temperature: ``τ``; ``0`` (greedy sampling) scores at ``τ = 1``.
        chunk_tokens: tokens per head chunk (None: 128 MiB of float32 logits).
        with_entropy: also compute the entropy (nats).
        with_sum_pi_squared: also ``Σ_v π_v²`` (no gradient).

    Returns:
        :class:`TokenScores` on ``input_ids``' device, 0 outside ``positions``.
    """
    lm = causal_lm(model)
    wanted = attention_mask if positions is None else positions
    want_NT = wanted[:, 1:].bool() & attention_mask[:, 1:].bool()  # hidden t - 1 predicts token t
    attention = getattr(lm.config, "_attn_implementation", None)
    packed = (
        pack_rows(input_ids, attention_mask, positions, eager=attention == "eager")
        if share_prompts and positions is not None and attention in SHARED_ATTENTION
        else None
    )
    if packed is not None:  # each distinct prompt once, its rollouts' continuations after it
        hidden_GLH = lm.base_model(
            input_ids=packed.input_ids,
            attention_mask=packed.attention_mask,
            position_ids=packed.position_ids,
            use_cache=False,
        ).last_hidden_state
        hidden_MH = hidden_GLH[packed.rows, packed.columns]
    else:
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        hidden_NTH = lm.base_model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state
        hidden_MH = hidden_NTH[:, :-1][want_NT]
    head = lm.get_output_embeddings()
    scored = chunked_token_log_probs(
        hidden_MH,
        head.weight,
        input_ids[:, 1:][want_NT],
        bias=head.bias,
        temperature=temperature if temperature > 0 else 1.0,
        chunk_tokens=chunk_tokens,
        with_entropy=with_entropy,
        with_sum_pi_squared=with_sum_pi_squared,
    )
    logp_M, entropy_M = scored[0], scored[1]
    sum_sq_M = scored[2] if with_sum_pi_squared else None

    def spread(values_M: Tensor) -> Tensor:
        return F.pad(values_M.new_zeros(want_NT.shape).masked_scatter(want_NT, values_M), (1, 0))

    return TokenScores(
        spread(logp_M),
        spread(entropy_M) if entropy_M is not None else None,
        spread(sum_sq_M) if sum_sq_M is not None else None,
    )


def token_log_probs(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor, *, temperature: float = 1.0, **options
) -> Tensor:
    """``[N, T]`` float32 log-prob of each token given the tokens before it (column 0 and
    padding: 0); :func:`token_scores` without the entropy (same ``options``)."""
    return token_scores(model, input_ids, attention_mask, temperature=temperature, **options).log_probs


def check_linear_head(model: nn.Module) -> None:
    """Check on a few tokens that the model's logits are its linear head over its last hidden
    state, which the chunked log-probs assume (e.g. Gemma 2's logit soft-capping or Cohere's
    logit scale are not).

    Raises:
        ConfigError: naming the model class and what differs.
    """
    lm = causal_lm(model)
    head = lm.get_output_embeddings()
    if not isinstance(head, nn.Linear):
        raise ConfigError(
            f"{type(lm).__name__}'s output head is a {type(head).__name__}, not a linear layer; the trainer computes "
            "log-probs from the head's weight in chunks (LoRA on lm_head is not supported: drop it from "
            "model.lora.target_modules)."
        )
    device = head.weight.device
    ids = torch.arange(2, 6, device=device).remainder(head.weight.shape[0])[None]
    mask = torch.ones_like(ids)
    was_training = lm.training
    lm.eval()
    try:
        with torch.no_grad():
            full = lm(input_ids=ids, attention_mask=mask, use_cache=False).logits.float().log_softmax(-1)
            mine = token_log_probs(lm, ids, mask)
    finally:
        lm.train(was_training)
    expected = full[0, :-1].gather(1, ids[0, 1:, None]).squeeze(1)
    if not torch.allclose(mine[0, 1:], expected, atol=1e-3, rtol=1e-3):
        raise ConfigError(
            f"{type(lm).__name__}'s logits are not its linear head over the last hidden state (logit scaling or "
            "soft-capping?); the chunked log-probs of the torch backend do not support this architecture."
        )


def check_shared_prompts(model: nn.Module) -> str | None:
    """Whether ``model`` scores rows packed by shared prompt (:func:`token_scores` with
    ``share_prompts``) as it scores them one by one: None when it does (two rows with a common
    prompt, compared in eval mode to 1e-4), else the reason it does not (an attention
    implementation that builds its own mask, or another result)."""
    lm = causal_lm(model)
    attention = getattr(lm.config, "_attn_implementation", None)
    if attention not in SHARED_ATTENTION:
        return f"{type(lm).__name__} runs {attention} attention, which takes no block mask as given"
    device = lm.get_output_embeddings().weight.device
    vocab = lm.get_output_embeddings().weight.shape[0]
    ids = torch.tensor([[2, 3, 4, 5, 6, 0], [2, 3, 4, 7, 8, 9]], device=device).remainder(vocab)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1] * 6], device=device)
    positions = torch.tensor([[0, 0, 0, 1, 1, 0], [0, 0, 0, 1, 1, 1]], device=device)
    was_training = lm.training
    lm.eval()
    try:
        with torch.no_grad():
            rows = token_log_probs(lm, ids, mask, positions=positions)
            packed = token_log_probs(lm, ids, mask, positions=positions, share_prompts=True)
    finally:
        lm.train(was_training)
    if not torch.allclose(rows, packed, atol=1e-4, rtol=1e-4):
        return f"{type(lm).__name__} scores rows packed by prompt differently from rows one by one"
    return None


def _real_width(attention_mask: Tensor) -> int:
    """Columns up to the longest real row of right-padded rows (at least 1; one host sync)."""
    return max(int(attention_mask.sum(-1).max()), 1) if attention_mask.shape[0] else attention_mask.shape[1]


def on_real_columns(forward: Callable[[Tensor, Tensor], Tensor], input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """``forward(input_ids, attention_mask)`` on the columns up to the longest real row of
    right-padded ``[R, T]`` rows, its ``[R, W]`` result padded back with zeros to ``[R, T]``: the
    padding beyond the longest row is never computed. One host sync (the width)."""
    width = _real_width(attention_mask)
    return F.pad(forward(input_ids[:, :width], attention_mask[:, :width]), (0, input_ids.shape[1] - width))


class PolicyScorer(nn.Module):
    """Scores rows with :func:`token_scores`: the module the trainer's forwards go through, and
    what DDP and FSDP2 wrap, so their hooks see the whole pass (the head's chunks included).

    It registers the policy's own submodules under their own names, so its ``state_dict`` (and
    an FSDP checkpoint's keys) are the policy's; the policy itself is kept unregistered.

    Args:
        policy: the causal LM (or a PEFT model).
        temperature: the sampling temperature the log-probs are taken at.
        chunk_tokens: tokens per head chunk (None: automatic).
        autocast_dtype: run the forward under ``torch.autocast`` in this dtype (None: off).
        share_prompts: rows that begin with the same prompt run it once (:func:`token_scores`).
    """

    def __init__(
        self,
        policy: nn.Module,
        *,
        temperature: float = 1.0,
        chunk_tokens: int | None = None,
        autocast_dtype: torch.dtype | None = None,
        share_prompts: bool = False,
    ) -> None:
        super().__init__()
        if any(True for _ in policy.named_parameters(recurse=False)):
            raise ConfigError(f"{type(policy).__name__} holds parameters outside its submodules; it cannot be scored.")
        for name, child in policy.named_children():
            self.add_module(name, child)
        object.__setattr__(self, "policy", policy)
        self.temperature, self.chunk_tokens, self.autocast_dtype = temperature, chunk_tokens, autocast_dtype
        self.share_prompts = share_prompts

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        positions: Tensor | None = None,
        with_entropy: bool = False,
        with_sum_pi_squared: bool = False,
    ) -> TokenScores:
        """:func:`token_scores` of the rows, computed up to the longest real row (one host sync)
        and padded back with zeros to ``T`` columns."""
        width = _real_width(attention_mask)
        cut = slice(None, width)
        with compute_autocast(input_ids.device, self.autocast_dtype):
            scores = token_scores(
                self.policy,
                input_ids[:, cut],
                attention_mask[:, cut],
                positions=None if positions is None else positions[:, cut],
                temperature=self.temperature,
                chunk_tokens=self.chunk_tokens,
                with_entropy=with_entropy,
                with_sum_pi_squared=with_sum_pi_squared,
                share_prompts=self.share_prompts,
            )
        pad = (0, input_ids.shape[1] - width)
        return TokenScores(*(None if s is None else F.pad(s, pad) for s in scores))
