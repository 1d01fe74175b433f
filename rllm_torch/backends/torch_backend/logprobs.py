"""Log-probs (and entropies) of chosen tokens from a language model's last hidden states,
never holding more than one chunk of logits.

A causal LM's logits are ``z = h Wᵀ (+ b)``, ``[M, V]`` for ``M`` tokens over a vocabulary of
``V`` (151,936 for Qwen2.5): 0.6 GB in float32 for 1,024 tokens, and a full ``log_softmax``
over a batch keeps several such copies for its backward. Here the head is applied ``chunk``
tokens at a time; each chunk's float32 logits give

    log π(y) = z_y / τ − logsumexp(z / τ),      H = −Σ_v p_v log p_v,

and only ``logsumexp`` (``[M]``) is kept for the backward, which recomputes each chunk's logits
(``p = softmax(z / τ)``):

    ∂ log π(y) / ∂z = (onehot(y) − p) / τ,      ∂H / ∂z = −p ⊙ (log p + H) / τ,

then ``∂/∂h = (∂/∂z) W`` and ``∂/∂W += (∂/∂z)ᵀ h``. Peak memory of the head is two or three
``[chunk, V]`` float32 buffers, forward and backward, whatever ``M``.

Precision: the matmul runs in the autocast dtype when autocast is on (bfloat16 under
``backend.dtype=bfloat16``, as the model's own ``lm_head`` would), else in the weights' dtype;
logits, the log-softmax, the entropy and the weight gradient accumulate in float32. The result
equals ``log_softmax(model(...).logits.float() / τ)`` at the chosen tokens to float32 rounding.

The same recompute-in-backward chunking is what verl's fused linear-for-PPO kernels and Liger's
fused linear cross-entropy do; this is a plain-PyTorch version that runs on CPU and GPU.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = ["LOGITS_CHUNK_BYTES", "default_chunk_tokens", "chunked_token_log_probs"]

LOGITS_CHUNK_BYTES = 128 * 2**20
"""Float32 logits held at once by default: ``128 MiB`` (220 tokens of a 151,936-token vocabulary)."""


def default_chunk_tokens(vocab_size: int) -> int:
    """Tokens per chunk whose float32 logits take :data:`LOGITS_CHUNK_BYTES` (at least 1).

    Example:
        >>> default_chunk_tokens(151_936), default_chunk_tokens(14)
        (220, 2396745)
    """
    return max(1, LOGITS_CHUNK_BYTES // (4 * vocab_size))


def _compute_dtype(hidden: Tensor) -> torch.dtype:
    device = hidden.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype


def _accumulation_dtype(compute: torch.dtype) -> torch.dtype:
    return torch.float64 if compute == torch.float64 else torch.float32


def _chunk_logits(h_cH: Tensor, weight_VH: Tensor, bias_V: Tensor | None, temperature: float) -> Tensor:
    """``[c, V]`` logits of a chunk in float32 (float64 for float64 weights), divided by the
    temperature (``weight_VH`` already in the compute dtype)."""
    z_cV = (h_cH.to(weight_VH.dtype) @ weight_VH.T).to(_accumulation_dtype(weight_VH.dtype))
    if bias_V is not None:
        z_cV += bias_V.to(z_cV.dtype)
    return z_cV.div_(temperature) if temperature != 1.0 else z_cV


class _ChunkedTokenLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden_MH: Tensor,
        weight_VH: Tensor,
        bias_V: Tensor | None,
        targets_M: Tensor,
        temperature: float,
        chunk: int,
        with_entropy: bool,
    ) -> tuple[Tensor, Tensor]:
        compute = _compute_dtype(hidden_MH)
        device = hidden_MH.device.type
        num_tokens = hidden_MH.shape[0]
        logp_M = hidden_MH.new_empty(num_tokens, dtype=_accumulation_dtype(compute))
        lse_M = torch.empty_like(logp_M)
        entropy_M = torch.empty_like(logp_M) if with_entropy else logp_M.new_empty(0)
        with torch.autocast(device, enabled=False):
            weight_c = weight_VH.to(compute)
            for start in range(0, num_tokens, chunk):
                end = min(start + chunk, num_tokens)
                logp_cV = _chunk_logits(hidden_MH[start:end], weight_c, bias_V, temperature)
                lse_c = torch.logsumexp(logp_cV, -1)
                logp_cV.sub_(lse_c[:, None])  # log-softmax: no cancellation of large logits below
                lse_M[start:end] = lse_c
                logp_M[start:end] = logp_cV.gather(1, targets_M[start:end, None]).squeeze(1)
                if with_entropy:
                    entropy_M[start:end] = -logp_cV.exp().mul_(logp_cV).sum(-1)
        ctx.save_for_backward(hidden_MH, weight_VH, bias_V, targets_M, lse_M)
        ctx.set_materialize_grads(False)  # an output nobody uses (the logged entropy) costs no backward work
        ctx.compute, ctx.temperature, ctx.chunk, ctx.with_entropy = compute, temperature, chunk, with_entropy
        if not with_entropy:
            ctx.mark_non_differentiable(entropy_M)
        return logp_M, entropy_M

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_logp_M: Tensor | None, grad_entropy_M: Tensor | None) -> tuple:
        if grad_logp_M is None and grad_entropy_M is None:
            return (None,) * 7
        hidden_MH, weight_VH, bias_V, targets_M, lse_M = ctx.saved_tensors
        tau, chunk = ctx.temperature, ctx.chunk
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.zeros_like(hidden_MH) if need_h else None
        acc = _accumulation_dtype(ctx.compute)
        grad_w = torch.zeros(weight_VH.shape, dtype=acc, device=weight_VH.device) if need_w else None
        grad_b = torch.zeros(bias_V.shape, dtype=acc, device=bias_V.device) if need_b else None
        with torch.autocast(hidden_MH.device.type, enabled=False):
            weight_c = weight_VH.to(ctx.compute)
            for start in range(0, hidden_MH.shape[0], chunk):
                end = min(start + chunk, hidden_MH.shape[0])
                h_cH = hidden_MH[start:end]
                logp_cV = _chunk_logits(h_cH, weight_c, bias_V, tau).sub_(lse_M[start:end, None])
                p_cV = logp_cV.exp()
                if grad_entropy_M is not None:  # ∂H/∂(z/τ) = −p ⊙ (log p + H)
                    entropy_c1 = -(p_cV * logp_cV).sum(-1, keepdim=True)
                    grad_z_cV = logp_cV.add_(entropy_c1).mul_(p_cV).mul_(-grad_entropy_M[start:end, None].to(acc))
                    if grad_logp_M is not None:
                        grad_z_cV.sub_(p_cV.mul_(grad_logp_M[start:end, None].to(acc)))
                else:
                    grad_z_cV = p_cV.mul_(-grad_logp_M[start:end, None].to(acc))
                if grad_logp_M is not None:  # ∂ log π(y)/∂(z/τ) = onehot(y) − p
                    grad_z_cV.scatter_add_(1, targets_M[start:end, None], grad_logp_M[start:end, None].to(acc))
                if tau != 1.0:
                    grad_z_cV.div_(tau)
                grad_zc = grad_z_cV.to(ctx.compute)
                if need_h:
                    grad_h[start:end] = (grad_zc @ weight_c).to(grad_h.dtype)
                if need_w:
                    grad_w += (grad_zc.T @ h_cH.to(ctx.compute)).to(acc)
                if need_b:
                    grad_b += grad_z_cV.sum(0)
        return (
            grad_h,
            grad_w.to(weight_VH.dtype) if need_w else None,
            grad_b.to(bias_V.dtype) if need_b else None,
            None,
            None,
            None,
            None,
        )


def chunked_token_log_probs(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    bias: Tensor | None = None,
    temperature: float = 1.0,
    chunk_tokens: int | None = None,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Log-prob of each target token, and optionally the entropy, under ``softmax(h Wᵀ / τ)``.

    Args:
        hidden: ``[M, H]`` last hidden states (after the model's final norm), any float dtype and
            device; gradients flow back to it.
        weight: ``[V, H]`` output head (``lm_head.weight``); gradients flow back to it.
        targets: ``[M]`` int64 token ids in ``[0, V)``.
        bias: ``[V]`` head bias, or None.
        temperature: ``τ > 0``; the logits are divided by it (the sampling distribution's).
        chunk_tokens: tokens per chunk (None: :func:`default_chunk_tokens` of ``V``).
        with_entropy: also return the entropy of each token's distribution (differentiable).

    Returns:
        ``(log_probs, entropy)``: ``[M]`` float32 each (float64 when the compute dtype is
        float64) on ``hidden``'s device (``entropy`` None
        without ``with_entropy``), in nats.

    Raises:
        ValueError: shapes that do not fit, a ``temperature`` not above 0 or ``chunk_tokens`` below 1.

    Example:
        >>> import torch
        >>> h, w, y = torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0])
        >>> logp, entropy = chunked_token_log_probs(h, w, y, with_entropy=True)
        >>> round(logp.item(), 4), round(entropy.item(), 4)   # logits (1, 0): log σ(1), its entropy
        (-0.3133, 0.5822)
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden [M, H] and weight [V, H] must share H, got {tuple(hidden.shape)} and {tuple(weight.shape)}."
        )
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets must be [M] = [{hidden.shape[0]}], got {tuple(targets.shape)}.")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}.")
    chunk = default_chunk_tokens(weight.shape[0]) if chunk_tokens is None else chunk_tokens
    if chunk < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}.")
    logp_M, entropy_M = _ChunkedTokenLogProbs.apply(
        hidden, weight, bias, targets.long(), float(temperature), int(chunk), bool(with_entropy)
    )
    return logp_M, (entropy_M if with_entropy else None)
