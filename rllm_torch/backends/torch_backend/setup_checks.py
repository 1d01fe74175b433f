"""The torch backend's start-up checks that need its model and tokenizer (:class:`SettingsChecks`,
a part of :class:`~rllm_torch.backends.torch_backend.backend.TorchBackend`): a chat template, and
every task prompt against the model's context, the micro-batch budget and the task's answers.
The settings themselves are checked before the model is built
(:func:`~rllm_torch.trainer.config_checks.check_run_config`). Each failure is a ``ConfigError``
naming the setting and the fix, raised before anything is trained."""

from __future__ import annotations

from rllm_torch.backends.torch_backend.model import check_context, context_length
from rllm_torch.backends.torch_backend.tokenizer import encode_prompts, require_chat_template
from rllm_torch.backends.torch_backend.vllm_setup import check_max_model_len
from rllm_torch.core.errors import ConfigError

__all__ = ["SettingsChecks"]


class SettingsChecks:
    """``validate_config`` and ``validate_prompts`` of :class:`~rllm_torch.backends.torch_backend.backend.TorchBackend`.

    Reads the backend's ``config``, ``settings`` (``config.backend``), ``tokenizer``,
    ``tokenizer_from_path``, ``apply_chat_template``, ``answer_in_response`` and ``model``.
    """

    def validate_config(self) -> None:
        """What a run config's check (:func:`~rllm_torch.trainer.config_checks.check_run_config`)
        cannot see before the model is loaded: a chat template the tokenizer does not have.

        Raises:
            ConfigError: ``task.apply_chat_template=true`` with a tokenizer without one.
        """
        if self.apply_chat_template:
            require_chat_template(self.tokenizer)

    def validate_prompts(self, tasks: list[dict]) -> None:
        """Every prompt encodes without unknown tokens, the longest (as the sampler encodes it)
        and ``rllm.rollout.max_new_tokens`` fit in the policy's context
        (:func:`~rllm_torch.backends.torch_backend.model.check_context`) and in one micro-batch
        (``backend.micro_batch_tokens``), and, for a task whose
        reward needs the whole answer, ``max_new_tokens`` holds the longest answer.

        Raises:
            ConfigError: naming the prompt or answer, the setting and the fix.
        """
        rows = [task for task in tasks if isinstance(task, dict) and isinstance(task.get("prompt"), str)]
        if not rows:
            return
        ids = encode_prompts(self.tokenizer, [t["prompt"] for t in rows], apply_chat_template=self.apply_chat_template)
        unknown = self.tokenizer.unk_token_id
        if self.tokenizer_from_path and unknown is not None:
            for task, row_ids in zip(rows, ids, strict=True):
                if unknown in row_ids:
                    raise ConfigError(
                        f"the prompt {task['prompt']!r} has characters the tokenizer at model.path={self.config.model.path!r} "
                        f"does not know (they would become {self.tokenizer.unk_token!r}); use a tokenizer that covers the "
                        "task's text, or leave model.path unset for a character tokenizer built from the task."
                    )
        max_new_tokens = self.config.rllm.rollout.max_new_tokens
        longest = max(map(len, ids))
        check_context(longest, max_new_tokens, context_length(self.model))
        budget = self.settings.micro_batch_tokens
        if budget is not None and longest + max_new_tokens > budget:
            raise ConfigError(
                f"backend.micro_batch_tokens={budget} is smaller than the longest row a step can hold: the longest "
                f"prompt has {longest} tokens and rllm.rollout.max_new_tokens={max_new_tokens}; raise "
                f"backend.micro_batch_tokens to {longest + max_new_tokens} or more (or null: no limit)."
            )
        if self.settings.rollout.engine == "vllm":
            check_max_model_len(longest, max_new_tokens, self.settings.rollout.max_model_len)
        answers = [str(t["answer"]) for t in rows if "answer" in t]
        if self.answer_in_response and answers:
            lengths = [len(a) for a in self.tokenizer(answers, add_special_tokens=False)["input_ids"]]
            longest = max(range(len(answers)), key=lengths.__getitem__)
            if lengths[longest] > max_new_tokens:
                raise ConfigError(
                    f"task.name={self.config.task.name!r} scores the whole answer, and its longest answer "
                    f"({answers[longest]!r}) is {lengths[longest]} tokens: rllm.rollout.max_new_tokens={max_new_tokens} "
                    f"would cut every such response short; set rllm.rollout.max_new_tokens to {lengths[longest] + 1} or "
                    "more (the answer and the end token)."
                )
