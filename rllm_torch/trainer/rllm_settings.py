"""rLLM's settings that have another home here, and the keys of rLLM's backends.

rLLM's common keys are accepted with rLLM's meaning and written into the setting that does the
same here (:func:`resolve_rllm_settings`, at the start of every check of a run config), so the
rest of the package reads one key:

=====================================  =============================================
rLLM's key                             here
=====================================  =============================================
``data.max_response_length``           ``rllm.rollout.max_new_tokens``
``model.name``                         ``model.path``
``rllm.algorithm.eps_clip``            ``backend.clip_ratio_low`` (and ``_high`` when
                                       ``eps_clip_high`` is null)
``rllm.algorithm.eps_clip_high``       ``backend.clip_ratio_high``
=====================================  =============================================

A setting given both ways must agree (a value at its schema default counts as not given).
``data.max_prompt_length`` (the longest prompt, in tokens) and ``data.val_batch_size`` (tasks per
validation sampling call) keep their own keys. The common keys of rLLM's verl and tinker backends
(``actor_rollout_ref.actor.optim.lr``, ``training.learning_rate``, ``model.lora_rank``, ...) are
not settings here; :func:`key_hint` names the key that does the same (the command line adds it to
Hydra's "not in the schema" error). A ported ``@hydra.main`` script's configs (the compatibility
package's ``unified`` and ``agent_ppo_trainer``) hold a place for each of them
(:func:`backend_key_places`), so that Hydra composes such an override and
:func:`drop_rllm_backend_keys` refuses it with the same hint.
"""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf, open_dict

from rllm_torch.core.errors import ConfigError
from rllm_torch.rllm.settings import walk
from rllm_torch.trainer.schema import TrainConfig

__all__ = ["resolve_rllm_settings", "key_hint", "RLLM_BACKEND_KEYS", "backend_key_places", "drop_rllm_backend_keys"]

#: rLLM key -> the key here that holds the same setting.
_ALIASES = {
    "data.max_response_length": "rllm.rollout.max_new_tokens",
    "model.name": "model.path",
    "rllm.algorithm.eps_clip": "backend.clip_ratio_low",
    "rllm.algorithm.eps_clip_high": "backend.clip_ratio_high",
}

