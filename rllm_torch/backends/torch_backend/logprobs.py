"""Log-probs (and entropies) of chosen tokens from a language model's last hidden states,
never holding more than one chunk of logits.

A causal LM's logits are ``z = h Wᵀ (+ b)``, ``[M, V]`` for ``M`` tokens over a vocabulary of
``V`` (151,936 for Qwen2.5): 0.6 GB in float32 for 1,024 tokens, and a full ``log_softmax``
over a batch keeps several such copies for its backward. Here the head is applied ``chunk``
tokens at a time; each chunk's float32 logits give

    log π(y) = z_y / τ − logsumexp(z / τ),      H = −Σ_v p_v log p_v,

and only ``logsumexp`` (and the entropy, ``[M]``) is kept for the backward, which recomputes each
chunk's logits (``p = softmax(z / τ)``):

    ∂ log π(y) / ∂z = (onehot(y) − p) / τ,      ∂H / ∂z = −p ⊙ (log p + H) / τ,

then ``∂/∂h = (∂/∂z) W`` and ``∂/∂W += (∂/∂z)ᵀ h``. The head works in two ``[chunk, V]``
float32 buffers allocated once per call and reused by every chunk (a fresh 100 MB tensor per
chunk costs its page faults on CPU), forward and backward, whatever ``M``.

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

    Examples:
        >>> default_chunk_tokens(151_936), default_chunk_tokens(14)
        (220, 2396745)
    """
    return max(1, LOGITS_CHUNK_BYTES // (4 * vocab_size))


def _compute_dtype(hidden: Tensor) -> torch.dtype:
    device = hidden.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype


def _accumulation_dtype(compute: torch.dtype) -> torch.dtype:
    return torch.float64 if compute == torch.float64 else torch.float32


def _logits_into(out_cV: Tensor, h_cH: Tensor, weight_VH: Tensor, bias_V: Tensor | None, temperature: float) -> Tensor:
    """``out_cV`` (a reused float32 buffer; float64 for float64 weights) ← ``(h Wᵀ + b) / τ``, the
    matmul in the compute dtype of ``weight_VH``."""
    h_cH = h_cH.to(weight_VH.dtype)
    if out_cV.dtype == weight_VH.dtype:
        torch.mm(h_cH, weight_VH.T, out=out_cV)
    else:  # bf16 matmul, float32 logits
        out_cV.copy_(h_cH @ weight_VH.T)
    if bias_V is not None:
        out_cV.add_(bias_V)
    return out_cV.div_(temperature) if temperature != 1.0 else out_cV


def _grad_into(grad_h: Tensor | None, grad_w: Tensor | None, grad_zcV: Tensor, h_cH: Tensor, weight_c: Tensor) -> None:
    """``grad_h ← ∂/∂z · W`` and ``grad_w += (∂/∂z)ᵀ h`` of one chunk, without a temporary in the
    float32 (float64) case."""
    if grad_zcV.dtype == weight_c.dtype and (grad_h is None or grad_h.dtype == weight_c.dtype):
        if grad_h is not None:
            torch.mm(grad_zcV, weight_c, out=grad_h)
        if grad_w is not None:
            grad_w.addmm_(grad_zcV.T, h_cH.to(weight_c.dtype))
        return
    g_c = grad_zcV.to(weight_c.dtype)  # the compute dtype (bf16)
    if grad_h is not None:
        grad_h.copy_(g_c @ weight_c)
    if grad_w is not None:
        grad_w += g_c.T @ h_cH.to(weight_c.dtype)


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
        with_sum_pi_squared: bool,
    ) -> tuple[Tensor, Tensor, Tensor]:
        compute = _compute_dtype(hidden_MH)
        acc = _accumulation_dtype(compute)
        num_tokens, vocab = hidden_MH.shape[0], weight_VH.shape[0]
        logp_M = hidden_MH.new_empty(num_tokens, dtype=acc)
        lse_M = torch.empty_like(logp_M)
        entropy_M = torch.empty_like(logp_M) if with_entropy else logp_M.new_empty(0)
        sum_sq_M = torch.empty_like(logp_M) if with_sum_pi_squared else logp_M.new_empty(0)
        rows = min(chunk, num_tokens)
        shifted_buf, exp_buf = (
            hidden_MH.new_empty((rows, vocab), dtype=acc),
            hidden_MH.new_empty((rows, vocab), dtype=acc),
        )
        with torch.autocast(hidden_MH.device.type, enabled=False):
            weight_c = weight_VH.to(compute)
            for start in range(0, num_tokens, chunk):
                end = min(start + chunk, num_tokens)
                c = end - start
                z_cV = _logits_into(shifted_buf[:c], hidden_MH[start:end], weight_c, bias_V, temperature)
                max_c1 = z_cV.amax(-1, keepdim=True)
                shifted_cV = z_cV.sub_(max_c1)  # z - max <= 0: no overflow, no cancellation below
                exp_cV = torch.exp(shifted_cV, out=exp_buf[:c])
                sum_c1 = exp_cV.sum(-1, keepdim=True)
                log_sum_c1 = sum_c1.log()
                lse_M[start:end] = (max_c1 + log_sum_c1).squeeze(1)
                logp_M[start:end] = (shifted_cV.gather(1, targets_M[start:end, None]) - log_sum_c1).squeeze(1)
                if with_sum_pi_squared:  # Σ p² = Σ e^{2(z-m)} / (Σ e^{z-m})², before exp_cV is reused
                    sum_sq_M[start:end] = (exp_cV.square().sum(-1, keepdim=True) / sum_c1.square()).squeeze(1)
                if with_entropy:  # H = log Σ e^(z-m) − Σ p (z − m)
                    mean_c1 = exp_cV.mul_(shifted_cV).sum(-1, keepdim=True).div_(sum_c1)
                    entropy_M[start:end] = (log_sum_c1 - mean_c1).squeeze(1)
        ctx.save_for_backward(hidden_MH, weight_VH, bias_V, targets_M, lse_M, entropy_M)
        ctx.set_materialize_grads(False)  # an output nobody uses (the logged entropy) costs no backward work
        ctx.compute, ctx.temperature, ctx.chunk = compute, temperature, chunk
        if not with_entropy:
            ctx.mark_non_differentiable(entropy_M)
        ctx.mark_non_differentiable(sum_sq_M)
        return logp_M, entropy_M, sum_sq_M

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_logp_M: Tensor | None, grad_entropy_M: Tensor | None, _grad_sum_sq: Any) -> tuple:
        if grad_logp_M is None and grad_entropy_M is None:
            return (None,) * 8
        hidden_MH, weight_VH, bias_V, targets_M, lse_M, entropy_M = ctx.saved_tensors
        tau, chunk = ctx.temperature, ctx.chunk
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        acc = _accumulation_dtype(ctx.compute)
        num_tokens, vocab = hidden_MH.shape[0], weight_VH.shape[0]
        grad_h = torch.zeros_like(hidden_MH) if need_h else None
        grad_w = torch.zeros(weight_VH.shape, dtype=acc, device=weight_VH.device) if need_w else None
        grad_b = torch.zeros(bias_V.shape, dtype=acc, device=bias_V.device) if need_b else None
        rows = min(chunk, num_tokens)
        logp_buf, p_buf = hidden_MH.new_empty((rows, vocab), dtype=acc), hidden_MH.new_empty((rows, vocab), dtype=acc)
        with torch.autocast(hidden_MH.device.type, enabled=False):
            weight_c = weight_VH.to(ctx.compute)
            for start in range(0, num_tokens, chunk):
                end = min(start + chunk, num_tokens)
                c, h_cH = end - start, hidden_MH[start:end]
                logp_cV = _logits_into(logp_buf[:c], h_cH, weight_c, bias_V, tau).sub_(lse_M[start:end, None])
                p_cV = torch.exp(logp_cV, out=p_buf[:c])
                if grad_entropy_M is not None:  # ∂H/∂(z/τ) = −p ⊙ (log p + H)
                    entropy_c1 = entropy_M[start:end, None]
                    grad_z_cV = logp_cV.add_(entropy_c1).mul_(p_cV).mul_(-grad_entropy_M[start:end, None].to(acc))
                    if grad_logp_M is not None:
                        grad_z_cV.sub_(p_cV.mul_(grad_logp_M[start:end, None].to(acc)))
                else:
                    grad_z_cV = p_cV.mul_(-grad_logp_M[start:end, None].to(acc))
                if grad_logp_M is not None:  # ∂ log π(y)/∂(z/τ) = onehot(y) − p
                    grad_z_cV.scatter_add_(1, targets_M[start:end, None], grad_logp_M[start:end, None].to(acc))
                if tau != 1.0:
                    grad_z_cV.div_(tau)
                _grad_into(grad_h[start:end] if need_h else None, grad_w, grad_z_cV, h_cH, weight_c)
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
    with_sum_pi_squared: bool = False,
) -> tuple[Tensor, Tensor | None] | tuple[Tensor, Tensor | None, Tensor]:
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
        with_sum_pi_squared: also return ``Σ_v π_v²`` of each token's distribution (no gradient;
            verl's ``calculate_sum_pi_squared``, the optimal token baseline's input), computed
            from the same chunk of logits.

    Returns:
        ``(log_probs, entropy)``: ``[M]`` float32 each (float64 when the compute dtype is
        float64) on ``hidden``'s device (``entropy`` None
        without ``with_entropy``), in nats; with ``with_sum_pi_squared`` a third ``[M]``, ``Σ π²``.

    Raises:
        ValueError: shapes that do not fit, a ``temperature`` not above 0 or ``chunk_tokens`` below 1.

    Examples:
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
    logp_M, entropy_M, sum_sq_M = _ChunkedTokenLogProbs.apply(
        hidden,
        weight,
        bias,
        targets.long(),
        float(temperature),
        int(chunk),
        bool(with_entropy),
        bool(with_sum_pi_squared),
    )
    if with_sum_pi_squared:
        return logp_M, (entropy_M if with_entropy else None), sum_sq_M
    return logp_M, (entropy_M if with_entropy else None)
