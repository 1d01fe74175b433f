"""``TorchBackend``: the embedded backend. A ``transformers`` causal LM is sampled by
:class:`TorchRolloutEngine` and trained on :class:`~rllm_torch.trainer.token_batch.TokenBatch`
tensors with the loss ``rllm.algorithm.loss_fn`` aggregated by ``loss_agg_mode``, AdamW and
gradient clipping.

On several processes (``torchrun``, :class:`~rllm_torch.trainer.ranks.RunRanks`) each rank
samples its share of every step's prompts with its own generator, and trains a
``DistributedDataParallel`` copy of the policy: each loss is divided by the token (or sequence)
count of the *global* mini-batch and multiplied by the world size, so DDP's gradient average is
the gradient of the global loss, and the weights stay identical on every rank.

With ``rllm.algorithm.use_kl_loss`` or ``use_kl_in_reward`` a frozen **reference policy** (a
copy of the initial policy, or ``model.ref_path``) gives ``ref_log_probs`` next to the old
log-probs; the KL to it is a loss term (``kl_loss_coef`` times ``kl_loss_type``, aggregated by
``loss_agg_mode``) or a per-token penalty on the rewards (``kl_coef`` times ``kl_penalty``).
With ``backend.critic.enable`` (``adv_estimator=gae``) a **critic**
(:mod:`~rllm_torch.backends.torch_backend.critic`) gives each response token's value, and is
trained on the GAE returns with the clipped value loss and its own AdamW, one step per
mini-batch beside the policy's.

``backend.rollout.engine=vllm`` samples through a colocated vLLM engine
(:mod:`~rllm_torch.backends.torch_backend.vllm_rollout`), synced with the policy before a sampling
phase that follows an optimizer step. ``rllm.algorithm.rollout_correction`` weights each token's
loss by the truncated importance ratio of the old policy over the sampler
(:mod:`~rllm_torch.backends.torch_backend.losses.rollout_correction`), or (``bypass_mode``) takes
the sampler's log-probs as the old policy's.
"""

from __future__ import annotations

import copy
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel
from transformers import get_scheduler

from rllm_torch.backends.torch_backend.critic import Critic
from rllm_torch.backends.torch_backend.data import TaskDataLoader
from rllm_torch.backends.torch_backend.losses import (
    AGG_MODES,
    KL_ESTIMATORS,
    LOSS_FNS,
    TIS_MODES,
    aggregate_loss,
    importance_weight_stats,
    kl_penalty,
    loss_normaliser,
    policy_loss,
    rollout_importance_weights,
    summarise_importance_weights,
)
from rllm_torch.backends.torch_backend.policy import build_policy, check_context, context_length, resolve_device
from rllm_torch.backends.torch_backend.rollout import SamplingParams, TorchRolloutEngine
from rllm_torch.backends.torch_backend.sampling import on_real_columns, token_log_probs
from rllm_torch.backends.torch_backend.tokenizer import (
    encode_prompts,
    has_saved_tokenizer,
    load_tokenizer,
    require_chat_template,
)
from rllm_torch.backends.torch_backend.vllm_rollout import ENGINES, VllmRolloutEngine, check_max_model_len
from rllm_torch.errors import ConfigError, ModelNotFoundError
from rllm_torch.trainer.backend import BackendProtocol
from rllm_torch.trainer.ranks import RunRanks
from rllm_torch.trainer.state import TrainerState
from rllm_torch.trainer.token_batch import build_token_batch

__all__ = ["TorchBackend"]

