"""The torch backend's start-up checks that need its model and tokenizer: every task prompt
against the model's context, the micro-batch budget and the task's answers (:func:`check_prompts`).
The settings themselves are checked before the model is built
(:func:`~rllm_torch.trainer.config_checks.check_run_config`). Each failure is a ``ConfigError``
naming the setting and the fix, raised before anything is trained."""

from __future__ import annotations

import torch
from omegaconf import DictConfig
from transformers import PreTrainedTokenizerBase

from rllm_torch.backends.torch_backend.model import check_context, context_length
from rllm_torch.backends.torch_backend.tokenizer import encode_prompts
from rllm_torch.backends.torch_backend.vllm_setup import check_max_model_len
from rllm_torch.core.errors import ConfigError
from rllm_torch.trainer.workflow import PROMPT_KEYS, task_messages

__all__ = ["check_prompts"]


def check_prompts(
    tasks: list[dict],
    config: DictConfig,
    tokenizer: PreTrainedTokenizerBase,
    model: torch.nn.Module,
    *,
    tokenizer_from_path: bool,
    apply_chat_template: bool,
    answer_in_response: bool,
) -> None:
    """Every prompt encodes without unknown tokens, the longest (as the sampler encodes it) is
    within ``data.max_prompt_length`` and it and
    ``rllm.rollout.max_new_tokens`` fit in the policy's context
    (:func:`~rllm_torch.backends.torch_backend.model.check_context`) and in one micro-batch
    (``backend.micro_batch_tokens``), and, for a task whose reward needs the whole answer
    (``answer_in_response``), ``max_new_tokens`` holds the longest answer.

    Args:
        tasks: the training and validation tasks (dicts with a prompt under one of rLLM's keys,
            ``messages``, ``question``, ``prompt`` or ``problem``, maybe an ``"answer"``).
        config: the run config.
        tokenizer, model: the policy's.
        tokenizer_from_path: the tokenizer came with ``model.path`` (so an unknown token is refused).
        apply_chat_template: prompts go through the tokenizer's chat template.
        answer_in_response: the task's reward scores the whole answer in the response.

    Raises:
        ConfigError: naming the prompt or answer, the setting and the fix.
    """
    rows = [task for task in tasks if isinstance(task, dict) and any(task.get(k) is not None for k in PROMPT_KEYS)]
    if not rows:
        return
    prompts = [task_messages(t) for t in rows]
    ids = encode_prompts(tokenizer, prompts, apply_chat_template=apply_chat_template)
    unknown = tokenizer.unk_token_id
    if tokenizer_from_path and unknown is not None:
        for prompt, row_ids in zip(prompts, ids, strict=True):
            if unknown in row_ids:
                text = prompt if isinstance(prompt, str) else "".join(str(m.get("content", "")) for m in prompt)
                chars = [
                    c for c in dict.fromkeys(text) if unknown in tokenizer(c, add_special_tokens=False)["input_ids"]
                ]
                which = f" ({', '.join(map(repr, chars[:20]))})" if chars else ""
                raise ConfigError(
                    f"the prompt {prompt!r} has characters the tokenizer at model.path={config.model.path!r} "
                    f"does not know{which}: they would become {tokenizer.unk_token!r}; use a tokenizer that covers the "
                    "task's text, or leave model.path unset for a character tokenizer built from the task."
                )
    max_new_tokens = config.rllm.rollout.max_new_tokens
    longest = max(map(len, ids))
    limit = config.data.max_prompt_length
    if limit is not None and longest > limit:
        first = next(i for i, row_ids in enumerate(ids) if len(row_ids) > limit)
        raise ConfigError(
            f"the prompt {prompts[first]!r} is {len(ids[first])} tokens, above data.max_prompt_length={limit}; raise "
            "data.max_prompt_length (or null: the model's context is the limit), or shorten the task's prompts."
        )
    check_context(longest, max_new_tokens, context_length(model))
    budget = config.backend.micro_batch_tokens
    if budget is not None and longest + max_new_tokens > budget:
        raise ConfigError(
            f"backend.micro_batch_tokens={budget} is smaller than the longest row a step can hold: the longest "
            f"prompt has {longest} tokens and rllm.rollout.max_new_tokens={max_new_tokens}; raise "
            f"backend.micro_batch_tokens to {longest + max_new_tokens} or more (or null: no limit)."
        )
    if config.backend.rollout.engine == "vllm":
        check_max_model_len(longest, max_new_tokens, config.backend.rollout.max_model_len)
    answers = [str(t["answer"]) for t in rows if "answer" in t]
    if answer_in_response and answers:
        lengths = [len(a) for a in tokenizer(answers, add_special_tokens=False)["input_ids"]]
        longest = max(range(len(answers)), key=lengths.__getitem__)
        if lengths[longest] > max_new_tokens:
            raise ConfigError(
                f"task.name={config.task.name!r} scores the whole answer, and its longest answer "
                f"({answers[longest]!r}) is {lengths[longest]} tokens: rllm.rollout.max_new_tokens={max_new_tokens} "
                f"would cut every such response short; set rllm.rollout.max_new_tokens to {lengths[longest] + 1} or "
                "more (the answer and the end token)."
            )
