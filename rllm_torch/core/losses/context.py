"""What a loss is called with (:class:`LossContext`, rLLM's): one micro-batch's tensors, its
aggregation and its parameters. A loss registered with ``register_loss`` is a function of it;
a built-in loss is called from one too (:meth:`~rllm_torch.core.losses.declaration.BuiltinLoss.compute`),
so the update calls every loss alike."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from rllm_torch.core.losses.aggregation import Aggregation

__all__ = ["LossContext", "LossOutput"]

#: What a loss returns: ``(loss, stats)``, a 0-d tensor with gradient and detached 0-d diagnostics.
LossOutput = tuple[Tensor, dict[str, Tensor]]


@dataclass
class LossContext:
    """What a loss sees (rLLM's ``LossContext``). Every tensor is ``[R, T]`` float on the batch's
    device: ``R`` rows (one per step) of a micro-batch, ``T`` response tokens.

    Attributes:
        logp_curr: log π_θ of each token, the only input with a gradient.
        logp_old: log π_old (the ratio's denominator; the rollout's under ``bypass_mode``), detached.
        advantages: the per-token advantages (after the rollout correction's weights, if any).
        action_mask: 1.0 on the tokens this loss trains (the role's rows, less the filtered tokens).
        obs_mask: 1.0 on the environment-observation tokens of multi-turn steps (a step's prompt
            tokens after the previous step's prompt and response), whose log-probs ``logp_curr``
            then holds too, for a loss registered with ``needs=("obs_mask",)`` (rLLM's ``echo``);
            all zeros for any other loss.
        aggregate: ``aggregate(per_token [R, T], mask [R, T], mode=None) -> 0-d`` (an
            :class:`~rllm_torch.core.losses.aggregation.Aggregation`): the run's ``loss_agg_mode``
            (or the loss's pinned one) over the *global* mini-batch, as the built-in losses
            aggregate; another ``mode`` over this micro-batch's own count.
        logp_ref: the reference policy's log-probs (a loss that declares ``needs=("logp_ref",)``
            gets them), else None.
        logp_rollout: the sampler's log-probs.
        params: a registered loss's: ``rllm.algorithm.loss_params``, with rLLM's ``eps_clip``,
            ``eps_clip_high`` (the run's ``backend.clip_ratio_low`` / ``_high``) and ``kl_beta`` (0);
            a built-in loss's: its options, read from their settings.
        backend: ``"torch"``.
    """

    logp_curr: Tensor
    logp_old: Tensor
    advantages: Tensor
    action_mask: Tensor
    obs_mask: Tensor
    aggregate: Aggregation
    logp_ref: Tensor | None = None
    logp_rollout: Tensor | None = None
    params: dict[str, Any] = field(default_factory=dict)
    backend: str = "torch"

    def seq_reduce(self, values: Tensor, mask: Tensor, reduction: str = "mean") -> Tensor:
        """Each row's masked mean (``reduction="mean"``) or sum of ``values``, broadcast back to
        ``[R, T]`` (sequence-level losses such as GSPO's)."""
        summed = (values * mask).sum(dim=-1, keepdim=True)
        if reduction == "mean":
            summed = summed / mask.sum(dim=-1, keepdim=True).clamp(min=1.0)
        return summed.expand_as(values)