#: Keys of rLLM's verl and tinker backend configs -> the key here that does the same.
RLLM_BACKEND_KEYS = {
    "actor_rollout_ref.actor.optim.lr": "backend.lr",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "backend.mini_batch_size",
    "actor_rollout_ref.actor.ppo_epochs": "backend.ppo_epochs",
    "actor_rollout_ref.actor.clip_ratio_low": "backend.clip_ratio_low",
    "actor_rollout_ref.actor.clip_ratio_high": "backend.clip_ratio_high",
    "actor_rollout_ref.actor.entropy_coeff": "backend.entropy_coeff",
    "actor_rollout_ref.actor.grad_clip": "backend.grad_clip",
    "actor_rollout_ref.actor.use_kl_loss": "rllm.algorithm.use_kl_loss",
    "actor_rollout_ref.actor.kl_loss_coef": "rllm.algorithm.kl_loss_coef",
    "actor_rollout_ref.actor.loss_agg_mode": "rllm.algorithm.loss_agg_mode",
    "actor_rollout_ref.model.path": "model.path",
    "actor_rollout_ref.model.lora_rank": "model.lora.r",
    "actor_rollout_ref.model.lora_alpha": "model.lora.alpha",
    "actor_rollout_ref.model.enable_gradient_checkpointing": "backend.gradient_checkpointing",
    "actor_rollout_ref.rollout.n": "rllm.rollout.n",
    "actor_rollout_ref.rollout.temperature": "rllm.rollout.temperature",
    "actor_rollout_ref.rollout.top_p": "rllm.rollout.top_p",
    "actor_rollout_ref.rollout.response_length": "rllm.rollout.max_new_tokens",
    "actor_rollout_ref.rollout.name": "backend.rollout.engine",
    "actor_rollout_ref.rollout.gpu_memory_utilization": "backend.rollout.gpu_memory_utilization",
    "trainer.total_epochs": "rllm.trainer.total_epochs",
    "trainer.total_training_steps": "rllm.trainer.total_batches",
    "trainer.test_freq": "rllm.trainer.test_freq",
    "trainer.save_freq": "rllm.trainer.save_freq",
    "trainer.project_name": "rllm.trainer.project_name",
    "trainer.experiment_name": "rllm.trainer.experiment_name",
    "trainer.logger": "rllm.trainer.logger",
    "trainer.n_gpus_per_node": "rllm-torch-torchrun --nproc_per_node",
    "trainer.nnodes": "rllm-torch-torchrun --nnodes",
    "algorithm.adv_estimator": "rllm.algorithm.adv_estimator",
    "model.lora_rank": "model.lora.r",
    "training.learning_rate": "backend.lr",
    "training.group_size": "rllm.rollout.n",
    "training.lr_schedule": "rllm.algorithm.lr_schedule",
    "training.warmup_steps_ratio": "rllm.algorithm.warmup_steps_ratio",
    "training.max_length": "model.max_positions (a model built from scratch) / data.max_prompt_length",
    "training.num_minibatches": "backend.mini_batch_size",
    "training.default_local_dir": "rllm.trainer.default_local_dir",
    "training.resume_mode": "rllm.trainer.resume_mode",
    "training.resume_from_path": "rllm.trainer.resume_from_path",
    "validation.group_size": "rllm.rollout.n_val",
    "sampling.train.temperature": "rllm.rollout.temperature",
    "sampling.train.top_p": "rllm.rollout.top_p",
    "sampling.val.temperature": "rllm.rollout.val_temperature",
    "sampling.val.top_p": "rllm.rollout.val_top_p",
    "rllm.rollout.train.temperature": "rllm.rollout.temperature",
    "rllm.rollout.train.top_p": "rllm.rollout.top_p",
    "rllm.rollout.train.max_tokens": "rllm.rollout.max_new_tokens",
    "rllm.rollout.val.temperature": "rllm.rollout.val_temperature",
    "rllm.rollout.val.top_p": "rllm.rollout.val_top_p",
    "rllm.backend": "backend.name",
    "rllm/backend": "backend.name (the torch backend; rLLM's verl/tinker/fireworks are not here)",
}


def key_hint(key: str) -> str:
    """``" (did you mean backend.lr=...? It is rLLM's verl key for the same setting.)"`` for a key
    of rLLM's backend configs (:data:`RLLM_BACKEND_KEYS`), else ``""``."""
    key = key.lstrip("+~")
    for theirs in (key, key.split("=", 1)[0]):
        if theirs in RLLM_BACKEND_KEYS:
            return f" (did you mean {RLLM_BACKEND_KEYS[theirs]}? {theirs} is a key of rLLM's backends for the same setting.)"
    return ""


#: The value a place holds when the key is not given: None, or ``rllm.backend``'s ``"torch"`` (rLLM's
#: scripts read ``config.rllm.get("backend", ...)``: the solver-judge cookbook's port gets the backend here).
_PLACE_VALUES = {"rllm.backend": "torch"}


def _place_keys() -> list[str]:
    settings = {key for key, _, _ in walk(TrainConfig)}
    return [key for key in RLLM_BACKEND_KEYS if "/" not in key and key not in settings]


def backend_key_places() -> dict[str, Any]:
    """``{key: None}`` (nested) for each key of rLLM's backends (:data:`RLLM_BACKEND_KEYS`) that is
    not a setting here, ``rllm.backend`` holding ``"torch"``: the first config of the compatibility
    package's Hydra configs, so that Hydra composes ``training.learning_rate=2e-5`` (else "Could not
    override") and :func:`drop_rllm_backend_keys` refuses it naming ``backend.lr``."""
    places = OmegaConf.create()
    for key in _place_keys():
        OmegaConf.update(places, key, _PLACE_VALUES.get(key), force_add=True)
    return OmegaConf.to_container(places)


