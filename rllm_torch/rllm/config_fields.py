"""The pieces :class:`~rllm_torch.rllm.config.AlgorithmConfig`'s fields are declared with: the
checks of its values, its ``rollout_correction`` section (:class:`RolloutCorrectionConfig`,
rLLM's), and the constants they read (``compat``'s modes and what ``compat="rllm"`` sets, the
batch inputs that are never options)."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from rllm_torch.core.errors import ConfigError
from rllm_torch.core.estimators.scaling import check_discount, check_flag
from rllm_torch.core.losses import LOSS_FNS, TIS_MODES, loss_names, loss_options
from rllm_torch.rllm.settings import check_value, declared, setting

__all__ = [
    "rLLMAdvantageEstimator",
    "RolloutCorrectionConfig",
    "COMPAT_MODES",
    "RLLM_COMPAT_ESTIMATOR_OPTIONS",
    "BATCH_INPUTS",
    "LR_SCHEDULES",
    "load_loss_plugins",
    "check_combinations",
]

LR_SCHEDULES = ("linear", "cosine", "constant")
COMPAT_MODES = ("rllm_torch", "rllm")  # AlgorithmConfig.compat

#: The loss a run takes when its estimator is this one and ``loss_fn`` is not set (rLLM terminal-rl's
#: ``_ESTIMATOR_DEFAULT_LOSS``); any other estimator's run takes ``ppo``.
ESTIMATOR_DEFAULT_LOSS = {"echo": "echo"}


def default_loss_fn(estimator: object) -> str:
    """The loss a run with ``estimator`` (a name, or the enum's member: a str) trains with when
    ``loss_fn`` is not set."""
    return ESTIMATOR_DEFAULT_LOSS.get(estimator, "ppo")


#: ``compat="rllm"``: the estimator options that give rLLM's numbers where ours differ on purpose
#: (an option the config sets itself wins). REINFORCE++ baseline: rLLM's code centres a group of
#: one on its own reward (its advantage 0, its docstring and verl say baseline 0, which we keep).
RLLM_COMPAT_ESTIMATOR_OPTIONS: dict[str, dict[str, Any]] = {
    "reinforce_plus_plus_baseline": {"singleton_baseline": "mean"},
}


class rLLMAdvantageEstimator(str, Enum):  # noqa: N801 - rLLM's public name
    """The built-in advantage estimators (rLLM's enum, plus ``PRPO``, ``OPO``, ``PASS_AT_K``,
    ``GRPO_PASSK``, ``GPG``, ``GDPO``, ``MAXRL``, ``REMAX`` and the token-level ``REINFORCE_PLUS_PLUS``, ``GAE`` and
    ``OPTIMAL_TOKEN_BASELINE``; ``ECHO`` is rLLM's ``terminal-rl`` branch's).

    ``rLLMAdvantageEstimator("anything else")`` gives ``OTHER``, as in rLLM (``_missing_``).
    :class:`AlgorithmConfig` does not go through that fallback: a custom name stays a str.
    """

    GRPO = "grpo"
    REINFORCE = "reinforce"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    RLOO = "rloo"
    PRPO = "prpo"
    OPO = "opo"
    PASS_AT_K = "pass_at_k"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    GAE = "gae"
    GRPO_PASSK = "grpo_passk"
    GPG = "gpg"
    GDPO = "gdpo"
    MAXRL = "maxrl"
    OPTIMAL_TOKEN_BASELINE = "optimal_token_baseline"
    REMAX = "remax"
    # rLLM's ECHO (branch terminal-rl, arXiv:2605.24517): GRPO's advantages; its loss ``echo`` adds a
    # cross-entropy term on the environment-observation tokens
    ECHO = "echo"
    OTHER = "other"

    @classmethod
    def _missing_(cls, value: object) -> rLLMAdvantageEstimator:
        return cls.OTHER


def estimator_name(value: object, where: str) -> rLLMAdvantageEstimator | str:
    """A built-in name as the enum member, a custom name kept as its str."""
    if isinstance(value, rLLMAdvantageEstimator):
        return value
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where} must be a non-empty estimator name (str), got {value!r}.")
    builtin = {member.value for member in rLLMAdvantageEstimator}
    return rLLMAdvantageEstimator(value) if value in builtin else value


def split_pairs(estimator_map: object, loss_fn_map: object) -> tuple[dict, dict[str, str]]:
    """rLLM's ``estimator_map`` values: a name, or an ``(estimator, loss_fn)`` pair whose loss goes
    into ``loss_fn_map`` (a list, as a YAML or command-line config gives it, too)."""
    if not isinstance(estimator_map, dict):
        raise ConfigError(f"estimator_map must map group roles to estimator names, got {type(estimator_map).__name__}.")
    if not isinstance(loss_fn_map, dict):
        raise ConfigError(f"loss_fn_map must map group roles to policy loss names, got {type(loss_fn_map).__name__}.")
    estimators, losses = {}, dict(loss_fn_map)
    for role, value in estimator_map.items():
        where = f"estimator_map[{role!r}]"
        if isinstance(value, (tuple, list)):
            if len(value) != 2:
                raise ConfigError(
                    f"{where}={list(value)!r}: a pair is [estimator, loss_fn] (e.g. [grpo, ppo]), or give the estimator alone."
                )
            value, loss = value
            if role in losses and losses[role] != loss:
                raise ConfigError(f"{where} names loss {loss!r} but loss_fn_map[{role!r}]={losses[role]!r}; give one.")
            losses[role] = loss
        estimators[role] = estimator_name(value, where)
    for role, loss in losses.items():
        if loss not in loss_names():
            raise ConfigError(
                f"role {role!r}: policy loss {loss!r} is not one of {loss_names()} (estimator_map / loss_fn_map); "
                "register your own with @register_loss(name) in a module the run imports (imports=[module])."
            )
    return estimators, losses


def flag(name: str) -> Callable[[Any], bool]:
    return functools.partial(check_flag, name=name)


def discount(name: str) -> Callable[[Any], float]:
    return functools.partial(check_discount, name=name)


def integer(name: str) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name} must be an int, got {value!r}.")
        return value

    return check


def loss_name(value: Any) -> str:
    """A built-in loss or one registered with ``register_loss`` (checked when the run is
    checked, after ``imports`` ran)."""
    if value not in loss_names():
        raise ValueError(  # check_value names the key
            f"{value!r} is not one of the policy losses {', '.join(loss_names())}; register your own with "
            "@register_loss(name) in a module the run imports (rllm-torch-train imports=[module])."
        )
    return value


def load_loss_plugins(modules: Any) -> list[str]:
    """Import each module of ``modules``, in order, so that the losses it registers
    (``@register_loss``) can be named: rLLM's ``algorithm.loss_plugins`` (branch ``terminal-rl``,
    ``load_loss_plugins`` in rllm/trainer/algorithms/loss.py). A module already imported is not run
    again. ``rllm-torch-train imports=[...]`` does the same for any module.

    Returns:
        ``modules`` as a list.

    Raises:
        ConfigError: not a list of module names; a module that cannot be imported (its name and why).
    """
    if isinstance(modules, str) or not isinstance(modules, Sequence) or not all(isinstance(m, str) for m in modules):
        raise ConfigError(f"rllm.algorithm.loss_plugins must be a list of module names, got {modules!r}.")
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any failure of the user's module stops the start-up, named
            raise ConfigError(
                f"rllm.algorithm.loss_plugins: cannot import {name!r} ({type(exc).__name__}: {exc}); give a module on "
                "the Python path (e.g. PYTHONPATH=. for ./my_losses.py)."
            ) from exc
    return list(modules)


_RATIO_LOSS_FNS = tuple(n for n in LOSS_FNS if "importance_sampling_level" in loss_options(n))  # with a ratio


def check_combinations(config: Any) -> None:
    """The checks of an ``AlgorithmConfig`` that read two fields.

    Raises:
        ConfigError: ``normalize_by_steps`` with a stepwise mode other than ``broadcast``;
            ``importance_sampling_level="sequence"`` with a loss that has no importance ratio.
    """
    if config.normalize_by_steps and config.stepwise_advantage_mode != "broadcast":
        raise ConfigError(
            "rllm.stepwise_advantage.normalize_by_steps divides by the trajectory's number of steps, which the policy "
            f"chooses: it applies to mode=broadcast only, not {config.stepwise_advantage_mode!r}."
        )
    for where, loss in config.losses_in_use().items():
        if config.importance_sampling_level == "sequence" and loss not in _RATIO_LOSS_FNS:
            raise ConfigError(
                f"importance_sampling_level='sequence' (GSPO) sets the importance ratio of a ratio loss "
                f"({', '.join(_RATIO_LOSS_FNS)}); {where}={loss!r} has none. Pick one of those, or leave the level 'token'."
            )


#: Keyword-only parameters of the built-in estimators that are tensors of the batch, given with the
#: rewards by the per-role rule (``remax``'s greedy rewards, which the trainer samples), never options.
BATCH_INPUTS = frozenset({"baselines"})


def estimator_options_check(value: object) -> dict[str, dict[str, Any]]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, dict) for k, v in value.items()):
        raise ConfigError(
            "estimator_options must map estimator names to {option: value} dicts, e.g. "
            f"rllm.algorithm.estimator_options.pass_at_k.k=2; got {value!r}."
        )
    for name, options in value.items():
        if given := sorted(BATCH_INPUTS & set(options)):
            raise ConfigError(
                f"estimator_options.{name}.{given[0]} is not an option: it is a tensor of each batch (remax's baselines are "
                "the greedy rollouts' rewards, which the trainer samples); drop it."
            )
    return value


@dataclass
class RolloutCorrectionConfig:
    """rLLM's ``rollout_correction`` (``rllm.algorithm.rollout_correction``): the correction of the
    gap between the sampler's and the trainer's log-probs (truncated importance sampling and its
    masks, verl's rejection sampling, TRL's OPSM). rLLM's three fields first, in its order.

    Attributes:
        tis_mode: None (off), ``"token"`` / ``"sequence"`` (truncated IS at that level), or
            ``"token_mask"`` / ``"sequence_mask"`` (TRL's masks).
        bypass_mode: True: the rollout log-probs are pi_old (no recomputation); None / False: recomputed.
        tis_cap: the cap C of the importance weight (truncated above C, or masked beyond C); 5.0
            here as in rLLM's dataclass, 2.0 in a run config and from ``AlgorithmConfig.from_config``
            (rLLM's ``base.yaml`` and ``from_config``: rllm/trainer/algorithms/config.py).
        tis_cap_lower: the mask modes' lower cap (token_mask with 0.5 and tis_cap 5: IcePop's mask).
        rollout_rs: rejection sampling by ``log(pi_old / pi_rollout)`` (verl's option names, comma-separated).
        rollout_rs_threshold: its bounds (verl's syntax).
        off_policy_mask_threshold: TRL's OPSM threshold; None: off.
    """

    tis_mode: str | None = setting(
        None,
        "null (off) | token | sequence (truncated IS) | token_mask | sequence_mask (TRL's masks)",
        choices=TIS_MODES,
    )
    bypass_mode: bool | None = setting(
        None, "true: the rollout log-probs are pi_old (no recomputation); null/false: recomputed"
    )
    tis_cap: float = setting(  # rLLM: 5.0 in the dataclass, 2.0 in its base.yaml and from_config
        5.0,
        "the cap C of the importance weight (truncated above C, or masked beyond C)",
        minimum=1,
        schema_default=2.0,
    )
    tis_cap_lower: float | None = setting(
        None,
        "the mask modes' lower cap (token_mask with 0.5 and tis_cap 5: IcePop's two-sided mask); null: none",
        minimum=0,
        maximum=1,
        exclusive_minimum=True,
    )
    rollout_rs: str | None = setting(
        None, "rejection sampling by log(pi_old / pi_rollout): token_k1 ... seq_max_k3, comma-separated (verl's)"
    )
    rollout_rs_threshold: str | None = setting(
        None, "its bounds: one for all or one per option; k1: 'lower_upper' or an upper (verl's syntax)"
    )
    off_policy_mask_threshold: float | None = setting(
        None,
        "drop a negative-advantage sequence whose mean log(pi_rollout / pi) exceeds it (TRL's OPSM); null: off",
        minimum=0,
    )

    def __post_init__(self) -> None:
        for name, declaration in declared(RolloutCorrectionConfig).items():
            setattr(self, name, check_value(getattr(self, name), declaration, f"rollout_correction.{name}"))


def rollout_correction_check(value: object) -> RolloutCorrectionConfig:
    if isinstance(value, RolloutCorrectionConfig):
        return value
    if isinstance(value, dict):
        known = {f for f in declared(RolloutCorrectionConfig)}
        if unknown := sorted(set(value) - known):
            raise ConfigError(
                f"rollout_correction has no field {unknown[0]!r}; its fields: {', '.join(sorted(known))}."
            )
        return RolloutCorrectionConfig(**value)
    raise ConfigError(f"rollout_correction must be a RolloutCorrectionConfig or a dict, got {type(value).__name__}.")
