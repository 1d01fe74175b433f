"""The critic of PPO with GAE (``rllm.algorithm.adv_estimator=gae``, ``backend.critic.enable``):
a value model of the policy's architecture, with a one-output token head.

The critic is ``transformers``' ``AutoModelForTokenClassification`` with ``num_labels=1`` and no
dropout on the policy's config (the same body, a fresh linear head: ``GPT2ForTokenClassification``,
``LlamaForTokenClassification``); with ``model.path`` its body starts from the policy's
weights, as verl's critic starts from the actor's checkpoint. ``V(s_t)``, the value of the state
before response token ``t``, is the head's output at position ``t - 1``: the same shift as the
token log-probs, so ``values[:, t]`` lines up with ``log_probs[:, t]`` and the response mask.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import AutoModelForTokenClassification, PreTrainedModel

from rllm_torch.backends.torch_backend.actor import Actor, wrap_ddp
from rllm_torch.backends.torch_backend.forward import on_real_columns
from rllm_torch.backends.torch_backend.model import adamw, compute_autocast, enable_gradient_checkpointing
from rllm_torch.backends.torch_backend.optim_step import clipped_step
from rllm_torch.backends.torch_backend.pretrained import pretrained_dir
from rllm_torch.core.errors import ConfigError
from rllm_torch.core.losses import Aggregation, clipped_value_loss
from rllm_torch.trainer.ranks import RunRanks

__all__ = ["Critic", "build_critic", "critic_for", "token_values"]


def build_critic(model_config: Any, policy: PreTrainedModel, *, seed: int = 0) -> PreTrainedModel:
    """The value model, float32, train mode, on the policy's device.

    Args:
        model_config: the ``model`` config group (``path``: start the body from it).
        policy: the policy whose architecture (``policy.config``) the critic copies.
        seed: seeds the head (and, without ``model.path``, the body).
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if model_config.path is not None:
            critic = AutoModelForTokenClassification.from_pretrained(
                pretrained_dir(model_config.path, cache_dir=getattr(model_config, "gguf_cache_dir", None)),
                num_labels=1,
                classifier_dropout=0.0,
                local_files_only=True,
                dtype=torch.float32,
            )
        else:
            fields = {k: v for k, v in policy.config.to_dict().items() if k not in ("id2label", "label2id")}
            config = policy.config.__class__.from_dict(fields | {"num_labels": 1, "classifier_dropout": 0.0})
            critic = AutoModelForTokenClassification.from_config(config)
    device = next(policy.parameters()).device
    return critic.float().to(device).train()


