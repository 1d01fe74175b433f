"""The settings a resumed run must share with its checkpoint, and the check that they do."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from rllm_torch.errors import CheckpointMismatchError

__all__ = ["FINGERPRINT_KEYS", "config_fingerprint", "check_fingerprint"]

#: Dotted config keys that resuming cannot change: the model's shape, the data and its order,
#: what the advantages mean, and the seeds. Missing keys (a custom config) are recorded as None.
#: Not here, so a resumed run may change them: epochs and total_batches (to train longer), logging,
#: validation and checkpoint frequency, the learning rate.
FINGERPRINT_KEYS = (
    "model.path",
    "model.arch",
    "model.num_layers",
    "model.hidden_size",
    "model.num_heads",
    "model.max_positions",
    "model.pad_token",
    "task.name",
    "task.seed",
    "task.train_size",
    "task.max_sum",
    "task.train_path",
    "task.prompt_key",
    "task.answer_key",
    "task.min_digits",
    "task.max_digits",
    "task.apply_chat_template",
    "data.train_batch_size",
    "data.shuffle",
    "rllm.algorithm.adv_estimator",
    "rllm.algorithm.norm_adv_by_std_in_grpo",
    "rllm.algorithm.estimator_map",
    "rllm.algorithm.loss_fn",
    "rllm.rollout.n",
    "rllm.rejection_sample.enable",
    "backend.name",
    "backend.seed",
    "backend.parallelism",
    "seed",
)


def config_fingerprint(config: DictConfig, *, world_size: int = 1) -> dict[str, Any]:
    """``{dotted key: plain value}`` for every key of :data:`FINGERPRINT_KEYS`, and
    ``world_size``: the number of processes (each rank's data share and generator depend on it)."""
    values: dict[str, Any] = {"world_size": world_size}
    for key in FINGERPRINT_KEYS:
        value = OmegaConf.select(config, key, default=None)
        values[key] = OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value
    return values


_ADDED_KEY_DEFAULTS = {
    "task.min_digits": 6,
    "task.max_digits": 6,
    "task.apply_chat_template": False,
    "model.pad_token": None,
}


def check_fingerprint(saved: dict[str, Any], current: dict[str, Any], checkpoint: str) -> None:
    """Compare a checkpoint's fingerprint with the current config's.

    Raises:
        CheckpointMismatchError: some key differs; the message lists each key with the
            checkpoint's value and the current one, and the ways out.
    """
    # checkpoints from before these keys existed were one process with no sharding, the
    # reverse task's default lengths, no chat template and the tokenizer's own pad token
    saved = {"world_size": 1, "backend.parallelism": "ddp", **_ADDED_KEY_DEFAULTS, **saved}
    changed = {
        k: (saved.get(k), current.get(k)) for k in sorted(set(saved) | set(current)) if saved.get(k) != current.get(k)
    }
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
