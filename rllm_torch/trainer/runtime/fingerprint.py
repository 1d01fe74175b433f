"""What a checkpoint means: every setting of a run is either in its fingerprint (a resumed run must
have the same value) or resumable (a resumed run may change it, and the new value applies from the
resumed step on). Both tables are read from the settings' declarations
(:mod:`rllm_torch.trainer.schema`; a backend's own settings for its ``backend`` section, where a
field declared without :func:`~rllm_torch.rllm.settings.setting` is fingerprinted): a setting is declared ``resumable=True`` when the code reads it
where it is used (not from a checkpoint) and a run that changes it halfway is still one run
(learning rate and schedule, step counts, logging, validation and checkpoint frequency, how work
is batched or retried); otherwise it is fingerprinted.

A checkpoint written before a key was added to the fingerprint resumes as if it had the key's
schema default (the value every run had before the key existed).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from omegaconf import Container, OmegaConf

from rllm_torch.core.errors import CheckpointMismatchError
from rllm_torch.rllm.config_fields import default_loss_fn
from rllm_torch.rllm.settings import walk
from rllm_torch.trainer.model_defaults import learning_rates
from rllm_torch.trainer.schema import BackendConfig, TrainConfig, backend_section, schema_of

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

#: Settings a resumed run cannot change (their declarations in the schema are not ``resumable``):
#: anything that shapes the model or its state, the data and its order, the samples, the rewards,
#: the advantages or the loss. A change is a CheckpointMismatchError naming the key.
FINGERPRINT_KEYS: tuple[str, ...] = tuple(key for key, s, _ in walk(TrainConfig) if not s.resumable)

#: Settings a resumed run may change (declared ``resumable``): the new value applies from the
#: resumed step on, the start-up summary says "changed on resume: <key> <old> -> <new>" and
#: RUN_DIR/resumes.jsonl records it.
RESUMABLE_KEYS: tuple[str, ...] = tuple(key for key, s, _ in walk(TrainConfig) if s.resumable)

#: 2: every setting is in one of the two tables; 1 (no version recorded): the first fingerprint,
#: 29 keys, compared on those alone.
FINGERPRINT_VERSION = 2
_VERSION = "fingerprint_version"
_LOSS_FN = "rllm.algorithm.loss_fn"
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


@cache
def _tables(schema: type) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``schema``'s (fingerprinted, resumable) keys: :data:`FINGERPRINT_KEYS` and :data:`RESUMABLE_KEYS`
    for :class:`TrainConfig`, a backend's own settings' for its ``backend`` section."""
    if schema is TrainConfig:
        return FINGERPRINT_KEYS, RESUMABLE_KEYS
    rows = walk(schema)
    return tuple(k for k, s, _ in rows if not (s and s.resumable)), tuple(k for k, s, _ in rows if s and s.resumable)


def config_fingerprint(config: Any, *, world_size: int = 1) -> dict[str, Any]:
    """The value of every key of :data:`FINGERPRINT_KEYS` (of the config's schema: a backend's
    settings in its ``backend`` section), ``world_size`` (the number of processes: each rank's
    data share and generator depend on it) and the format version. ``rllm.algorithm.loss_fn``
    left null is the loss it stands for (``ppo``, or the estimator's own: ``echo``), so that a
    run naming it and one leaving it null are one run (and a checkpoint written when the
    schema's default was ``ppo`` resumes)."""
    keys = _tables(schema_of(config))[0]
    values = _values(config, keys)
    if _LOSS_FN in values and values[_LOSS_FN] is None:
        values[_LOSS_FN] = default_loss_fn(OmegaConf.select(config, "rllm.algorithm.adv_estimator", default=None))
    return {_VERSION: FINGERPRINT_VERSION, "world_size": world_size, **values}


def resumable_settings(config: Any) -> dict[str, Any]:
    """The value of every key of :data:`RESUMABLE_KEYS` (of the config's schema; what a checkpoint
    records, so that a resumed run can say what it changed); a torch backend's learning rate left
    ``null`` is the one the run trains with (:func:`~rllm_torch.trainer.model_defaults.learning_rates`)."""
    schema = schema_of(config)
    rates = learning_rates(config) if issubclass(backend_section(schema), BackendConfig) else {}
    return _values(config, _tables(schema)[1]) | rates


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