def token_values(critic: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """``[N, T]`` float32 ``V(s_t)`` of each token position (the head at ``t - 1``); column 0 is 0.

    Args:
        input_ids: ``[N, T]`` int64, right padded. attention_mask: ``[N, T]``, 1 on real tokens.
    """
    out = critic(input_ids=input_ids, attention_mask=attention_mask).logits  # [N, T, 1]
    return F.pad(out[:, :-1, 0].float(), (1, 0))


class Critic:
    """The value model, its training wrapper and its AdamW (``backend.critic.*``).

    Args:
        model_config: the ``model`` config group (see :func:`build_critic`).
        policy: the policy whose architecture the critic copies (and device).
        settings: ``backend.critic``: ``lr``, ``weight_decay``, ``grad_clip``, ``cliprange_value``,
            ``loss_coef``.
        seed: seeds the critic's initialisation.
        wrap: the training wrapper of the backend (DDP over the ranks, or the identity).
        pad_token_id: the token of the one-token forward a rank without rows runs.
        autocast_dtype: the forwards' autocast dtype (``backend.dtype``; None: float32).
        gradient_checkpointing: recompute the blocks' activations in the backward.
    """

    def __init__(
        self,
        model_config: Any,
        policy: PreTrainedModel,
        settings: Any,
        *,
        seed: int,
        wrap: Callable[[torch.nn.Module], torch.nn.Module],
        pad_token_id: int,
        autocast_dtype: torch.dtype | None = None,
        gradient_checkpointing: bool = False,
    ) -> None:
        self.settings = settings
        self.model = build_critic(model_config, policy, seed=seed)
        if gradient_checkpointing:
            enable_gradient_checkpointing(self.model)
        self.train_model = wrap(self.model)
        self.optimizer = adamw(list(self.model.parameters()), lr=settings.lr, weight_decay=settings.weight_decay)
        self.pad_token_id, self.autocast_dtype = pad_token_id, autocast_dtype
        self.grad_norms: list[Tensor] = []

    def _values(self, model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        with compute_autocast(input_ids.device, self.autocast_dtype):
            return on_real_columns(partial(token_values, model), input_ids, attention_mask)

    @torch.no_grad()
    def values(self, batch: Any, micro_batches: list[Tensor]) -> Tensor:
        """``[R, T]`` float32 values of the batch's response tokens (0 elsewhere, and for no rows),
        one forward per micro-batch of rows."""
        values = torch.zeros_like(batch.response_mask)
        for rows in micro_batches:
            if rows.numel():
                values[rows] = self._values(self.model, batch.input_ids[rows], batch.attention_mask[rows])
        return values * batch.response_mask

    def backward(self, batch: Any, rows: Tensor, agg: Aggregation, *, world_size: int) -> dict[str, Tensor]:
        """The clipped value loss of one micro-batch ``rows`` against ``batch.returns``,
        aggregated by the policy loss's ``agg`` over the global mini-batch (times ``world_size`` for DDP's
        mean), backpropagated into the accumulated gradient. A rank without rows runs a zero loss
        through a one-token forward, so DDP's all-reduce stays in step. Returns the stats:
        ``critic/vf_loss`` (this rank's share) and the token sums ``critic/vf_clipfrac``, ``critic/values``."""
        s = self.settings
        mask_RT = batch.response_mask[rows]
        if rows.numel():
            values, anchor = self._values(self.train_model, batch.input_ids[rows], batch.attention_mask[rows]), 0.0
        else:
            dummy = torch.full((1, 1), self.pad_token_id, dtype=torch.int64, device=batch.input_ids.device)
            values, anchor = batch.values[rows], self.train_model(input_ids=dummy).logits.sum() * 0.0
        loss, extra = clipped_value_loss(
            values,
            batch.values[rows],
            batch.returns[rows],
            mask_RT,
            cliprange_value=s.cliprange_value,
            agg=agg,
        )
        ((s.loss_coef * loss + anchor) * world_size).backward()
        tokens = mask_RT.sum()
        return {
            "critic/vf_loss": loss.detach(),
            "critic/vf_clipfrac": extra["vf_clipfrac"] * tokens,
            "critic/values": (values.detach() * mask_RT).sum(),
        }

    def step(self) -> None:
        """:func:`~rllm_torch.backends.torch_backend.optim_step.clipped_step` of the critic
        (``backend.critic.grad_clip``; its norm goes to ``grad_norms``).

        Raises:
            NonFiniteGradientError: the norm is NaN or infinite (the step is not taken, the value
                model's weights stay the last good step's).
        """
        parameters = list(self.model.parameters())
        self.grad_norms.append(clipped_step(parameters, self.optimizer, self.settings.grad_clip, what="critic"))

    def take_grad_norm(self) -> float | None:
        """The mean gradient norm of the steps since the last call (None if there was none)."""
        norms, self.grad_norms = self.grad_norms, []
        return float(torch.stack(norms).float().mean()) if norms else None

    def state_dict(self) -> dict[str, Any]:
        return {"critic": self.model.state_dict(), "critic_optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from a backend checkpoint's state (the keys of :meth:`state_dict`).

        Raises:
            ConfigError: the checkpoint was written by a run without a critic.
        """
        if "critic" not in state:
            raise ConfigError(
                "backend.critic.enable=true but the checkpoint has no critic (it was written by a run without one); "
                "resume with the run's own settings, or start a new run (rllm.trainer.resume_mode=disable)."
            )
        self.model.load_state_dict(state["critic"])
        self.optimizer.load_state_dict(state["critic_optimizer"])


def critic_for(actor: Actor, config: Any, ranks: RunRanks, device: torch.device, pad_token_id: int) -> Critic | None:
    """The value model of ``actor``'s policy when ``backend.critic.enable`` (else None): its
    architecture, seeded ``backend.seed + 1``, wrapped in DDP over ``ranks`` on ``device`` (FSDP is
    refused by the run config's check), in the policy's compute dtype and activation checkpointing."""
    settings = config.backend
    if not settings.critic.enable:
        return None
    return Critic(
        config.model,
        actor.base,
        settings.critic,
        seed=settings.seed + 1,
        wrap=(lambda module: module) if actor.sharded else (lambda module: wrap_ddp(module, ranks, device)),
        pad_token_id=pad_token_id,
        autocast_dtype=actor.compute_dtype,
        gradient_checkpointing=settings.gradient_checkpointing,
    )
