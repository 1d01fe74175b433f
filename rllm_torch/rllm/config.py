"""rLLM's algorithm configuration, ``AlgorithmConfig``: the one declaration of each of its settings
(default, help, key, bounds, check), from which the schema, the run-wide options and the resume
tables are read. What its fields are checked with is :mod:`~rllm_torch.rllm.config_fields`."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from rllm_torch.core.errors import ConfigError
from rllm_torch.core.estimators.scaling import check_correction, check_epsilon
from rllm_torch.core.losses import AGG_MODES, IMPORTANCE_SAMPLING_LEVELS, LOSS_FNS
from rllm_torch.rllm.config_fields import (
    BATCH_INPUTS,
    COMPAT_MODES,
    ESTIMATOR_DEFAULT_LOSS,
    LR_SCHEDULES,
    RLLM_COMPAT_ESTIMATOR_OPTIONS,
    RolloutCorrectionConfig,
    check_combinations,
    discount,
    estimator_name,
    estimator_options_check,
    flag,
    integer,
    load_loss_plugins,
    loss_name,
    rLLMAdvantageEstimator,
    rollout_correction_check,
    split_pairs,
)
from rllm_torch.rllm.settings import check_value, declared, setting

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = [
    "rLLMAdvantageEstimator",
    "AlgorithmConfig",
    "RolloutCorrectionConfig",
    "STEPWISE_MODES",
    "TURN_MODES",
    "RUN_OPTIONS",
    "BATCH_INPUTS",
    "COMPAT_MODES",
    "RLLM_COMPAT_ESTIMATOR_OPTIONS",
]
TURN_MODES = ("turn_level", "mt_grpo", "gigpo")  # the modes with one advantage per step
STEPWISE_MODES = ("broadcast", *TURN_MODES)


@dataclass
class AlgorithmConfig:
    """Algorithm parameters of a training run (rLLM's ``AlgorithmConfig``: its fields in its
    order, then ours: the run-wide estimator options ``epsilon``, ``std_correction``,
    ``gamma``, ``lam``, each estimator's ``estimator_options``, GSPO's
    ``importance_sampling_level``, the stepwise options, a user loss's ``loss_params`` and
    ``compat``; custom estimator names are kept as given).

    Every field is declared once (:func:`~rllm_torch.rllm.settings.setting`): its default, help,
    run config key (:meth:`from_config` reads it, the trainer's typed config is built from it),
    its check (run here, at construction) and whether every estimator call gets it
    (``run_wide``: :attr:`estimator_kwargs`). The attribute list below is that declaration's help.

    Attributes:
        use_rllm: ignored; kept for rLLM configs (None by default; any other value, ``False``
            included, warns that it does nothing, as rLLM's ``__post_init__`` does).
        estimator: default estimator: an ``rLLMAdvantageEstimator`` or a registered custom name.
        estimator_map: group role → estimator name, overriding ``estimator`` for that role; or
            → an ``(estimator, loss_fn)`` pair (rLLM's), whose loss goes into ``loss_fn_map``.
        loss_fn_map: group role → policy loss, overriding ``loss_fn`` for that role's rows in the
            update (rLLM's ``loss_fn_map``).
        stepwise_advantage_mode: how a multi-step trajectory's steps are credited
            (:mod:`rllm_torch.rllm.stepwise`): ``"broadcast"``, ``"turn_level"``, ``"mt_grpo"``
            or ``"gigpo"``; rLLM's ``"per_step"`` becomes ``"broadcast"`` with a ``DeprecationWarning``.
        norm_adv_by_std_in_grpo: divide GRPO advantages by the group std (False: Dr. GRPO).
        use_precomputed_advantage: use ``step.advantage`` written by the workflow instead of an
            estimator; steps missing one get 0.
        loss_fn: policy loss: a built-in (:data:`~rllm_torch.core.losses.LOSS_FNS`), one
            registered with :func:`~rllm_torch.core.losses.register_loss`, or None (``ppo``; ``echo``'s own).
        lr_schedule: linear, cosine or constant.
        warmup_steps: optimizer steps of learning-rate warm-up; ``<= 0``: ``warmup_steps_ratio``.
        warmup_steps_ratio: fraction of the steps used for warm-up, in ``[0, 1]``.
        kl_beta: rLLM's KL coefficient of its Fireworks losses; here only 0 (the KL term is
            ``use_kl_loss`` / ``kl_loss_coef``; a run refuses another value, naming them).
        eps_clip, eps_clip_high: rLLM's clip epsilons (None high: symmetric); in a run the same
            setting as ``backend.clip_ratio_low`` / ``clip_ratio_high`` (they must agree).
        loss_agg_mode: how per-token losses are reduced (None: ``token-mean``).
        rollout_correction: :class:`RolloutCorrectionConfig`.
        router_replay: rLLM's MoE router replay; only ``"disabled"`` here.
        epsilon: added to the std in GRPO / REINFORCE++ baseline / PRPO denominators.
        std_correction: 0 = population std (rLLM), 1 = sample std (verl).
        gamma: discount of the token-level estimators, in ``[0, 1]`` (verl's ``algorithm.gamma``).
        lam: GAE's ``lambda``, in ``[0, 1]`` (verl's ``algorithm.lam``).
        estimator_options: estimator name → ``{option: value}``, the options of that estimator
            beyond the run-wide ones (e.g. ``{"pass_at_k": {"k": 2}, "gae": {"whiten": False}}``).
        importance_sampling_level: the importance ratio of the ratio losses: ``"token"``, or
            ``"sequence"`` (GSPO's length-normalised sequence ratio; TRL's name).
        loss_params: a registered loss's own parameters (``LossContext.params``; rLLM's
            ``algorithm.loss_params``).
        loss_plugins: modules imported (in order, before ``loss_fn`` is checked) so that the losses
            they register can be named (rLLM ``terminal-rl``'s ``algorithm.loss_plugins``).
        compat: ``"rllm_torch"`` (default) or ``"rllm"``: rLLM's numbers where this package
            differs on purpose (:data:`RLLM_COMPAT`; docs/porting.md).
        normalize_by_steps: broadcast only: divide each step's advantage by its trajectory's
            number of steps (rLLM's ``rllm.stepwise_advantage.normalize_by_steps``).
        stepwise_gamma: the discount per turn of the turn modes' returns, in ``[0, 1]``
            (``rllm.stepwise_advantage.gamma``; ``gamma`` is per token).
        step_advantage_w: GiGPO's weight of the step advantage (verl-agent's name).
    """

    use_rllm: bool | None = setting(
        None,
        "ignored (kept for rLLM configs); set at all (true or false), it warns as rLLM does",
        key="rllm.algorithm.use_rllm",
        aliases=("rllm.stepwise_advantage.use_rllm",),
        resumable=True,  # read by nothing
        check=flag("use_rllm"),
    )
    estimator: rLLMAdvantageEstimator | str = setting(
        rLLMAdvantageEstimator.GRPO,
        "a registered estimator name",
        key="rllm.algorithm.adv_estimator",
        aliases=("algorithm.adv_estimator",),
        schema_type=str,
        schema_default="grpo",
    )
    estimator_map: dict[str, rLLMAdvantageEstimator | str] = setting(
        help="group role -> estimator, or -> [estimator, loss_fn] (rLLM's pairs: the role's loss too)",
        factory=dict,
        key="rllm.algorithm.estimator_map",
        schema_type=dict[str, Any],
    )
    loss_fn_map: dict[str, str] = setting(
        help="group role -> policy loss, overriding loss_fn for that role (rLLM's; also from estimator_map pairs)",
        factory=dict,
        key="rllm.algorithm.loss_fn_map",
        schema_type=dict[str, str],
    )
    stepwise_advantage_mode: str = setting(
        "broadcast",
        "broadcast | turn_level | mt_grpo | gigpo (rllm_torch.rllm.stepwise); per_step: deprecated",
        key="rllm.stepwise_advantage.mode",
        choices=(*STEPWISE_MODES, "per_step"),
    )
    norm_adv_by_std_in_grpo: bool = setting(
        True,
        "False: Dr. GRPO",
        key="rllm.algorithm.norm_adv_by_std_in_grpo",
        aliases=("rllm.stepwise_advantage.norm_adv_by_std_in_grpo",),
        check=flag("norm_adv_by_std_in_grpo"),
        run_wide=True,
    )
    use_precomputed_advantage: bool = setting(
        False,
        "keep the workflow's step.advantage for groups that have one",
        key="rllm.algorithm.use_precomputed_advantage",
        check=flag("use_precomputed_advantage"),
    )
    loss_fn: str | None = setting(
        None,
        "a built-in loss (" + " | ".join(LOSS_FNS) + ") or a registered one; null: ppo (adv_estimator=echo: echo)",
        key="rllm.algorithm.loss_fn",
        check=loss_name,
    )
    lr_schedule: str = setting(
        "constant",
        "constant | linear | cosine",
        key="rllm.algorithm.lr_schedule",
        choices=LR_SCHEDULES,
        resumable=True,
    )
    warmup_steps: int = setting(
        -1,
        "optimizer steps of learning-rate warm-up; <= 0: warmup_steps_ratio (rLLM's)",
        key="rllm.algorithm.warmup_steps",
        check=integer("warmup_steps"),
        resumable=True,
    )
    warmup_steps_ratio: float = setting(
        0.0,
        "share of the steps that warm the learning rate up",
        key="rllm.algorithm.warmup_steps_ratio",
        minimum=0,
        maximum=1,
        resumable=True,
    )
    kl_beta: float = setting(
        0.0,
        "rLLM's Fireworks KL coefficient: only 0 here (use_kl_loss and kl_loss_coef are the KL term)",
        key="rllm.algorithm.kl_beta",
        minimum=0,
    )
    eps_clip: float = setting(
        0.2,
        "rLLM's PPO clip epsilon: backend.clip_ratio_low (and _high when eps_clip_high is null)",
        key="rllm.algorithm.eps_clip",
        minimum=0,
        maximum=1e6,
    )
    eps_clip_high: float | None = setting(
        None,
        "rLLM's upper clip epsilon (null: eps_clip): backend.clip_ratio_high",
        key="rllm.algorithm.eps_clip_high",
        minimum=0,
        maximum=1e6,
    )
    loss_agg_mode: str | None = setting(
        None,
        " | ".join(AGG_MODES) + " (null: token-mean)",
        key="rllm.algorithm.loss_agg_mode",
        choices=AGG_MODES,
        schema_default="token-mean",
    )
    rollout_correction: RolloutCorrectionConfig = setting(
        help="the rollout-vs-trainer log-prob correction (RolloutCorrectionConfig)",
        factory=RolloutCorrectionConfig,
        key="rllm.algorithm.rollout_correction",
        check=rollout_correction_check,
    )
    router_replay: str = setting(
        "disabled",
        "rLLM's MoE router replay (R2, R3 on its verl/Fireworks backends): only disabled here",
        key="rllm.algorithm.router_replay",
        choices=("disabled",),
        note="router replay records an MoE model's expert routing on rLLM's verl and Fireworks backends; the torch "
        "backend has no MoE routing to replay: set rllm.algorithm.router_replay=disabled",
    )
    epsilon: float = setting(
        1e-6, "added to the std in the denominators", key="rllm.algorithm.epsilon", check=check_epsilon, run_wide=True
    )
    std_correction: int = setting(
        0,
        "0 population std (rLLM), 1 sample std (verl)",
        key="rllm.algorithm.std_correction",
        check=check_correction,
        run_wide=True,
    )
    gamma: float = setting(
        1.0,
        "discount of the token-level estimators (reinforce_plus_plus, gae), in [0, 1]",
        key="rllm.algorithm.gamma",
        aliases=("algorithm.gamma",),
        check=discount("gamma"),
        run_wide=True,
    )
    lam: float = setting(
        1.0,
        "GAE's lambda, in [0, 1]",
        key="rllm.algorithm.lam",
        aliases=("algorithm.lam",),
        check=discount("lam"),
        run_wide=True,
    )
    # estimator -> its own options; the typed config lists the built-ins' (so that they can be set
    # without "+": rllm.algorithm.estimator_options.pass_at_k.k=4; trainer/schema.py reads them from
    # the registry); a custom estimator's take "+"
    estimator_options: dict[str, dict[str, Any]] = setting(
        help="estimator -> {option: value}",
        factory=dict,
        key="rllm.algorithm.estimator_options",
        check=estimator_options_check,
        schema_type=dict[str, Any],
    )
    importance_sampling_level: str = setting(
        "token",
        "token | sequence (GSPO's sequence ratio; the ratio losses)",
        key="rllm.algorithm.importance_sampling_level",
        choices=IMPORTANCE_SAMPLING_LEVELS,
    )
    loss_params: dict[str, Any] = setting(
        help="a registered loss's own parameters (LossContext.params; rLLM's algorithm.loss_params)",
        factory=dict,
        key="rllm.algorithm.loss_params",
        schema_type=dict[str, Any],
    )
    loss_plugins: list[str] = setting(
        help="modules imported first, so that loss_fn may name the losses they register (rLLM terminal-rl's)",
        factory=list,
        key="rllm.algorithm.loss_plugins",
        check=load_loss_plugins,
        schema_type=list[str],
    )
    compat: str = setting(
        "rllm_torch",
        "rllm: rLLM's numbers where rllm_torch differs on purpose (docs/porting.md)",
        key="rllm.algorithm.compat",
        choices=COMPAT_MODES,
    )
    normalize_by_steps: bool = setting(  # the stepwise options last
        False,
        "broadcast: divide each step's advantage by its trajectory's steps (rLLM)",
        key="rllm.stepwise_advantage.normalize_by_steps",
        check=flag("normalize_by_steps"),
    )
    stepwise_gamma: float = setting(
        1.0,
        "discount per turn of the turn modes' returns (rllm.algorithm.gamma is per token)",
        key="rllm.stepwise_advantage.gamma",
        minimum=0,
        maximum=1,
    )
    step_advantage_w: float = setting(
        1.0,
        "gigpo: weight of the step advantage (verl-agent's name)",
        key="rllm.stepwise_advantage.step_advantage_w",
        finite=True,
    )

    def __post_init__(self) -> None:
        settings = declared(AlgorithmConfig)  # loss_plugins first: loss_fn may name the losses they register
        for name in ("loss_plugins", *settings):
            setattr(self, name, check_value(getattr(self, name), settings[name], settings[name].key))
        self.estimator = estimator_name(self.estimator, "estimator")
        self.loss_fn = self.loss_fn or ESTIMATOR_DEFAULT_LOSS.get(self.estimator)  # rLLM terminal-rl's: echo's loss
        if not isinstance(self.estimator_map, dict):
            raise ConfigError(
                f"estimator_map must map group roles to estimator names, got {type(self.estimator_map).__name__}."
            )
        self.estimator_map, self.loss_fn_map = split_pairs(self.estimator_map, self.loss_fn_map)
        if self.stepwise_advantage_mode == "per_step":
            warnings.warn(
                "The `per_step` mode is deprecated in the unified trainer and is set to `broadcast`. "
                "Use a trajectory grouping hook for per-step advantages.",
                DeprecationWarning,
                stacklevel=3,
            )
            self.stepwise_advantage_mode = "broadcast"
        if self.use_rllm is not None:  # rLLM warns for any value but None (rllm/trainer/algorithms/config.py)
            warnings.warn(
                f"`algorithm.use_rllm={self.use_rllm}` is deprecated and ignored: the advantages are always the rLLM "
                "estimators'; remove it from the config.",
                DeprecationWarning,
                stacklevel=3,
            )
        check_combinations(self)

    @property
    def estimator_kwargs(self) -> dict[str, Any]:
        """The run-wide options every estimator call gets; each estimator takes those it declares
        (see ``compute_advantages``)."""
        return {name: getattr(self, name) for name in RUN_OPTIONS}

    def estimator_call_kwargs(self, estimator: rLLMAdvantageEstimator | str) -> dict[str, Any]:
        """The options this config gives ``estimator``: the run-wide ones, with ``compat="rllm"``
        rLLM's (:data:`RLLM_COMPAT_ESTIMATOR_OPTIONS`), then its own ``estimator_options`` entry
        (where one of the options ``compat`` sets is None, as the run config's schema lists it,
        it is not set: ``compat`` decides, else the estimator's default)."""
        name = estimator.value if isinstance(estimator, Enum) else estimator
        by_compat = RLLM_COMPAT_ESTIMATOR_OPTIONS.get(name, {})
        own = {k: v for k, v in self.estimator_options.get(name, {}).items() if not (v is None and k in by_compat)}
        return self.estimator_kwargs | (by_compat if self.compat == "rllm" else {}) | own

    def loss_fn_for(self, role: str) -> str:
        """The policy loss of a group role: ``loss_fn_map[role]``, else ``loss_fn``, else ``"ppo"``."""
        return self.loss_fn_map.get(role) or self.loss_fn or "ppo"

    def losses_in_use(self) -> dict[str, str]:
        """Every policy loss the run trains with, keyed by where it is set (``loss_fn``,
        ``loss_fn_map[role]``), for the checks that depend on the loss."""
        return {"loss_fn": self.loss_fn or "ppo"} | {
            f"loss_fn_map[{r!r}]": loss for r, loss in self.loss_fn_map.items()
        }

    def estimator_for(self, role: str) -> rLLMAdvantageEstimator | str:
        """The estimator of a group role: ``estimator_map[role]``, else ``estimator``."""
        return self.estimator_map.get(role, self.estimator)

    @classmethod
    def from_config(
        cls,
        config: DictConfig,
        *,
        stepwise_advantage_mode: str | None = None,
        estimator_map: dict | None = None,
    ) -> AlgorithmConfig:
        """Build from a whole run config or rLLM's ``rllm.algorithm`` section (a DictConfig or
        dict), with rLLM's keywords ``stepwise_advantage_mode`` and ``estimator_map`` (the trainer's
        ``traj_group_adv_estimator_map``, merged over the config's); where each field is read:
        :func:`~rllm_torch.rllm.config_sources.algorithm_fields_from`. Absent keys take the field's
        default.

        Raises:
            ConfigError: one setting given in two places with different values (two keys, or a key
                and a keyword), an unknown key of a section, or an invalid value.
        """
        from rllm_torch.rllm.config_sources import algorithm_fields_from

        given = algorithm_fields_from(
            cls, config, stepwise_advantage_mode=stepwise_advantage_mode, estimator_map=estimator_map
        )
        return cls(**given)


#: The run-wide estimator options: the ``run_wide`` settings of :class:`AlgorithmConfig`, which every
#: estimator call gets (each estimator takes those its signature names).
RUN_OPTIONS: tuple[str, ...] = tuple(name for name, s in declared(AlgorithmConfig).items() if s.run_wide)
