"""What a checkpoint means: every setting of a run is either in its fingerprint (a resumed run must
have the same value) or resumable (a resumed run may change it, and the new value applies from the
resumed step on). ``tests/trainer/test_resume_settings.py`` fails while a setting of the schema
(``rllm_torch/trainer/schema.py``) is in neither table.

To add a setting, add its dotted key to one table, one line:

* :data:`RESUMABLE_KEYS` when the code reads it where it is used (not from a checkpoint) and a
  run that changes it halfway is still one run: learning rate and schedule, step counts, logging,
  validation and checkpoint frequency, how work is batched or retried;
* :data:`FINGERPRINT_KEYS` otherwise: anything that shapes the model or its state, the data and
  its order, the samples, the rewards, the advantages or the loss.

A checkpoint written before a key was added to the fingerprint resumes as if it had the key's
schema default (the value every run had before the key existed).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from omegaconf import Container, OmegaConf

from rllm_torch.core.errors import CheckpointMismatchError
from rllm_torch.trainer.model_defaults import learning_rates
from rllm_torch.trainer.schema import TrainConfig

__all__ = [
    "FINGERPRINT_KEYS",
    "RESUMABLE_KEYS",
    "FINGERPRINT_VERSION",
    "config_fingerprint",
    "resumable_settings",
    "check_fingerprint",
    "resumable_changes",
    "describe_changes",
]

#: Settings a resumed run cannot change. A change is a CheckpointMismatchError naming the key.
FINGERPRINT_KEYS = (
    # the model, its tokenizer and the reference policy
    "model.path",
    "model.ref_path",
    "model.pad_token",
    "model.arch",
    "model.num_layers",
    "model.hidden_size",
    "model.num_heads",
    "model.max_positions",
    "model.lora.r",  # the adapters' shapes are in the checkpoint
    "model.lora.alpha",
    "model.lora.dropout",
    "model.lora.target_modules",
    # the task: its rows, prompts and reward (reasoning-gym's dataset, a file's path and keys)
    "task.name",
    "task.seed",
    "task.train_size",
    "task.val_size",
    "task.max_sum",
    "task.turns",
    "task.max_number",
    "task.max_turns",
    "task.turn_cost",
    "task.style",
    "task.min_digits",
    "task.max_digits",
    "task.mix_rl",
    "task.dataset",
    "task.train_path",
    "task.val_path",
    "task.prompt_key",
    "task.answer_key",
    "task.reward_fn",
    "task.apply_chat_template",
    "imports",
    # the data order and the batch
    "data.train_batch_size",
    "data.shuffle",
    "seed",
    # sampling
    "rllm.rollout.n",
    "rllm.rollout.n_val",
    "rllm.rollout.temperature",
    "rllm.rollout.top_p",
    "rllm.rollout.val_temperature",
    "rllm.rollout.val_top_p",
    "rllm.rollout.max_new_tokens",
    # which episodes and groups are trained on (the rejection-sampling state accumulates under these)
    "rllm.compact_filtering.enable",
    "rllm.compact_filtering.mask_max_prompt_length_exceeded",
    "rllm.compact_filtering.mask_max_response_length_exceeded",
    "rllm.compact_filtering.mask_env_done",
    "rllm.compact_filtering.mask_max_turns_exceeded",
    "rllm.compact_filtering.mask_timeout",
    "rllm.compact_filtering.mask_unknown",
    "rllm.compact_filtering.mask_error",
    "rllm.rejection_sample.enable",
    "rllm.rejection_sample.multiplier",
    "rllm.rejection_sample.min_partial_solve_tasks",
    "rllm.rejection_sample.min_trajs_per_group",
    "rllm.rejection_sample.filter_uniform_groups",
    "rllm.rejection_sample.uniform_filter_metric",
    # the advantages
    "rllm.algorithm.adv_estimator",
    "rllm.algorithm.norm_adv_by_std_in_grpo",
    "rllm.algorithm.estimator_map",
    "rllm.algorithm.estimator_options",
    "rllm.algorithm.use_precomputed_advantage",
    "rllm.algorithm.epsilon",
    "rllm.algorithm.std_correction",
    "rllm.algorithm.gamma",
    "rllm.algorithm.lam",
    "rllm.stepwise_advantage.mode",
    "rllm.stepwise_advantage.normalize_by_steps",
    "rllm.stepwise_advantage.gamma",
    "rllm.stepwise_advantage.step_advantage_w",
    # the loss, the KL terms and the update
    "rllm.algorithm.loss_fn",
    "rllm.algorithm.loss_agg_mode",
    "rllm.algorithm.loss_agg_horizon",
    "rllm.algorithm.use_kl_loss",
    "rllm.algorithm.kl_loss_coef",
    "rllm.algorithm.kl_loss_type",
    "rllm.algorithm.use_kl_in_reward",
    "rllm.algorithm.kl_penalty",
    "rllm.algorithm.kl_coef",
    "rllm.algorithm.rollout_correction.tis_mode",
    "rllm.algorithm.rollout_correction.tis_cap",
    "rllm.algorithm.rollout_correction.bypass_mode",
    "backend.weight_decay",  # AdamW's, restored with the optimizer state
    "backend.grad_clip",
    "backend.ppo_epochs",
    "backend.mini_batch_size",
    "backend.clip_ratio_low",
    "backend.clip_ratio_high",
    "backend.dro_beta",
    "backend.clip_ratio_c",
    "backend.entropy_coeff",
    "rllm.algorithm.importance_sampling_level",
    "rllm.algorithm.filter_groups.enable",  # which groups make up a batch
    "rllm.algorithm.filter_groups.metric",
    "rllm.algorithm.filter_groups.max_num_gen_batches",
    "backend.critic.enable",
    "backend.critic.weight_decay",
    "backend.critic.grad_clip",
    "backend.critic.cliprange_value",
    "backend.critic.loss_coef",
    # the backend, its generators and its process layout (the world size is recorded too)
    "backend.name",
    "backend.device",
    "backend.seed",
    "backend.parallelism",
    "backend.dtype",  # the numerics of every forward
    # the sampler and the dtype it samples in (its log-probs feed the loss)
    "backend.rollout.engine",
    "backend.rollout.dtype",
)

#: Settings a resumed run may change: the new value applies from the resumed step on, the start-up
#: summary says "changed on resume: <key> <old> -> <new>" and RUN_DIR/resumes.jsonl records it.
RESUMABLE_KEYS = (
    # the learning rates and their schedule (the scheduler keeps its step; backend.lr is its base)
    "backend.lr",
    "backend.critic.lr",
    "rllm.algorithm.lr_schedule",
    "rllm.algorithm.warmup_steps_ratio",
    # how long to train (a schedule's horizon follows the new step count)
    "rllm.trainer.total_epochs",
    "rllm.trainer.total_batches",
    # validation, checkpoints and logs
    "rllm.trainer.test_freq",
    "rllm.trainer.val_before_train",
    "rllm.trainer.val_only",
    "rllm.trainer.save_freq",
    "rllm.trainer.max_checkpoints_to_keep",
    "rllm.trainer.log_table_every",
    "rllm.trainer.logger",
    "rllm.episode_logging.log_episodes",
    "rllm.episode_logging.episode_log_dir",
    # where the run lives and how it resumes
    "rllm.trainer.project_name",
    "rllm.trainer.experiment_name",
    "rllm.trainer.default_local_dir",
    "rllm.trainer.resume_mode",
    "rllm.trainer.resume_from_path",
    # how work is batched, threaded, retried and waited for (not what is computed)
    "rllm.workflow.n_parallel_tasks",
    "rllm.workflow.retry_limit",
    "rllm.workflow.raise_on_error",
    "rllm.workflow.reward_timeout_s",
    "backend.rollout_batch_size",
    "backend.num_threads",
    "backend.dist_timeout_s",
    "backend.micro_batch_tokens",  # micro-batches accumulate the same gradient
    "backend.log_prob_chunk_tokens",
    "backend.gradient_checkpointing",
    "backend.rollout.max_model_len",  # a bound on what fits, checked at start-up
    "backend.rollout.gpu_memory_utilization",
    "backend.rollout.kv_cache_memory_bytes",
    "backend.rollout.enforce_eager",
    "model.gguf_cache_dir",  # a cache: the same file converts to the same weights wherever it lives
    "rllm.algorithm.use_rllm",  # read by nothing (kept for rLLM's configs)
)

#: 2: every setting is in one of the two tables; 1 (no version recorded): the first fingerprint,
#: 29 keys, compared on those alone.
FINGERPRINT_VERSION = 2
_VERSION = "fingerprint_version"
# keys added to the first fingerprint after checkpoints had been written without them, with the
# value those runs had: one process with no sharding, the reverse task's default lengths, no chat
# template and the tokenizer's own pad token
_FIRST_VERSION_DEFAULTS = {
    "world_size": 1,
    "backend.parallelism": "ddp",
    "task.min_digits": 6,
    "task.max_digits": 6,
    "task.apply_chat_template": False,
    "model.pad_token": None,
}


def _values(config: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    """``{dotted key: plain value}`` (None where the config has no such key)."""
    values = {}
    for key in keys:
        value = OmegaConf.select(config, key, default=None)
        values[key] = OmegaConf.to_container(value, resolve=True) if isinstance(value, Container) else value
    return values


@cache
def _schema_defaults() -> dict[str, Any]:
    return _values(OmegaConf.structured(TrainConfig), FINGERPRINT_KEYS + RESUMABLE_KEYS)


def config_fingerprint(config: Any, *, world_size: int = 1) -> dict[str, Any]:
    """The value of every key of :data:`FINGERPRINT_KEYS`, ``world_size`` (the number of
    processes: each rank's data share and generator depend on it) and the format version."""
    return {_VERSION: FINGERPRINT_VERSION, "world_size": world_size, **_values(config, FINGERPRINT_KEYS)}


def resumable_settings(config: Any) -> dict[str, Any]:
    """The value of every key of :data:`RESUMABLE_KEYS` (what a checkpoint records, so that a
    resumed run can say what it changed); a learning rate left ``null`` is the one the run trains
    with (:func:`~rllm_torch.trainer.model_defaults.learning_rates`)."""
    return _values(config, RESUMABLE_KEYS) | learning_rates(config)


def _changed(saved: dict[str, Any], current: dict[str, Any], keys: Any) -> dict[str, tuple[Any, Any]]:
    defaults = _schema_defaults()
    old = {k: saved[k] if k in saved else defaults.get(k) for k in keys}
    return {k: (old[k], current.get(k)) for k in sorted(keys) if old[k] != current.get(k)}


def check_fingerprint(saved: dict[str, Any], current: dict[str, Any], checkpoint: str) -> None:
    """Compare a checkpoint's fingerprint with the current config's. A key the checkpoint did not
    record counts as its schema default; a first-version fingerprint is compared on its own keys.

    Raises:
        CheckpointMismatchError: some key differs; the message lists each key with the
            checkpoint's value and the current one, and the ways out.
    """
    if _VERSION in saved:
        keys = set(current) - {_VERSION}
    else:
        saved = {**_FIRST_VERSION_DEFAULTS, **saved}
        keys = set(saved) & set(current)
    changed = _changed(saved, current, keys)
    if changed:
        lines = "; ".join(f"{k}: {old!r} in the checkpoint, {new!r} now" for k, (old, new) in changed.items())
        ranks = (
            " Launch the same number of processes as the run that wrote it (torchrun --nnodes x --nproc_per_node);"
            " resuming on another world size is not supported, because each rank's data share and generator belong to it"
            " (to go on with another world size, start a new run from the exported model: model.path=<run>/checkpoints/final)."
            if "world_size" in changed
            else ""
        )
        raise CheckpointMismatchError(
            f"cannot resume from {checkpoint}: the config changed since it was saved ({lines}).{ranks} Restore those settings to continue "
            "the run, or start a new run in another directory (rllm.trainer.experiment_name=... or rllm.trainer.default_local_dir=...)."
        )


def resumable_changes(saved: dict[str, Any] | None, current: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{key: (checkpoint's value, current value)}`` for each resumable setting that differs
    (a key the checkpoint did not record counts as its schema default); ``{}`` for a checkpoint
    that recorded none (written before they were recorded)."""
    return _changed(saved, current, current.keys()) if saved is not None else {}


def describe_changes(changes: dict[str, tuple[Any, Any]]) -> str:
    """``"backend.lr 0.001 -> 0.01, rllm.trainer.total_batches 4 -> 8"``."""
    return ", ".join(f"{key} {old} -> {new}" for key, (old, new) in changes.items())
