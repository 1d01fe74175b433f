"""``TorchBackend``: the embedded backend. A ``transformers`` causal LM (the
:class:`~rllm_torch.backends.torch_backend.actor.Actor`) is sampled by :class:`TorchRolloutEngine`
and trained on :class:`~rllm_torch.trainer.pipeline.token_batch.TokenBatch` tensors with the loss
``rllm.algorithm.loss_fn`` aggregated by ``loss_agg_mode``, AdamW and gradient clipping.

**Memory.** Log-probs never form ``[N, T, V]`` logits: the model's body runs on the rows and only
the trained response positions reach the output head, in chunks (:mod:`.logprobs`). Each
mini-batch is split into micro-batches of at most ``backend.micro_batch_tokens`` padded tokens
(rows of similar length together), whose gradients accumulate before the optimizer step; the
loss of every micro-batch is divided by the mini-batch's global token (or sequence) count, so
the accumulated gradient is the one-batch gradient for every ``loss_agg_mode``. The old-log-prob,
reference and value passes run in the same micro-batches. ``backend.dtype=bfloat16`` computes in
bf16 (float32 weights and optimizer state), ``backend.gradient_checkpointing`` recomputes block
activations in the backward, ``model.lora.r`` trains LoRA adapters only.

On several processes (``torchrun``, :class:`~rllm_torch.trainer.runtime.ranks.RunRanks`) each rank
samples its share of every step's prompts with its own generator, and trains a
``DistributedDataParallel`` copy of the policy: each loss is divided by the token (or sequence)
count of the *global* mini-batch and multiplied by the world size, so DDP's gradient average is
the gradient of the global loss, and the weights stay identical on every rank. Ranks agree on
the number of micro-batches of each mini-batch (a rank with fewer runs zero-loss forwards), and
gradients cross the ranks once per optimizer step.

With ``rllm.algorithm.use_kl_loss`` or ``use_kl_in_reward`` a frozen **reference policy** gives
``ref_log_probs`` next to the old log-probs; the KL to it is a loss term (``kl_loss_coef`` times
``kl_loss_type``, aggregated by ``loss_agg_mode``) or a per-token penalty on the rewards
(``kl_coef`` times ``kl_penalty``). With ``backend.critic.enable`` (``adv_estimator=gae``) a
**critic** (:mod:`~rllm_torch.backends.torch_backend.critic`) gives each response token's value,
and is trained on the GAE returns with the clipped value loss and its own AdamW, one step per
mini-batch beside the policy's.

``backend.rollout.engine=vllm`` samples through a colocated vLLM engine
(:mod:`~rllm_torch.backends.torch_backend.vllm_rollout`), synced with the policy before a sampling
phase that follows an optimizer step. ``rllm.algorithm.rollout_correction`` weights each token's
loss by the truncated importance ratio of the old policy over the sampler
(:mod:`~rllm_torch.backends.torch_backend.losses.rollout_correction`), or (``bypass_mode``) takes
the sampler's log-probs as the old policy's.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch import Tensor
from transformers import get_scheduler

from rllm_torch.backends.torch_backend.actor import Actor, wrap_ddp
from rllm_torch.backends.torch_backend.critic import Critic
from rllm_torch.backends.torch_backend.data import TaskDataLoader
from rllm_torch.backends.torch_backend.forward import causal_lm
from rllm_torch.backends.torch_backend.logprobs import default_chunk_tokens
from rllm_torch.backends.torch_backend.losses import (
    AGG_MODES,
    KL_ESTIMATORS,
    LOSS_FNS,
    TIS_MODES,
    aggregate_loss,
    entropy_bonus,
    importance_weight_stats,
    kl_penalty,
    loss_normaliser,
    policy_loss,
    rollout_importance_weights,
    summarise_importance_weights,
)
from rllm_torch.backends.torch_backend.micro_batches import gradient_sync, split_rows, stage_memory
from rllm_torch.backends.torch_backend.model import (
    check_context,
    context_length,
    resolve_compute_dtype,
    resolve_device,
)
from rllm_torch.backends.torch_backend.rollout import SamplingParams, TorchRolloutEngine
from rllm_torch.backends.torch_backend.tokenizer import (
    encode_prompts,
    has_saved_tokenizer,
    load_tokenizer,
    require_chat_template,
)
from rllm_torch.backends.torch_backend.vllm_rollout import ENGINES, VllmRolloutEngine, check_max_model_len
from rllm_torch.core.errors import ConfigError
from rllm_torch.trainer.pipeline.token_batch import build_token_batch
from rllm_torch.trainer.protocol import BackendProtocol
from rllm_torch.trainer.runtime.ranks import RunRanks
from rllm_torch.trainer.state import TrainerState

__all__ = ["TorchBackend"]

_SCHEDULES = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}
# update stats that are each rank's share of a global loss (summed over the ranks); the others
# are token sums (divided by the global token count)
_SHARE_STATS = ("loss", "kl_loss", "critic/vf_loss")


class TorchBackend(BackendProtocol):
    """The pure-PyTorch backend (``backend.name=torch``).

    Args:
        config: the run config: ``model.*``, ``backend.*``, ``data.*``, ``rllm.*``.
        alphabet: characters of the default character tokenizer (used when ``model.path`` has none).
        answer_in_response: the task's reward scores the whole answer in the response, so
            :meth:`validate_prompts` also checks that ``max_new_tokens`` holds the longest answer.
        ranks: the run's processes (default: one); with several, the policy is wrapped by
            ``backend.parallelism`` (``ddp``: ``DistributedDataParallel``).

    Raises:
        ConfigError / ModelNotFoundError: bad model, device, dtype, memory, loss or parallelism settings.
    """

    name = "torch"

    def __init__(
        self,
        config: DictConfig,
        alphabet: str = "0123456789+=",
        ranks: RunRanks | None = None,
        *,
        answer_in_response: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(config, ranks)
        config = self.config  # typed: every setting of the schema
        self.answer_in_response = answer_in_response
        self.settings, rllm = config.backend, config.rllm
        if self.settings.num_threads:
            torch.set_num_threads(self.settings.num_threads)
        self.device = resolve_device(
            self.settings.device, local_rank=self.ranks.local_rank if self.ranks.distributed else None
        )
        self.compute_dtype = resolve_compute_dtype(self.settings.dtype, self.device)
        budget = self.settings.micro_batch_tokens
        if budget is not None and budget < 1:
            raise ConfigError(f"backend.micro_batch_tokens must be >= 1 (or null: no limit), got {budget}.")
        chunk = self.settings.log_prob_chunk_tokens
        if chunk is not None and chunk < 1:
            raise ConfigError(f"backend.log_prob_chunk_tokens must be >= 1 (or null: automatic), got {chunk}.")
        self.tokenizer = load_tokenizer(config.model.path, alphabet, pad_token=config.model.pad_token)
        self.tokenizer_from_path = has_saved_tokenizer(config.model.path)
        self.apply_chat_template = bool(config.task.apply_chat_template)
        self.actor = Actor(config, self.tokenizer, self.device, self.ranks, self.compute_dtype)
        self.model = self.actor.model
        algorithm = rllm.algorithm
        self.use_kl_loss, self.use_kl_in_reward = bool(algorithm.use_kl_loss), bool(algorithm.use_kl_in_reward)
        self.critic = (
            Critic(
                config.model,
                self.actor.base,
                self.settings.critic,
                seed=self.settings.seed + 1,
                # fsdp: refused in validate_config
                wrap=(lambda module: module)
                if self.actor.sharded
                else (lambda m: wrap_ddp(m, self.ranks, self.device)),
                pad_token_id=self.tokenizer.pad_token_id,
                autocast_dtype=self.compute_dtype,
                gradient_checkpointing=self.settings.gradient_checkpointing,
            )
            if self.settings.critic.enable
            else None
        )
        self.loss_fn = algorithm.loss_fn or "ppo"
        self.loss_agg_mode = algorithm.loss_agg_mode
        self.loss_agg_horizon = algorithm.loss_agg_horizon or rllm.rollout.max_new_tokens
        self.scheduler, self._pending_scheduler_state = None, None
        self.run_dir = Path(
            rllm.trainer.default_local_dir or f"outputs/{rllm.trainer.project_name}/{rllm.trainer.experiment_name}"
        )

    @property
    def ref_model(self) -> torch.nn.Module | None:
        """The frozen reference policy's own copy (None without a KL term, or with LoRA, whose
        reference is the model with its adapters disabled)."""
        return self.actor.ref_model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.actor.optimizer

    def summary_rows(self) -> list[tuple[str, str]]:
        """The start-up summary's ``memory`` row: compute dtype, micro-batch budget, head chunk,
        activation checkpointing and LoRA."""
        s, lora = self.settings, self.config.model.lora
        vocab = causal_lm(self.model).get_output_embeddings().weight.shape[0]
        chunk = s.log_prob_chunk_tokens or default_chunk_tokens(vocab)
        parts = [
            "bfloat16 compute (float32 weights and AdamW state)" if self.compute_dtype else "float32",
            f"micro-batches of {s.micro_batch_tokens} tokens" if s.micro_batch_tokens else "no micro-batches",
            f"log-probs in chunks of {chunk} tokens",
            f"activation checkpointing {'on' if s.gradient_checkpointing else 'off'}",
        ]
        if self.actor.lora:
            trainable = sum(p.numel() for p in self.actor.parameters)
            targets = ",".join(lora.target_modules)
            parts.append(
                f"LoRA r={lora.r} alpha={lora.alpha} on {targets} ({trainable / 1e6:.2f}M trainable parameters)"
            )
        else:
            parts.append("no LoRA")
        return [("memory", ", ".join(parts))]

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

    def init_rollout_engine(self, **kwargs: Any) -> TorchRolloutEngine:
        r = self.config.rllm.rollout
        train = SamplingParams(r.temperature, r.top_p, r.max_new_tokens)
        val = SamplingParams(r.val_temperature, r.val_top_p, r.max_new_tokens)
        common = dict(
            max_batch_size=self.settings.rollout_batch_size,
            seed=self.settings.seed + self.ranks.rank,  # each rank its own rollouts
            apply_chat_template=self.apply_chat_template,
        )
        engine = self.settings.rollout
        if engine.engine == "vllm":  # issue 18: a colocated vLLM engine, synced after optimizer steps
            self.rollout_engine = VllmRolloutEngine(
                self.model,
                self.tokenizer,
                train,
                val,
                max_model_len=engine.max_model_len,
                gpu_memory_utilization=engine.gpu_memory_utilization,
                kv_cache_memory_bytes=engine.kv_cache_memory_bytes,
                enforce_eager=engine.enforce_eager,
                dtype=engine.dtype or ("bfloat16" if self.compute_dtype == torch.bfloat16 else None),
                distributed=self.ranks.distributed,
                **common,
            )
            self.optimizer.register_step_post_hook(lambda *_: self.rollout_engine.mark_stale())
        else:
            self.rollout_engine = TorchRolloutEngine(
                self.model, self.tokenizer, train, val, autocast_dtype=self.compute_dtype, **common
            )
        return self.rollout_engine

    def get_dataloader(self, dataset: list[dict], trainer_state: TrainerState) -> TaskDataLoader:
        data = self.config.data
        return TaskDataLoader(
            dataset or [],
            data.train_batch_size,
            shuffle=data.shuffle,
            seed=self.settings.seed,
            rank=self.ranks.rank,
            world_size=self.ranks.world_size,
        )

    async def generate_episodes(
        self, batch: list[tuple[str, dict]], agent_workflow_engine: Any, is_validation: bool = False
    ) -> list:
        n = self.config.rllm.rollout.n_val if is_validation else self.config.rllm.rollout.n
        self.rollout_engine.validation = is_validation
        tasks = [(task_id, task, k) for task_id, task in batch for k in range(n)]
        with self._sampling_weights():
            return await agent_workflow_engine.execute_tasks(
                [t for _, t, _ in tasks], [i for i, _, _ in tasks], [k for _, _, k in tasks]
            )

    def _sampling_weights(self) -> AbstractContextManager:
        """The weights a sampling phase runs on. The vLLM engine holds its own copy: it is synced
        here if an optimizer step changed the policy (under FSDP one parameter at a time, every
        rank together). ``generate`` runs on the policy itself: under FSDP, gathered whole for the
        phase (:meth:`Actor.sampling_weights`)."""
        self.rollout_engine.sync_weights()  # a no-op for the hf engine
        return nullcontext() if self.settings.rollout.engine == "vllm" else self.actor.sampling_weights()

    def transform_to_backend_batch(self, trainer_state: TrainerState):
        use_pre = bool(self.config.rllm.algorithm.use_precomputed_advantage)
        return build_token_batch(
            trainer_state.trajectory_groups, pad_token_id=self.tokenizer.pad_token_id, use_precomputed_advantage=use_pre
        ).to(self.device)

    def _micro_batches(self, batch, rows: Tensor, *, collective: bool) -> list[Tensor]:
        """``rows`` in micro-batches of at most ``backend.micro_batch_tokens`` padded tokens
        (:func:`~rllm_torch.backends.torch_backend.micro_batches.split_rows`). ``collective``:
        the passes are collectives (training; FSDP forwards), so every rank gets the largest
        count over the ranks (one all-reduce), padded with empty micro-batches."""
        micro = split_rows(rows, batch.attention_mask, self.settings.micro_batch_tokens)
        if collective and self.ranks.distributed:
            count = int(self.ranks.reduce([float(len(micro))], op="max")[0])
            micro += [rows[:0]] * (count - len(micro))
        return micro

    @torch.no_grad()
    def _log_probs(self, scorer: torch.nn.Module, batch, micro_batches: list[Tensor]) -> Tensor:
        """``[R, T]`` log-probs of the batch's trained response tokens (0 elsewhere), one forward
        per micro-batch; an empty micro-batch runs a zero-loss forward (FSDP: a collective)."""
        log_probs = torch.zeros_like(batch.response_mask)
        for rows in micro_batches:
            if rows.numel():
                positions = batch.response_mask[rows] > 0
                log_probs[rows] = scorer(batch.input_ids[rows], batch.attention_mask[rows], positions).log_probs
            elif scorer is self.actor.train_model:
                self.actor.dummy_loss()
        return log_probs

    def _global_rows(self, batch) -> int:
        """The batch's rows over every rank: one all-reduce per batch, its result kept in
        ``batch.extras`` for the update."""
        if "global_rows" not in batch.extras:
            batch.extras["global_rows"] = int(self.ranks.reduce([float(batch.input_ids.shape[0])])[0])
        return batch.extras["global_rows"]

    def _updates_per_batch(self, total_rows: int) -> tuple[int, int]:
        """``(ppo_epochs, mini-batches per epoch)`` for a batch of ``total_rows`` rows over every rank."""
        s = self.settings
        return s.ppo_epochs, -(-total_rows // min(s.mini_batch_size or total_rows, total_rows))

    def _memory_advice(self) -> str:
        s = self.settings
        advice = [f"lower backend.micro_batch_tokens (now {s.micro_batch_tokens})"]
        if not s.gradient_checkpointing:
            advice.append("set backend.gradient_checkpointing=true")
        if self.compute_dtype is None:
            advice.append("set backend.dtype=bfloat16")
        if self.config.model.lora.r == 0:
            advice.append("train LoRA adapters (model.lora.r=16)")
        return ", ".join(advice[:-1]) + f" or {advice[-1]}" if len(advice) > 1 else advice[0]

    async def process_backend_batch(self, trainer_state: TrainerState) -> None:
        """Old log-probs (and, when configured, the reference policy's log-probs, the KL penalty
        of the rewards and the critic's values) of every row, without gradient, in micro-batches.

        With a single update per batch (one epoch, one mini-batch) and no KL in the reward, the
        old log-probs are left None: the update's own forward runs on the weights that sampled
        the batch, so a separate no-gradient pass would compute the same numbers (TRL skips it
        too), and the update takes them from its forward, detached. With rollout correction
        (``rllm.algorithm.rollout_correction.tis_mode``) the old log-probs are always a pass of
        their own (the weights need them before the update); with ``bypass_mode`` they are the
        sampler's.

        Raises:
            OutOfMemoryError: a pass ran out of memory (naming the settings that lower it).
        """
        batch, actor = trainer_state.backend_batch, self.actor
        total_rows = self._global_rows(batch)
        correction = self.config.rllm.algorithm.rollout_correction
        single_update = (
            self._updates_per_batch(max(total_rows, 1)) == (1, 1)
            and not self.use_kl_in_reward
            and correction.tis_mode is None
        )
        rows = torch.arange(batch.input_ids.shape[0], device=self.device)
        with stage_memory("computing the old, reference and value passes", self._memory_advice()):
            if correction.bypass_mode:  # rLLM's bypass_mode: the sampler's log-probs are π_old
                batch.old_log_probs = batch.rollout_log_probs
            elif single_update:
                batch.old_log_probs = None
            else:
                micro = self._micro_batches(batch, rows, collective=actor.sharded)
                batch.old_log_probs = self._log_probs(actor.scoring_module(), batch, micro)
            if actor.has_reference:
                scorer, context = actor.reference()
                with context:
                    micro = self._micro_batches(batch, rows, collective=False)
                    batch.ref_log_probs = self._log_probs(scorer, batch, micro)
            if self.critic is not None:
                batch.values = self.critic.values(batch, self._micro_batches(batch, rows, collective=False))
        if correction.tis_mode is not None:
            trainer_state.metrics |= self._rollout_importance_weights(batch)
        if self.use_kl_in_reward:
            algorithm, mask = self.config.rllm.algorithm, batch.response_mask
            kl = kl_penalty(batch.old_log_probs, batch.ref_log_probs, algorithm.kl_penalty)
            batch.reward_penalty = algorithm.kl_coef * kl * mask
            penalty, tokens = self.ranks.reduce([float(batch.reward_penalty.sum()), float(mask.sum())])
            trainer_state.metrics["reward/kl_penalty"] = penalty / max(tokens, 1.0)  # mean per trained token

    def _rollout_importance_weights(self, batch) -> dict[str, float]:
        """``batch.extras["rollout_is_weights"]`` (``[R, T]``, the loss's per-token weights) and
        their ``rollout_corr/*`` metrics over every rank's batch (two all-reduces)."""
        correction = self.config.rllm.algorithm.rollout_correction
        mode = correction.tis_mode
        weights, capped = rollout_importance_weights(
            batch.old_log_probs, batch.rollout_log_probs, batch.response_mask, tis_mode=mode, tis_cap=correction.tis_cap
        )
        batch.extras["rollout_is_weights"] = weights
        stats = importance_weight_stats(weights, capped, batch.response_mask, tis_mode=mode).tolist()
        return summarise_importance_weights(self.ranks.reduce(stats[:4]) + self.ranks.reduce(stats[4:], "max"))

    def _ensure_scheduler(self, trainer_state: TrainerState, updates_per_step: int) -> None:
        if self.scheduler is None:
            total = max(trainer_state.total_steps, 1) * updates_per_step
            warmup = int(self.config.rllm.algorithm.warmup_steps_ratio * total)
            self.scheduler = get_scheduler(
                _SCHEDULES[self.config.rllm.algorithm.lr_schedule],
                self.actor.optimizer,
                num_warmup_steps=warmup,
                num_training_steps=total,
            )
            if self._pending_scheduler_state is not None:
                # resumed: the checkpoint's step count, with the current backend.lr, lr_schedule and
                # warmup (resumable settings: trainer/runtime/fingerprint.py), so a changed one applies from here
                base_lrs = [self.settings.lr] * len(self.actor.optimizer.param_groups)
                self.scheduler.load_state_dict({**self._pending_scheduler_state, "base_lrs": base_lrs})
                self._pending_scheduler_state = None
                step = self.scheduler.last_epoch
                for group, base, lr_lambda in zip(
                    self.actor.optimizer.param_groups, base_lrs, self.scheduler.lr_lambdas, strict=True
                ):
                    group["lr"] = base * lr_lambda(step)  # building the scheduler reset it to the step-0 value

    async def update_policy(self, trainer_state: TrainerState) -> None:
        """``backend.ppo_epochs`` passes over the batch, each in ``ceil(R / backend.mini_batch_size)``
        shuffled, near-equal mini-batches of the ``R`` rows of every rank (one row per step;
        ``mini_batch_size`` None: the whole batch), one AdamW step each, its gradient accumulated
        over micro-batches. Each rank trains on its own rows of every mini-batch; the loss is
        normalised over the global mini-batch.

        Raises:
            OutOfMemoryError: the update ran out of memory (naming the settings that lower it).
        """
        batch, ranks = trainer_state.backend_batch, self.ranks
        num_rows, total_rows = batch.input_ids.shape[0], self._global_rows(batch)
        if total_rows == 0:  # nothing to train on anywhere (the trainer skips such steps itself)
            return
        epochs, num_minis = self._updates_per_batch(total_rows)
        self._ensure_scheduler(trainer_state, epochs * num_minis)
        local_stats, grad_norms = [], []
        with stage_memory("updating the policy", self._memory_advice()):
            for _ in range(epochs):
                order = torch.randperm(num_rows, device=self.device)
                for rows in order.tensor_split(num_minis):  # this rank's part of each global mini-batch
                    normaliser = self._global_normaliser(batch.response_mask[rows])
                    micro = self._micro_batches(batch, rows, collective=True)
                    self.actor.optimizer.zero_grad(set_to_none=True)
                    stats = {}
                    for i, micro_rows in enumerate(micro):
                        last = i == len(micro) - 1
                        with gradient_sync(self.actor.train_model, last):
                            loss, micro_stats = self._micro_batch_loss(batch, micro_rows, normaliser)
                            loss.backward()
                        if self.critic is not None:
                            with gradient_sync(self.critic.train_model, last):
                                micro_stats |= self.critic.backward(
                                    batch,
                                    micro_rows,
                                    normaliser,
                                    loss_agg_mode=self.loss_agg_mode,
                                    horizon=self.loss_agg_horizon,
                                    world_size=ranks.world_size,
                                )
                        stats = {k: stats.get(k, 0) + v for k, v in micro_stats.items()}
                    grad_norms.append(self.actor.step())
                    self.scheduler.step()
                    if self.critic is not None:
                        self.critic.step()
                    local_stats.append(stats)
        trainer_state.metrics |= self._global_update_stats(local_stats, grad_norms)
        trainer_state.metrics["actor/lr"] = self.scheduler.get_last_lr()[0]
        if self.critic is not None and (critic_norm := self.critic.take_grad_norm()) is not None:
            trainer_state.metrics["critic/grad_norm"] = critic_norm

    def _global_normaliser(self, mask_RT: Tensor) -> Tensor:
        """``loss_agg_mode``'s normaliser of a mini-batch over every rank's rows (one all-reduce)."""
        normaliser = loss_normaliser(mask_RT, self.loss_agg_mode)
        if self.ranks.distributed:
            normaliser = normaliser.clone()
            torch.distributed.all_reduce(normaliser, group=self.ranks.process_group)
        return normaliser

    def _micro_batch_loss(self, batch, rows: Tensor, normaliser: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """This rank's loss on the micro-batch ``rows`` of a global mini-batch (divided by the
        mini-batch's global ``normaliser``, times the world size for DDP's mean) and its local
        stats: shares of the global loss (:data:`_SHARE_STATS`), token sums of the diagnostics
        (the policy's entropy among them), and ``tokens``. Old log-probs left None by
        :meth:`process_backend_batch` are this forward's, detached."""
        s, world = self.settings, self.ranks.world_size
        mask_RT = batch.response_mask[rows]
        if rows.numel():
            positions = mask_RT > 0
            scores = self.actor.train_model(batch.input_ids[rows], batch.attention_mask[rows], positions, True)
            log_probs, entropy, anchor = scores.log_probs, scores.entropy, 0.0
        else:  # no row here: a zero loss through the same forward, so the gradient collectives still run
            log_probs, entropy, anchor = batch.rollout_log_probs[rows], None, self.actor.dummy_loss()
        old_log_probs = log_probs.detach() if batch.old_log_probs is None else batch.old_log_probs[rows]
        aggregation = dict(loss_agg_mode=self.loss_agg_mode, horizon=self.loss_agg_horizon, normaliser=normaliser)
        advantages = batch.advantages[rows]
        if "rollout_is_weights" in batch.extras:  # issue 18: w·ℓ(A) = ℓ(w·A) for the losses linear in A (w >= 0)
            advantages = advantages * batch.extras["rollout_is_weights"][rows]
        loss, extra = policy_loss(
            self.loss_fn,
            log_probs,
            old_log_probs,
            advantages,
            mask_RT,
            clip_ratio_low=s.clip_ratio_low,
            clip_ratio_high=s.clip_ratio_high,
            clip_ratio_c=s.clip_ratio_c,
            importance_sampling_level=self.config.rllm.algorithm.importance_sampling_level,
            beta=s.dro_beta,
            **aggregation,
        )
        tokens = mask_RT.sum()
        stats = {"loss": loss.detach(), "tokens": tokens} | {k: v.detach() * tokens for k, v in extra.items()}
        stats["entropy"] = (entropy.detach() * mask_RT).sum() if entropy is not None else tokens * 0.0
        if s.entropy_coeff and entropy is not None:  # verl's actor: pg_loss - entropy_coeff * agg(entropy)
            bonus, _ = entropy_bonus(entropy, mask_RT, entropy_coeff=s.entropy_coeff, **aggregation)
            loss = loss + bonus
        # the sampler against the trainer on the same weights (a token sum, like the diagnostics)
        stats["rollout_logprob_abs_diff"] = ((old_log_probs - batch.rollout_log_probs[rows]).abs() * mask_RT).sum()
        if self.actor.has_reference:  # the old policy's KL to the reference, in two estimators
            for name, kind in (("ref/kl_k1", "kl"), ("ref/kl_k3", "low_var_kl")):
                stats[name] = (kl_penalty(old_log_probs, batch.ref_log_probs[rows], kind) * mask_RT).sum()
        if self.use_kl_loss:  # DeepSeekMath's GRPO: + beta * KL(policy || reference), aggregated like the loss
            algorithm = self.config.rllm.algorithm
            kl = kl_penalty(log_probs, batch.ref_log_probs[rows], algorithm.kl_loss_type)
            kl_loss = aggregate_loss(
                kl, mask_RT, self.loss_agg_mode, horizon=self.loss_agg_horizon, normaliser=normaliser
            )
            loss = loss + algorithm.kl_loss_coef * kl_loss
            stats["kl_loss"] = kl_loss.detach()
        return (loss + anchor) * world, stats

    def _global_update_stats(self, local_stats: list[dict], grad_norms: list[torch.Tensor]) -> dict[str, float]:
        """Means over the mini-batches of the global values: the shares of a loss (summed over the
        ranks), ``grad_norm`` (the same on every rank after DDP's all-reduce) and the token means
        of the diagnostics over every rank's tokens. Keys without a ``/`` get ``actor/``. One
        all-reduce for the whole update."""
        keys = sorted({k for stats in local_stats for k in stats} - {"tokens"})
        table = torch.stack(
            [
                torch.stack([stats["tokens"]] + [stats.get(k, stats["tokens"] * 0) for k in keys]).float()
                for stats in local_stats
            ]
        )
        if self.ranks.distributed:
            torch.distributed.all_reduce(table, group=self.ranks.process_group)
        tokens_M = table[:, 0].clamp(min=1.0)
        norms = [g.full_tensor() if hasattr(g, "full_tensor") else g for g in grad_norms]  # FSDP: a DTensor
        out = {"actor/grad_norm": torch.stack(norms).float().mean()}
        for i, k in enumerate(keys):
            column = table[:, 1 + i]
            out[k if "/" in k else f"actor/{k}"] = (column if k in _SHARE_STATS else column / tokens_M).mean()
        return {k: float(v) for k, v in out.items()}

    def state_dict(self) -> dict[str, Any]:
        """Model (LoRA: adapters), optimizer and lr-scheduler state dicts (the same on every
        rank), and the critic's model and optimizer when there is one; with FSDP the scheduler
        only (the model and optimizer shards are :meth:`sharded_state_dict`)."""
        scheduler = self.scheduler.state_dict() if self.scheduler is not None else self._pending_scheduler_state
        state = self.actor.state_dict() | {"scheduler": scheduler}
        if self.critic is not None:
            state |= self.critic.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s dict; the lr scheduler, built at the first update, gets its state then."""
        self.actor.load_state_dict(state)
        if self.critic is not None:
            self.critic.load_state_dict(state)
            for group in self.critic.optimizer.param_groups:  # resumable: the current backend.critic.lr
                group["lr"] = self.settings.critic.lr
        self.scheduler, self._pending_scheduler_state = None, state["scheduler"]

    def sharded_state_dict(self) -> dict[str, Any] | None:
        """FSDP: this rank's model and optimizer shards, for ``torch.distributed.checkpoint``."""
        return self.actor.sharded_state_dict() if self.actor.sharded else None

    def load_sharded_state_dict(self, state: dict[str, Any]) -> None:
        self.actor.load_sharded_state_dict(state)

    def rank_state_dict(self) -> dict[str, Any]:
        """This rank's sampling generator."""
        return {"rollout_generator": self.rollout_engine.generator.get_state()}

    def load_rank_state_dict(self, state: dict[str, Any]) -> None:
        self.rollout_engine.generator.set_state(state["rollout_generator"])

    def save_checkpoint(self, name: str) -> Path | None:
        """Save the model (LoRA: adapters merged) and tokenizer to ``{run_dir}/checkpoints/{name}``
        (``save_pretrained``; rank 0 writes and returns the path; with FSDP every rank must call,
        to gather the weights)."""
        path = self.run_dir / "checkpoints" / name
        if not self.actor.save_pretrained(path):
            return None
        self.tokenizer.save_pretrained(path)
        return path

    async def on_train_end(self, trainer_state: TrainerState) -> None:
        """Export the trained model as ``checkpoints/final`` (``model.path=`` loads it; rank 0
        writes it); the trainer's resumable checkpoints are ``checkpoints/step_*``."""
        self.save_checkpoint("final")