def drop_rllm_backend_keys(config: Any) -> None:
    """Remove the places of :func:`backend_key_places` from a composed config, in place (and the
    sections they leave empty); nothing to do for a config without them.

    Raises:
        ConfigError: one of them was given a value, naming the key here that does the same (:func:`key_hint`).
    """
    keys = _place_keys()
    for key in keys:
        value = OmegaConf.select(config, key, default=None)
        if value is not None and value != _PLACE_VALUES.get(key):
            raise ConfigError(
                f"`{key}={value}` is not a setting of rllm_torch{key_hint(key)} A run reads only the keys of its schema "
                "(rllm_torch/trainer/schema.py)."
            )
    for key in keys:
        path = key.split(".")
        while path:  # the place, then each section it leaves empty (none of them a section of ours)
            *up, name = path
            node = OmegaConf.select(config, ".".join(up)) if up else config
            if node is None or name not in node or (len(path) < len(key.split(".")) and len(node[name]) > 0):
                break
            with open_dict(node):
                del node[name]
            path = up


def _given(config: Any, defaults: Any, key: str) -> Any:
    """The value of ``key`` when it differs from the schema's default (else None: not given)."""
    value = OmegaConf.select(config, key, default=None)
    if value is None:
        return None
    plain = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    return None if plain == OmegaConf.select(defaults, key, default=None) else plain


def _has(config: Any, key: str) -> bool:
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(config, parent, default=None)
    return node is not None and leaf in node


def resolve_rllm_settings(config: Any) -> None:
    """Write rLLM's keys that are given into the key here that does the same (module docstring),
    in place; idempotent.

    Raises:
        ConfigError: a key of rLLM's backends given a value (:func:`drop_rllm_backend_keys`); one
            setting given both ways with different values, or rLLM's key of a torch backend setting
            the run's backend does not have; ``rllm.algorithm.kl_beta``
            other than 0 (rLLM's Fireworks KL coefficient: here ``use_kl_loss`` with ``kl_loss_coef``).
    """
    drop_rllm_backend_keys(config)
    defaults = OmegaConf.structured(TrainConfig)
    for theirs, ours in _ALIASES.items():
        value = _given(config, defaults, theirs)
        if value is None:
            continue
        if not _has(config, ours):  # another backend's settings type the backend section
            raise ConfigError(
                f"{theirs}={value!r} is rLLM's key of {ours}, a setting of the torch backend, and backend.name="
                f"{config.backend.name} has no {ours}: drop {theirs}, and set that backend's own setting."
            )
        current = _given(config, defaults, ours)
        if current is not None and current != value:
            raise ConfigError(
                f"{theirs}={value!r} (rLLM's key) and {ours}={current!r} are one setting here; give one of them, "
                "or the same value."
            )
        OmegaConf.update(config, ours, value, merge=False)
    if (eps := _given(config, defaults, "rllm.algorithm.eps_clip")) is not None and _given(
        config, defaults, "rllm.algorithm.eps_clip_high"
    ) is None:  # rLLM: no eps_clip_high means a symmetric clip
        current = _given(config, defaults, "backend.clip_ratio_high")
        if current is not None and current != eps:
            raise ConfigError(
                f"rllm.algorithm.eps_clip={eps} with no eps_clip_high is a symmetric clip in rLLM, and "
                f"backend.clip_ratio_high={current}: set rllm.algorithm.eps_clip_high={current} (or drop one)."
            )
        OmegaConf.update(config, "backend.clip_ratio_high", eps, merge=False)
    kl_beta = OmegaConf.select(config, "rllm.algorithm.kl_beta", default=0.0)
    if kl_beta:
        raise ConfigError(
            f"rllm.algorithm.kl_beta={kl_beta} is rLLM's KL coefficient of its Fireworks losses; here the KL term is "
            f"rllm.algorithm.use_kl_loss=true rllm.algorithm.kl_loss_coef={kl_beta} (estimator: rllm.algorithm.kl_loss_type)."
        )