_SCHEDULES = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}
PARALLELISMS = ("ddp", "fsdp")
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
        ConfigError / ModelNotFoundError: bad model, device, loss or parallelism settings.
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
        self.answer_in_response = answer_in_response
        self.settings, rllm = config.backend, config.rllm
        if self.settings.num_threads:
            torch.set_num_threads(self.settings.num_threads)
        self.device = resolve_device(
            self.settings.device, local_rank=self.ranks.local_rank if self.ranks.distributed else None
        )
        self.tokenizer = load_tokenizer(config.model.path, alphabet, pad_token=config.model.get("pad_token"))
        self.tokenizer_from_path = has_saved_tokenizer(config.model.path)
        self.apply_chat_template = bool(config.task.get("apply_chat_template", False))
        self.model = build_policy(config.model, self.tokenizer, seed=self.settings.seed).to(self.device)
        algorithm = rllm.algorithm
        self.use_kl_loss, self.use_kl_in_reward = bool(algorithm.use_kl_loss), bool(algorithm.use_kl_in_reward)
        self.ref_model = self._reference_policy(config.model) if self.use_kl_loss or self.use_kl_in_reward else None
        self.parallelism = self.settings.get("parallelism", "ddp")
        self.sharded = self.ranks.distributed and self.parallelism == "fsdp"
        self.critic = (
            Critic(
                config.model,
                self.model,
                self.settings.critic,
                seed=self.settings.seed + 1,
                wrap=self._wrap if not self.sharded else (lambda module: module),  # fsdp: refused in validate_config
                pad_token_id=self.tokenizer.pad_token_id,
            )
            if self.settings.critic.enable
            else None
        )
        self.train_model = self._wrap(self.model)
        self.loss_fn = rllm.algorithm.loss_fn or "ppo"
        self.loss_agg_mode = rllm.algorithm.get("loss_agg_mode", "token-mean")
        self.loss_agg_horizon = rllm.algorithm.get("loss_agg_horizon") or rllm.rollout.max_new_tokens
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=self.settings.lr, weight_decay=self.settings.weight_decay
        )
        self.scheduler, self._pending_scheduler_state = None, None
        self.run_dir = Path(
            rllm.trainer.default_local_dir or f"outputs/{rllm.trainer.project_name}/{rllm.trainer.experiment_name}"
        )

    def _reference_policy(self, model_config: DictConfig) -> torch.nn.Module:
        """The frozen reference policy: ``model.ref_path``, or a copy of the initial policy (built
        before any checkpoint is loaded, so a resumed run keeps the same reference).

        Raises:
            ConfigError / ModelNotFoundError: ``model.ref_path`` has no model, or a vocabulary of
                another size than the policy's (the log-probs would be of other tokens).
        """
        if model_config.ref_path is None:
            ref = copy.deepcopy(self.model)
        else:
            ref_config = OmegaConf.merge(model_config, {"path": model_config.ref_path})
            try:
                ref = build_policy(ref_config, self.tokenizer, key="model.ref_path").to(self.device)
            except ModelNotFoundError as exc:
                raise ModelNotFoundError(
                    f"model.ref_path={model_config.ref_path!r}: no model there (expected a directory with config.json, "
                    "as save_pretrained writes); leave model.ref_path unset for a frozen copy of the initial policy."
                ) from exc
            mine, theirs = self.model.config.vocab_size, ref.config.vocab_size
            if mine != theirs:
                raise ConfigError(
                    f"model.ref_path={model_config.ref_path!r} has a vocabulary of {theirs} tokens but the policy has {mine}: "
                    "the reference must share the policy's tokenizer; leave model.ref_path unset to use the initial policy."
                )
        return ref.eval().requires_grad_(False)

    def _wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module the training forward passes go through: DDP over the ranks, or the model."""
        if self.parallelism not in PARALLELISMS:
            raise ConfigError(
                f"backend.parallelism={self.parallelism!r} is not known to the torch backend; choose from {PARALLELISMS}."
            )
        if not self.ranks.distributed:
            if self.parallelism == "fsdp":
                raise ConfigError(
                    "backend.parallelism=fsdp shards the policy over the processes of a torchrun launch, and this run is one "
                    "process: launch it with torchrun --nproc_per_node=N, or leave backend.parallelism=ddp."
                )
            return model
        if self.parallelism == "fsdp":
            from rllm_torch.backends.torch_backend.sharding import shard_policy

            return shard_policy(model, self.ranks)
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids, process_group=self.ranks.process_group)

    def validate_config(self) -> None:
        if self.loss_fn not in LOSS_FNS:
            raise ConfigError(f"rllm.algorithm.loss_fn={self.loss_fn!r}: the torch backend implements {LOSS_FNS}.")
        if self.loss_agg_mode not in AGG_MODES:
            raise ConfigError(f"rllm.algorithm.loss_agg_mode={self.loss_agg_mode!r} is not one of {AGG_MODES}.")
        if self.loss_agg_horizon < 1 or self.settings.get("dro_beta", 0.05) < 0:
            raise ConfigError(
                f"rllm.algorithm.loss_agg_horizon must be >= 1 and backend.dro_beta >= 0, got {self.loss_agg_horizon} and {self.settings.get('dro_beta')}."
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
        (:func:`~rllm_torch.backends.torch_backend.policy.check_context`), and, for a task whose
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
        check_context(max(map(len, ids)), max_new_tokens, context_length(self.model))
        if self.settings.rollout.engine == "vllm":
            check_max_model_len(max(map(len, ids)), max_new_tokens, self.settings.rollout.max_model_len)
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
        if correction.tis_mode is not None and self.loss_fn == "dro":
            raise ConfigError(
                f"{key}.tis_mode with rllm.algorithm.loss_fn=dro: the weights scale the advantage term, and DRO's quadratic "
                "term is not linear in it; use another loss_fn, or tis_mode=null."
            )

    def _validate_kl_and_critic(self) -> None:
        algorithm = self.config.rllm.algorithm
        if self.config.model.get("ref_path") is not None and self.ref_model is None:
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
        if self.critic is not None and self.sharded:
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
                dtype=engine.dtype,
                distributed=self.ranks.distributed,
                **common,
            )
            self.optimizer.register_step_post_hook(lambda *_: self.rollout_engine.mark_stale())
        else:
            self.rollout_engine = TorchRolloutEngine(self.model, self.tokenizer, train, val, **common)
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

    def _sampling_weights(self):
        """FSDP: the whole policy gathered for a sampling phase (ranks sample different numbers of
        tokens, so their forwards must not communicate); otherwise nothing to do. The vLLM engine
        holds its own copy: it is synced here if an optimizer step changed the weights (with FSDP
        one parameter at a time, every rank together), and nothing is gathered."""
        self.rollout_engine.sync_weights()  # issue 18; a no-op for the hf engine
        if not self.sharded or self.settings.rollout.engine == "vllm":
            return nullcontext()
        from rllm_torch.backends.torch_backend.sharding import gathered_weights

        return gathered_weights(self.model)

    def _dummy_forward(self) -> torch.Tensor:
        """A one-token forward through the training module: a rank with no row takes part in the
        collectives that the others' forwards (FSDP) and backwards (DDP, FSDP) run."""
        dummy = torch.full((1, 1), self.tokenizer.pad_token_id, dtype=torch.int64, device=self.device)
        return self.train_model(input_ids=dummy).logits.sum() * 0.0

    def transform_to_backend_batch(self, trainer_state: TrainerState):
        use_pre = bool(self.config.rllm.algorithm.use_precomputed_advantage)
        return build_token_batch(
            trainer_state.trajectory_groups, pad_token_id=self.tokenizer.pad_token_id, use_precomputed_advantage=use_pre
        ).to(self.device)

    def _log_probs(self, model: torch.nn.Module, batch, rows: slice | torch.Tensor = slice(None)) -> torch.Tensor:
        """``[R, T]`` token log-probs of ``rows``; the forward runs on the rows cut to their
        longest real row (right padding beyond it is never computed), padded back with zeros."""
        temperature = self.config.rllm.rollout.temperature
        forward = lambda ids, mask: token_log_probs(model, ids, mask, temperature=temperature)
        return on_real_columns(forward, batch.input_ids[rows], batch.attention_mask[rows])

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

    async def process_backend_batch(self, trainer_state: TrainerState) -> None:
        """Old log-probs (and, when configured, the reference policy's log-probs, the KL penalty
        of the rewards and the critic's values) of every row, without gradient.

        With a single update per batch (one epoch, one mini-batch) and no KL in the reward, the
        old log-probs are left None: the update's own forward runs on the weights that sampled
        the batch, so a separate no-gradient pass would compute the same numbers (TRL skips it
        too), and the update takes them from its forward, detached."""
        batch = trainer_state.backend_batch
        num_rows, total_rows = batch.input_ids.shape[0], self._global_rows(batch)
        correction = self.config.rllm.algorithm.rollout_correction  # issue 18: TIS needs π_old before the update
        single_update = (
            self._updates_per_batch(max(total_rows, 1)) == (1, 1)
            and not self.use_kl_in_reward
            and correction.tis_mode is None
        )
        with torch.no_grad():
            if correction.bypass_mode:  # rLLM's bypass_mode: the sampler's log-probs are π_old
                batch.old_log_probs = batch.rollout_log_probs
            elif single_update:
                batch.old_log_probs = None
            elif num_rows:
                batch.old_log_probs = self._log_probs(self.train_model if self.sharded else self.model, batch)
            else:  # this rank has no row in this step (its prompts were filtered out)
                batch.old_log_probs = torch.zeros_like(batch.rollout_log_probs)
                if self.sharded:  # the other ranks' forwards all-gather weights: take part
                    self._dummy_forward()
            if self.ref_model is not None:
                batch.ref_log_probs = (
                    self._log_probs(self.ref_model, batch) if num_rows else torch.zeros_like(batch.rollout_log_probs)
                )
            if self.critic is not None:
                batch.values = self.critic.values(batch)
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
                self.optimizer,
                num_warmup_steps=warmup,
                num_training_steps=total,
            )
            if self._pending_scheduler_state is not None:
                # resumed: the checkpoint's step count, with the current backend.lr, lr_schedule and
                # warmup (resumable settings: trainer/fingerprint.py), so a changed one applies from here
                base_lrs = [self.settings.lr] * len(self.optimizer.param_groups)
                self.scheduler.load_state_dict({**self._pending_scheduler_state, "base_lrs": base_lrs})
                self._pending_scheduler_state = None
                step = self.scheduler.last_epoch
                for group, base, lr_lambda in zip(
                    self.optimizer.param_groups, base_lrs, self.scheduler.lr_lambdas, strict=True
                ):
                    group["lr"] = base * lr_lambda(step)  # building the scheduler reset it to the step-0 value

    async def update_policy(self, trainer_state: TrainerState) -> None:
        """``backend.ppo_epochs`` passes over the batch, each in ``ceil(R / backend.mini_batch_size)``
        shuffled, near-equal mini-batches of the ``R`` rows of every rank (one row per step;
        ``mini_batch_size`` None: the whole batch), one AdamW step each. Each rank trains on its
        own rows of every mini-batch; the loss is normalised over the global mini-batch."""
        batch, s, ranks = trainer_state.backend_batch, self.settings, self.ranks
        num_rows, total_rows = batch.input_ids.shape[0], self._global_rows(batch)
        if total_rows == 0:  # nothing to train on anywhere (the trainer skips such steps itself)
            return
        epochs, num_minis = self._updates_per_batch(total_rows)
        self._ensure_scheduler(trainer_state, epochs * num_minis)
        local_stats, grad_norms = [], []
        for _ in range(epochs):
            order = torch.randperm(num_rows, device=self.device)
            for rows in order.tensor_split(num_minis):  # this rank's part of each global mini-batch
                normaliser = self._global_normaliser(batch.response_mask[rows])
                loss, stats = self._mini_batch_loss(batch, rows, normaliser)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norms.append(torch.nn.utils.clip_grad_norm_(self.model.parameters(), s.grad_clip))
                self.optimizer.step()
                self.scheduler.step()
                if self.critic is not None:
                    stats |= self.critic.step(
                        batch,
                        rows,
                        normaliser,
                        loss_agg_mode=self.loss_agg_mode,
                        horizon=self.loss_agg_horizon,
                        world_size=ranks.world_size,
                    )
                local_stats.append(stats)
        trainer_state.metrics |= self._global_update_stats(local_stats, grad_norms)
        trainer_state.metrics["actor/lr"] = self.scheduler.get_last_lr()[0]
        if self.critic is not None and (critic_norm := self.critic.take_grad_norm()) is not None:
            trainer_state.metrics["critic/grad_norm"] = critic_norm

    def _global_normaliser(self, mask_RT: torch.Tensor) -> torch.Tensor:
        """``loss_agg_mode``'s normaliser of a mini-batch over every rank's rows (one all-reduce)."""
        normaliser = loss_normaliser(mask_RT, self.loss_agg_mode)
        if self.ranks.distributed:
            normaliser = normaliser.clone()
            torch.distributed.all_reduce(normaliser, group=self.ranks.process_group)
        return normaliser

    def _mini_batch_loss(
        self, batch, rows: torch.Tensor, normaliser: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """This rank's loss on ``rows`` of a global mini-batch (times the world size, for DDP's
        mean) and its local stats: shares of the global loss (:data:`_SHARE_STATS`), token sums
        of the diagnostics, and ``tokens``. Old log-probs left None by :meth:`process_backend_batch`
        are this forward's, detached."""
        s, world = self.settings, self.ranks.world_size
        mask_RT = batch.response_mask[rows]
        if rows.numel():
            log_probs, anchor = self._log_probs(self.train_model, batch, rows), 0.0
        else:  # no row here: a zero loss through the same forward, so the gradient collectives still run
            log_probs, anchor = batch.rollout_log_probs[rows], self._dummy_forward()
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
            beta=s.get("dro_beta", 0.05),
            **aggregation,
        )
        tokens = mask_RT.sum()
        stats = {"loss": loss.detach(), "tokens": tokens} | {k: v.detach() * tokens for k, v in extra.items()}
        # the sampler against the trainer on the same weights (a token sum, like the diagnostics)
        stats["rollout_logprob_abs_diff"] = ((old_log_probs - batch.rollout_log_probs[rows]).abs() * mask_RT).sum()
        if self.ref_model is not None:  # the old policy's KL to the reference, in two estimators
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
        """Model, optimizer and lr-scheduler state dicts (the same on every rank), and the critic's
        model and optimizer when there is one; with FSDP the scheduler only (the model and optimizer shards are :meth:`sharded_state_dict`)."""
        scheduler = self.scheduler.state_dict() if self.scheduler is not None else self._pending_scheduler_state
        if self.sharded:
            return {"scheduler": scheduler}
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "scheduler": scheduler}
        if self.critic is not None:
            state |= self.critic.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s dict; the lr scheduler, built at the first update, gets its state then."""
        if not self.sharded:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        if self.critic is not None:
            self.critic.load_state_dict(state)
            for group in self.critic.optimizer.param_groups:  # resumable: the current backend.critic.lr
                group["lr"] = self.settings.critic.lr
        self.scheduler, self._pending_scheduler_state = None, state["scheduler"]

    def sharded_state_dict(self) -> dict[str, Any] | None:
        """FSDP: this rank's model and optimizer shards, for ``torch.distributed.checkpoint``."""
        if not self.sharded:
            return None
        from rllm_torch.backends.torch_backend.sharding import sharded_state

        return sharded_state(self.model, self.optimizer)

    def load_sharded_state_dict(self, state: dict[str, Any]) -> None:
        from rllm_torch.backends.torch_backend.sharding import load_sharded_state

        load_sharded_state(self.model, self.optimizer, state)

    def rank_state_dict(self) -> dict[str, Any]:
        """This rank's sampling generator."""
        return {"rollout_generator": self.rollout_engine.generator.get_state()}

    def load_rank_state_dict(self, state: dict[str, Any]) -> None:
        self.rollout_engine.generator.set_state(state["rollout_generator"])

    def save_checkpoint(self, name: str) -> Path | None:
        """Save the model and tokenizer to ``{run_dir}/checkpoints/{name}`` (``save_pretrained``;
        rank 0 writes and returns the path; with FSDP every rank must call, to gather the weights)."""
        path = self.run_dir / "checkpoints" / name
        if self.sharded:
            from rllm_torch.backends.torch_backend.sharding import full_model_state

            state = full_model_state(self.model)
            if not self.ranks.is_main:
                return None
            unsharded = build_policy(self.config.model, self.tokenizer, seed=self.settings.seed)
            unsharded.load_state_dict(state)
            unsharded.save_pretrained(path)
        elif self.ranks.is_main:
            self.model.save_pretrained(path)
        else:
            return None
        self.tokenizer.save_pretrained(path)
        return path

    async def on_train_end(self, trainer_state: TrainerState) -> None:
        """Export the trained model as ``checkpoints/final`` (``model.path=`` loads it; rank 0
        writes it); the trainer's resumable checkpoints are ``checkpoints/step_*``."""
        self.save_checkpoint("final")
