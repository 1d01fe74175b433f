"""The torch backend's start-up checks (:class:`SettingsChecks`, a part of
:class:`~rllm_torch.backends.torch_backend.backend.TorchBackend`): the loss, KL, critic, sampler
and rollout-correction settings, and every task prompt against the model's context, the
micro-batch budget and the task's answers. Each failure is a ``ConfigError`` naming the setting
and the fix, raised before anything is trained."""

from __future__ import annotations

from rllm_torch.backends.torch_backend.model import check_context, context_length
from rllm_torch.backends.torch_backend.tokenizer import encode_prompts, require_chat_template
from rllm_torch.backends.torch_backend.vllm_setup import ENGINES, check_max_model_len
from rllm_torch.core.errors import ConfigError
from rllm_torch.core.losses import AGG_MODES, KL_ESTIMATORS, LOSS_FNS, TIS_MODES

__all__ = ["SettingsChecks"]


class SettingsChecks:
    """``validate_config`` and ``validate_prompts`` of :class:`~rllm_torch.backends.torch_backend.backend.TorchBackend`.

    Reads the backend's ``config``, ``settings`` (``config.backend``), ``loss_fn``,
    ``loss_agg_mode``, ``loss_agg_horizon``, ``actor``, ``critic``, ``tokenizer``,
    ``tokenizer_from_path``, ``apply_chat_template``, ``answer_in_response`` and ``model``.
    """

    def validate_config(self) -> None:
        if self.loss_fn not in LOSS_FNS:
            raise ConfigError(f"rllm.algorithm.loss_fn={self.loss_fn!r}: the torch backend implements {LOSS_FNS}.")
        if self.loss_agg_mode not in AGG_MODES:
            raise ConfigError(f"rllm.algorithm.loss_agg_mode={self.loss_agg_mode!r} is not one of {AGG_MODES}.")
        if self.loss_agg_horizon < 1 or self.settings.dro_beta < 0:
            raise ConfigError(
                f"rllm.algorithm.loss_agg_horizon must be >= 1 and backend.dro_beta >= 0, got {self.loss_agg_horizon} and {self.settings.dro_beta}."
            )
        self._validate_kl_and_critic()
        self._validate_rollout_engine_and_correction()
        rollout = self.config.rllm.rollout
        if rollout.n < 1 or rollout.n_val < 1 or rollout.max_new_tokens < 1:
            raise ConfigError(
                f"rllm.rollout.n, n_val and max_new_tokens must be >= 1, got {rollout.n}, {rollout.n_val}, {rollout.max_new_tokens}."
            )
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

    def _validate_rollout_engine_and_correction(self) -> None:
        """The sampler (``backend.rollout``) and ``rllm.algorithm.rollout_correction`` (issue 18)."""
        engine, correction = self.settings.rollout.engine, self.config.rllm.algorithm.rollout_correction
        if engine not in ENGINES:
            raise ConfigError(f"backend.rollout.engine={engine!r} is not one of {ENGINES}.")
        key = "rllm.algorithm.rollout_correction"
        if correction.tis_mode is not None and correction.tis_mode not in TIS_MODES:
            raise ConfigError(f"{key}.tis_mode={correction.tis_mode!r} is not null or one of {TIS_MODES}.")
        if not correction.tis_cap >= 1.0:
            raise ConfigError(
                f"{key}.tis_cap={correction.tis_cap} must be >= 1 (a cap below 1 truncates every on-policy token)."
            )
        if correction.tis_mode is not None and correction.bypass_mode:
            raise ConfigError(
                f"{key}.tis_mode={correction.tis_mode!r} with bypass_mode=true: the old policy is then the sampler, so every "
                "weight is exactly 1; set bypass_mode=false (recompute the old log-probs) or tis_mode=null."
            )
        if engine == "vllm" and self.actor.lora:
            raise ConfigError(
                "backend.rollout.engine=vllm with model.lora.r > 0 is not supported yet (the engine is synced with the "
                "model's own weights, not merged adapters); use backend.rollout.engine=hf, or model.lora.r=0."
            )
        if correction.tis_mode is not None and self.loss_fn == "dro":
            raise ConfigError(
                f"{key}.tis_mode with rllm.algorithm.loss_fn=dro: the weights scale the advantage term, and DRO's quadratic "
                "term is not linear in it; use another loss_fn, or tis_mode=null."
            )

    def _validate_kl_and_critic(self) -> None:
        algorithm = self.config.rllm.algorithm
        if self.config.model.ref_path is not None and not self.actor.has_reference:
            raise ConfigError(
                f"model.ref_path={self.config.model.ref_path!r} is set but no KL term uses a reference policy; set "
                "rllm.algorithm.use_kl_loss=true or use_kl_in_reward=true, or leave model.ref_path unset."
            )
        for key in ("kl_loss_type", "kl_penalty"):
            if algorithm[key] not in KL_ESTIMATORS:
                raise ConfigError(f"rllm.algorithm.{key}={algorithm[key]!r} is not one of {KL_ESTIMATORS}.")
        estimators = {algorithm.adv_estimator, *dict(algorithm.estimator_map).values()}
        uses_values = any(getattr(e, "value", e) == "gae" for e in estimators)
        if uses_values and self.critic is None:
            raise ConfigError(
                "rllm.algorithm.adv_estimator=gae needs the critic's values: set backend.critic.enable=true "
                "(a value model of the policy's architecture, trained with backend.critic.lr)."
            )
        if self.critic is not None and not uses_values:
            raise ConfigError(
                f"backend.critic.enable=true but no estimator uses a critic (estimators: {sorted(map(str, estimators))}); "
                "use rllm.algorithm.adv_estimator=gae, or set backend.critic.enable=false."
            )
        if self.critic is not None and self.actor.sharded:
            raise ConfigError(
                "backend.critic.enable=true with backend.parallelism=fsdp is not supported yet; use backend.parallelism=ddp."
            )
