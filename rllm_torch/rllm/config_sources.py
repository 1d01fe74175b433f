"""Where :meth:`AlgorithmConfig.from_config <rllm_torch.rllm.config.AlgorithmConfig.from_config>`
reads each field, with rLLM's keyword arguments:

* a whole run config (it has a top-level ``rllm`` or ``algorithm`` key): each field from its
  declared key, else its aliases: ``rllm.algorithm.adv_estimator`` (or verl's top-level
  ``algorithm.adv_estimator``), ``rllm.algorithm.<field>``, ``gamma`` and ``lam`` also as
  ``algorithm.*``, ``rllm.stepwise_advantage.{mode, normalize_by_steps, gamma,
  step_advantage_w}`` (and rLLM's older ``rllm.stepwise_advantage.{norm_adv_by_std_in_grpo, use_rllm}``);
* anything else is rLLM's ``rllm.algorithm`` section (``{"adv_estimator": "rloo", ...}``): its
  keys are the last parts of the ``rllm.algorithm.*`` keys; the stepwise mode and the estimator
  map come from the keywords, as in rLLM. A key that is neither an ``AlgorithmConfig`` field nor
  one of the section's trainer settings (:data:`SECTION_TRAINER_KEYS`) is refused, naming it.

``episilon`` is the deprecated ``epsilon``. A ``rollout_correction`` left out, or without
``tis_cap``, has ``tis_cap=2.0`` (rLLM's ``from_config`` and ``base.yaml``; its dataclass's is 5.0:
rllm/trainer/algorithms/config.py)."""

from __future__ import annotations

import warnings
from typing import Any

from rllm_torch.core.errors import ConfigError
from rllm_torch.rllm.config_fields import RolloutCorrectionConfig
from rllm_torch.rllm.settings import declared, with_schema_defaults

__all__ = ["algorithm_fields_from", "SECTION_TRAINER_KEYS"]

#: Keys of the ``rllm.algorithm`` section that are trainer settings, not ``AlgorithmConfig``
#: fields (a section read by ``from_config`` may hold them; the trainer's typed config reads them).
SECTION_TRAINER_KEYS = frozenset(
    {
        "loss_agg_horizon",
        "use_kl_loss",
        "kl_loss_coef",
        "kl_loss_type",
        "use_bias_correction_kl",
        "use_kl_in_reward",
        "kl_penalty",
        "kl_coef",
        "filter_groups",
    }
)


def _plain(value: Any) -> Any:
    try:
        from omegaconf import OmegaConf
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        return value
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def _select(config: Any, path: str) -> Any:
    node = config
    for part in path.split("."):
        if node is None or not hasattr(node, "get"):
            return None
        node = node.get(part)
    return _plain(node)


def _is_whole_config(config: Any) -> bool:
    return hasattr(config, "get") and (config.get("rllm") is not None or config.get("algorithm") is not None)


def algorithm_fields_from(
    cls: type, config: Any, *, stepwise_advantage_mode: str | None, estimator_map: dict | None
) -> dict[str, Any]:
    """The ``AlgorithmConfig`` keyword arguments ``config`` gives (see ``from_config``).

    Raises:
        ConfigError: see ``AlgorithmConfig.from_config``.
    """
    if config is None or not hasattr(config, "get"):
        raise ConfigError(
            f"AlgorithmConfig.from_config takes a run config or its rllm.algorithm section (a DictConfig or dict), "
            f"got {type(config).__name__}."
        )
    fields = declared(cls)
    if _is_whole_config(config):
        given = {name: _pick(config, s.key, *s.aliases) for name, s in fields.items()}
        episilon = _pick(config, "rllm.algorithm.episilon")
    else:
        section = {k: _plain(v) for k, v in config.items()}
        by_key = {s.key.rpartition(".")[2]: name for name, s in fields.items() if s.key.startswith("rllm.algorithm.")}
        unknown = sorted(set(section) - set(by_key) - SECTION_TRAINER_KEYS - {"episilon"})
        if unknown:
            raise ConfigError(
                f"AlgorithmConfig.from_config: {unknown[0]!r} is not a key of the rllm.algorithm section (its keys: "
                f"{', '.join(sorted(by_key))}). To read a whole run config, pass it whole (it has a top-level 'rllm')."
            )
        given = {name: section.get(key) for key, name in by_key.items()}
        episilon = section.get("episilon")
    if episilon is not None:
        warnings.warn("`episilon` is deprecated; use `rllm.algorithm.epsilon`.", DeprecationWarning, stacklevel=4)
        if given["epsilon"] is not None and given["epsilon"] != episilon:
            raise ConfigError(
                f"rllm.algorithm.epsilon={given['epsilon']!r} and the deprecated episilon={episilon!r} differ; keep only epsilon."
            )
        given["epsilon"] = episilon
    if stepwise_advantage_mode is not None:
        if given.get("stepwise_advantage_mode") not in (None, stepwise_advantage_mode):
            raise ConfigError(
                f"stepwise_advantage_mode={stepwise_advantage_mode!r} (keyword) and rllm.stepwise_advantage.mode="
                f"{given['stepwise_advantage_mode']!r} (config) differ; give one."
            )
        given["stepwise_advantage_mode"] = stepwise_advantage_mode
    if estimator_map:
        merged = dict(given.get("estimator_map") or {})
        for role, value in dict(estimator_map).items():
            if role in merged and _plain(merged[role]) != _plain(value):
                raise ConfigError(
                    f"estimator_map[{role!r}] is {merged[role]!r} in the config and {value!r} in the keyword "
                    "(the trainer's traj_group_adv_estimator_map); give one."
                )
            merged[role] = value
        given["estimator_map"] = merged
    # rLLM's from_config reads an absent tis_cap as 2.0 (its base.yaml's), not its dataclass's 5.0
    given["rollout_correction"] = with_schema_defaults(RolloutCorrectionConfig, given.get("rollout_correction"))
    return {name: value for name, value in given.items() if value is not None}  # absent: the defaults


def _pick(config: Any, *paths: str) -> Any:
    found = {p: v for p in paths if (v := _select(config, p)) is not None}
    if len({repr(v) for v in found.values()}) > 1:
        raise ConfigError(f"conflicting values for one setting: {found}; set only one of {', '.join(paths)}.")
    return next(iter(found.values()), None)
