"""rLLM's algorithm configuration: ``rLLMAdvantageEstimator`` and ``AlgorithmConfig``."""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Literal

from rllm_torch.core.errors import ConfigError
from rllm_torch.core.losses import IMPORTANCE_SAMPLING_LEVELS, LOSS_FNS, loss_options

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = ["rLLMAdvantageEstimator", "AlgorithmConfig", "STEPWISE_MODES", "TURN_MODES"]

TURN_MODES = ("turn_level", "mt_grpo", "gigpo")  # the modes with one advantage per step
STEPWISE_MODES = ("broadcast", *TURN_MODES)

_RATIO_LOSS_FNS = tuple(n for n in LOSS_FNS if "importance_sampling_level" in loss_options(n))  # with a ratio
_LR_SCHEDULES = ("linear", "cosine", "constant")


class rLLMAdvantageEstimator(str, Enum):  # noqa: N801 - rLLM's public name
    """The built-in advantage estimators (rLLM's enum, plus ``PRPO``, ``OPO``, ``PASS_AT_K``,
    ``GRPO_PASSK``, ``GPG``, ``GDPO`` and the token-level ``REINFORCE_PLUS_PLUS`` and ``GAE``).

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
    OTHER = "other"

    @classmethod
    def _missing_(cls, value: object) -> rLLMAdvantageEstimator:
        return cls.OTHER


def _estimator_name(value: object, where: str) -> rLLMAdvantageEstimator | str:
    """A built-in name as the enum member, a custom name kept as its str."""
    if isinstance(value, rLLMAdvantageEstimator):
        return value
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where} must be a non-empty estimator name (str), got {value!r}.")
    builtin = {member.value for member in rLLMAdvantageEstimator}
    return rLLMAdvantageEstimator(value) if value in builtin else value


def _choice(value: object, choices: tuple, where: str) -> Any:
    if value not in choices:
        raise ConfigError(f"{where} must be one of {', '.join(map(repr, choices))}; got {value!r}.")
    return value


@dataclass
class AlgorithmConfig:
    """Algorithm parameters of a training run (rLLM's ``AlgorithmConfig``, with three additions:
    ``epsilon``, ``std_correction`` and custom estimator names kept as given).

    Attributes:
        use_rllm: ignored; kept for rLLM configs (a ``True`` value warns that it does nothing).
        estimator: default estimator: an ``rLLMAdvantageEstimator`` or a registered custom name.
        estimator_map: group role → estimator name, overriding ``estimator`` for that role.
        stepwise_advantage_mode: how a multi-step trajectory's steps are credited
            (:mod:`rllm_torch.rllm.stepwise`): ``"broadcast"`` (the trajectory advantage goes to
            every step), ``"turn_level"``, ``"mt_grpo"`` or ``"gigpo"``; rLLM's ``"per_step"``
            is deprecated and becomes ``"broadcast"`` with a ``DeprecationWarning``.
        norm_adv_by_std_in_grpo: divide GRPO advantages by the group std (False: Dr. GRPO).
        use_precomputed_advantage: use ``step.advantage`` written by the workflow instead of an
            estimator; steps missing one get 0.
        loss_fn: policy loss: importance_sampling, ppo, cispo, dro, cross_entropy, or None.
        lr_schedule: linear, cosine or constant.
        warmup_steps_ratio: fraction of the steps used for warm-up, in ``[0, 1]``.
        epsilon: added to the std in GRPO / REINFORCE++ baseline / PRPO denominators.
        std_correction: 0 = population std (rLLM), 1 = sample std (verl).
        gamma: discount of the token-level estimators (``reinforce_plus_plus``, ``gae``), in
            ``[0, 1]`` (verl's ``algorithm.gamma``).
        lam: GAE's ``lambda``, in ``[0, 1]`` (verl's ``algorithm.lam``).
        estimator_options: estimator name → ``{option: value}``, the options of that estimator
            beyond the run-wide ones (e.g. ``{"pass_at_k": {"k": 2}, "gae": {"whiten": False}}``).
        importance_sampling_level: the importance ratio of the ratio losses (ppo,
            importance_sampling, cispo): ``"token"``, or ``"sequence"`` (GSPO's length-normalised
            sequence ratio; TRL's name).
        normalize_by_steps: broadcast only: divide each step's advantage by its trajectory's
            number of steps (rLLM's ``rllm.stepwise_advantage.normalize_by_steps``).
        stepwise_gamma: the discount per turn of the turn modes' returns, in ``[0, 1]``
            (``rllm.stepwise_advantage.gamma``; ``gamma`` is per token).
        step_advantage_w: GiGPO's weight of the step advantage (verl-agent's name).
    """

    use_rllm: bool = False
    estimator: rLLMAdvantageEstimator | str = rLLMAdvantageEstimator.GRPO
    estimator_map: dict[str, rLLMAdvantageEstimator | str] = field(default_factory=dict)
    stepwise_advantage_mode: Literal["broadcast", "per_step", "turn_level", "mt_grpo", "gigpo"] = "broadcast"
    norm_adv_by_std_in_grpo: bool = True
    use_precomputed_advantage: bool = False
    loss_fn: str | None = None  # one of rllm_torch.core.losses.LOSS_FNS
    lr_schedule: Literal["linear", "cosine", "constant"] = "constant"
    warmup_steps_ratio: float = 0.0
    epsilon: float = 1e-6
    std_correction: int = 0
    gamma: float = 1.0
    lam: float = 1.0
    estimator_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    importance_sampling_level: str = "token"  # one of rllm_torch.core.losses.IMPORTANCE_SAMPLING_LEVELS
    normalize_by_steps: bool = False  # the stepwise options, after rLLM's fields (its positional order)
    stepwise_gamma: float = 1.0
    step_advantage_w: float = 1.0

    def __post_init__(self) -> None:
        self.estimator = _estimator_name(self.estimator, "estimator")
        if not isinstance(self.estimator_map, dict):
            raise ConfigError(
                f"estimator_map must map group roles to estimator names, got {type(self.estimator_map).__name__}."
            )
        self.estimator_map = {
            role: _estimator_name(name, f"estimator_map[{role!r}]") for role, name in self.estimator_map.items()
        }
        _choice(self.stepwise_advantage_mode, (*STEPWISE_MODES, "per_step"), "rllm.stepwise_advantage.mode")
        if self.stepwise_advantage_mode == "per_step":
            warnings.warn(
                "The `per_step` mode is deprecated in the unified trainer and is set to `broadcast`. "
                "Use a trajectory grouping hook for per-step advantages.",
                DeprecationWarning,
                stacklevel=3,
            )
            self.stepwise_advantage_mode = "broadcast"
        if self.use_rllm:
            warnings.warn(
                "`use_rllm` is ignored: rllm_torch always uses the rLLM estimators.", DeprecationWarning, stacklevel=3
            )
        for name in ("norm_adv_by_std_in_grpo", "use_precomputed_advantage", "use_rllm", "normalize_by_steps"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be a bool, got {getattr(self, name)!r}.")
        self._check_stepwise()
        if self.loss_fn is not None:
            _choice(self.loss_fn, LOSS_FNS, "loss_fn")
        _choice(self.importance_sampling_level, IMPORTANCE_SAMPLING_LEVELS, "importance_sampling_level")
        if self.importance_sampling_level == "sequence" and (self.loss_fn or "ppo") not in _RATIO_LOSS_FNS:
            raise ConfigError(
                f"importance_sampling_level='sequence' (GSPO) sets the importance ratio of a ratio loss "
                f"({', '.join(_RATIO_LOSS_FNS)}); loss_fn={self.loss_fn!r} has none. Pick one of those, or leave the level 'token'."
            )
        _choice(self.lr_schedule, _LR_SCHEDULES, "lr_schedule")
        if (
            isinstance(self.warmup_steps_ratio, bool)
            or not isinstance(self.warmup_steps_ratio, numbers.Real)
            or not 0 <= self.warmup_steps_ratio <= 1
        ):
            raise ConfigError(f"warmup_steps_ratio must be a number in [0, 1], got {self.warmup_steps_ratio!r}.")
        if isinstance(self.epsilon, bool) or not isinstance(self.epsilon, numbers.Real) or not self.epsilon >= 0:
            raise ConfigError(f"epsilon must be a non-negative number, got {self.epsilon!r}.")
        if isinstance(self.std_correction, bool) or not isinstance(self.std_correction, int) or self.std_correction < 0:
            raise ConfigError(
                f"std_correction must be a non-negative int (0 = population std, 1 = sample std), got {self.std_correction!r}."
            )
        for name in ("gamma", "lam"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value <= 1:
                raise ConfigError(f"rllm.algorithm.{name} must be a number in [0, 1] (1: no discount), got {value!r}.")
        if not isinstance(self.estimator_options, dict) or not all(
            isinstance(k, str) and isinstance(v, dict) for k, v in self.estimator_options.items()
        ):
            raise ConfigError(
                "estimator_options must map estimator names to {option: value} dicts, e.g. "
                f"rllm.algorithm.estimator_options.pass_at_k.k=2; got {self.estimator_options!r}."
            )

    def _check_stepwise(self) -> None:
        if self.normalize_by_steps and self.stepwise_advantage_mode != "broadcast":
            raise ConfigError(
                "rllm.stepwise_advantage.normalize_by_steps divides by the trajectory's number of steps, which the policy "
                f"chooses: it applies to mode=broadcast only, not {self.stepwise_advantage_mode!r}."
            )
        value = self.stepwise_gamma
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value <= 1:
            raise ConfigError(
                f"rllm.stepwise_advantage.gamma must be a number in [0, 1] (1: no discount), got {value!r}."
            )
        value = self.step_advantage_w
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ConfigError(f"rllm.stepwise_advantage.step_advantage_w must be a finite number, got {value!r}.")

    @property
    def estimator_kwargs(self) -> dict[str, Any]:
        """The run-wide options every estimator call gets; each estimator takes those it declares
        (see ``compute_advantages``)."""
        return {
            "norm_adv_by_std_in_grpo": self.norm_adv_by_std_in_grpo,
            "epsilon": self.epsilon,
            "std_correction": self.std_correction,
            "gamma": self.gamma,
            "lam": self.lam,
        }

    def estimator_call_kwargs(self, estimator: rLLMAdvantageEstimator | str) -> dict[str, Any]:
        """``compute_advantages``' keywords for ``estimator``: the run-wide options and its own
        ``estimator_options`` entry."""
        name = estimator.value if isinstance(estimator, Enum) else estimator
        return self.estimator_kwargs | dict(self.estimator_options.get(name, {}))

    def estimator_for(self, role: str) -> rLLMAdvantageEstimator | str:
        """The estimator of a group role: ``estimator_map[role]``, else ``estimator``."""
        return self.estimator_map.get(role, self.estimator)

    @classmethod
    def from_config(cls, config: DictConfig) -> AlgorithmConfig:
        """Build from an OmegaConf config with rLLM's keys.

        Read keys (each optional, defaults as the dataclass): ``rllm.algorithm.adv_estimator``
        (or rLLM's top-level ``algorithm.adv_estimator``), ``rllm.algorithm.{estimator_map,
        norm_adv_by_std_in_grpo, use_precomputed_advantage, loss_fn, importance_sampling_level, lr_schedule,
        warmup_steps_ratio, epsilon, episilon (deprecated), std_correction, gamma, lam,
        estimator_options}`` (``gamma`` and ``lam`` also as verl's top-level ``algorithm.*``),
        ``rllm.stepwise_advantage.{mode, normalize_by_steps, gamma, step_advantage_w,
        norm_adv_by_std_in_grpo, use_rllm}``.

        Raises:
            ValueError: the same key is given in two places with different values, or a value is invalid.
        """

        from omegaconf import DictConfig, OmegaConf  # only here: the rest of the surface runs without it

        def pick(*paths: str) -> Any:
            found = {p: OmegaConf.select(config, p) for p in paths if OmegaConf.select(config, p) is not None}
            if len({repr(v) for v in found.values()}) > 1:
                raise ConfigError(f"conflicting values for one setting: {found}; set only one of {', '.join(paths)}.")
            value = next(iter(found.values()), None)
            return OmegaConf.to_container(value) if isinstance(value, DictConfig) else value

        epsilon = pick("rllm.algorithm.epsilon")
        episilon = pick("rllm.algorithm.episilon")
        if episilon is not None:
            warnings.warn("`episilon` is deprecated; use `rllm.algorithm.epsilon`.", DeprecationWarning, stacklevel=2)
            if epsilon is not None and epsilon != episilon:
                raise ConfigError(
                    f"rllm.algorithm.epsilon={epsilon!r} and the deprecated episilon={episilon!r} differ; keep only epsilon."
                )
            epsilon = episilon
        given = {
            "estimator": pick("rllm.algorithm.adv_estimator", "algorithm.adv_estimator"),
            "estimator_map": pick("rllm.algorithm.estimator_map"),
            "stepwise_advantage_mode": pick("rllm.stepwise_advantage.mode"),
            "normalize_by_steps": pick("rllm.stepwise_advantage.normalize_by_steps"),
            "stepwise_gamma": pick("rllm.stepwise_advantage.gamma"),
            "step_advantage_w": pick("rllm.stepwise_advantage.step_advantage_w"),
            "norm_adv_by_std_in_grpo": pick(
                "rllm.algorithm.norm_adv_by_std_in_grpo", "rllm.stepwise_advantage.norm_adv_by_std_in_grpo"
            ),
            "use_rllm": pick("rllm.stepwise_advantage.use_rllm"),
            "use_precomputed_advantage": pick("rllm.algorithm.use_precomputed_advantage"),
            "loss_fn": pick("rllm.algorithm.loss_fn"),
            "importance_sampling_level": pick("rllm.algorithm.importance_sampling_level"),
            "lr_schedule": pick("rllm.algorithm.lr_schedule"),
            "warmup_steps_ratio": pick("rllm.algorithm.warmup_steps_ratio"),
            "epsilon": epsilon,
            "std_correction": pick("rllm.algorithm.std_correction"),
            "gamma": pick("rllm.algorithm.gamma", "algorithm.gamma"),
            "lam": pick("rllm.algorithm.lam", "algorithm.lam"),
            "estimator_options": pick("rllm.algorithm.estimator_options"),
        }
        return cls(**{name: value for name, value in given.items() if value is not None})  # absent: the defaults
