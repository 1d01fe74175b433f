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

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import AutoModelForTokenClassification, PreTrainedModel

__all__ = ["build_critic", "token_values"]


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
                Path(model_config.path),
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
