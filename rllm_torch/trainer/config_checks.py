"""The one place that checks a run config and types it (:func:`check_run_config`, which returns the
run's :class:`RunSettings`), before anything is built:
every setting against its declaration (bounds, choices, its own check: :mod:`~rllm_torch.trainer.schema`,
:class:`~rllm_torch.rllm.config.AlgorithmConfig`), then the rules between settings: the
estimators and their options, the loss, the KL terms and the critic, the sampler and rollout
correction, the filters, the task's own keys and what a launch of ``world_size`` processes can
honour. Each failure names the setting and the fix. The command line calls it before it loads
data or starts the process group, and :class:`~rllm_torch.trainer.unified_trainer.UnifiedTrainer`
before it builds its backend, so a run from Python is checked the same way.

What needs the loaded model or tokenizer (prompt lengths, a chat template) is the backend's
(``validate_config`` / ``validate_prompts``); what needs the task's data, the command line's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from rllm_torch.core.errors import ConfigError, DistributedSetupError, InvalidRewardsError, InvalidRewardTypeError
from rllm_torch.core.losses import LOSS_FNS, check_registered_loss, loss_options, loss_requirement, registered_loss
from rllm_torch.core.losses.rollout_rejection import parse_rollout_rs
from rllm_torch.core.packing import GroupedRewards
from rllm_torch.core.tokens import TokenRewards
from rllm_torch.rllm.config import AlgorithmConfig
from rllm_torch.rllm.dispatch import compute_advantages
from rllm_torch.rllm.plan import AdvantagePlan
from rllm_torch.rllm.registry import is_token_level, registration
from rllm_torch.rllm.settings import check_value, walk
from rllm_torch.trainer.backend_schema import BackendConfig
from rllm_torch.trainer.pipeline.async_rollouts import AsyncTrainingConfig, check_rllm_async_keys
from rllm_torch.trainer.pipeline.compact_filtering import CompactFilteringConfig
from rllm_torch.trainer.pipeline.dynamic_sampling import DynamicSamplingConfig
from rllm_torch.trainer.pipeline.rejection_sampling import RejectionSamplingConfig, check_refill
from rllm_torch.trainer.pipeline.transform import TransformConfig
from rllm_torch.trainer.rllm_settings import resolve_rllm_settings
from rllm_torch.trainer.schema import TASK_ONLY_KEYS, TaskConfig, TrainConfig, prompts_per_step, typed_run_config

__all__ = [
    "RunSettings",
    "check_run_config",
    "typed_algorithm_config",
    "check_values",
    "check_world_size",
    "check_estimator_call",
    "TASK_ONLY_KEYS",
]


@dataclass(frozen=True)
class RunSettings:
    """A checked run config and its typed objects, built once (:func:`check_run_config`); every
    stage of the trainer reads these, none converts the config again.

    Attributes:
        config: the run config, typed over the schema (rLLM's keys resolved into ours).
        algorithm_config: the estimators, their options and the losses, with the trainer's
            ``traj_group_adv_estimator_map`` (and its ``(estimator, loss)`` pairs) merged in.
        plan: each role's estimator and loss, resolved once, and what they need (:class:`AdvantagePlan`).
        cf_config, transform_config, rs_config: rLLM's compact filtering, episode-to-group
            transform and rejection sampling.
        dynamic_sampling: DAPO's dynamic sampling (``rllm.algorithm.filter_groups``).
        async_training: ``rllm.async_training``.
    """

    config: DictConfig
    algorithm_config: AlgorithmConfig
    plan: AdvantagePlan
    cf_config: CompactFilteringConfig
    transform_config: TransformConfig
    rs_config: RejectionSamplingConfig
    dynamic_sampling: DynamicSamplingConfig
    async_training: AsyncTrainingConfig


def check_run_config(config: Any, world_size: int = 1, *, estimator_map: dict | None = None) -> RunSettings:
    """Every start-up check of a run config (a composed ``rllm-torch-train`` config, or any
    subset of its keys, typed over the schema first), and its typed objects.

    Args:
        config: the run config.
        world_size: the processes of the launch (torchrun's ``WORLD_SIZE``).
        estimator_map: group role -> estimator, over ``rllm.algorithm.estimator_map`` (the
            trainer's ``traj_group_adv_estimator_map``).

    Returns:
        The run's :class:`RunSettings` (its ``config`` the typed one).

    Raises:
        ConfigError: a setting out of its range or choices, or two settings that cannot go
            together; the message names them and the fix.
        UnknownEstimatorError: an estimator that is not registered.
        DistributedSetupError: see :func:`check_world_size`.
    """
    config = typed_run_config(config)
    resolve_rllm_settings(config)  # rLLM's keys into the ones that do the same here
    check_values(config)
    _check_task_keys(config.task)
    algorithm_config, plan = _check_algorithm(config, estimator_map)
    _check_loss_kl_and_critic(config, algorithm_config, plan)
    _check_sampler_and_correction(config)
    _check_filters(config, plan)
    _check_async_training(config, plan)
    check_world_size(config, world_size)
    rllm = config.rllm
    return RunSettings(
        config=config,
        algorithm_config=algorithm_config,
        plan=plan,
        cf_config=CompactFilteringConfig.from_config(rllm.compact_filtering),
        transform_config=TransformConfig(broadcast=True),  # a trajectory without a reward takes its last step's
        rs_config=RejectionSamplingConfig.from_config(rllm.rejection_sample, async_training=rllm.async_training.enable),
        dynamic_sampling=DynamicSamplingConfig.from_config(config),
        async_training=AsyncTrainingConfig.from_config(config),
    )


def check_values(config: Any) -> None:
    """Each setting the typed config has (and is not None) against its declaration in its schema
    (a backend's settings declare the ``backend`` section; a plain dataclass field declares nothing).

    Raises:
        ConfigError: naming the first setting out of its range or choices, its value and what it
            may be (with the schema default as an example of a valid value).
    """
    defaults = OmegaConf.structured(schema := OmegaConf.get_type(config))
    for key, declaration, _ in walk(schema):
        value = OmegaConf.select(config, key, default=None)
        if value is None or declaration is None:
            continue
        plain = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
        check_value(plain, declaration, key, example=OmegaConf.select(defaults, key, default=None))


def _check_task_keys(task_config: Any) -> None:
    """Keys of one task (:data:`TASK_ONLY_KEYS`) set to other than their defaults for another task."""
    defaults = TaskConfig()
    readers: dict[str, list[str]] = {}
    for owner, keys in TASK_ONLY_KEYS.items():
        for key in keys:
            readers.setdefault(key, []).append(owner)
    for key, owners in readers.items():
        value = task_config[key]
        if task_config.name in owners or value == getattr(defaults, key):
            continue
        hint = "to use your own data" if owners == ["file"] else f"for the {' or '.join(owners)} task"
        raise ConfigError(
            f"task.{key}={value!r} is not used by task.name={task_config.name!r} (only task={' or task='.join(owners)} "
            f"reads it); add task={owners[0]} {hint}, or drop task.{key}."
        )


def typed_algorithm_config(config: Any, estimator_map: dict | None = None) -> AlgorithmConfig:
    """The run config's :class:`AlgorithmConfig` (the one place it is built from a run config),
    with ``estimator_map`` (the trainer's) merged over ``rllm.algorithm.estimator_map``; its own
    rules checked, not the run's (a backend built on its own, outside a run, reads it from here).

    Raises:
        ConfigError: what ``AlgorithmConfig``'s rules raise, or a value it cannot take.
    """
    try:
        return AlgorithmConfig.from_config(config, estimator_map=estimator_map)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"invalid rllm config: {exc}") from exc


def _check_algorithm(config: Any, estimator_map: dict | None) -> tuple[AlgorithmConfig, AdvantagePlan]:
    """The algorithm's own rules (``AlgorithmConfig``), then each estimator: registered, runnable
    in the stepwise mode, and called once with the run's options on a synthetic group. Returns the
    run's :class:`AlgorithmConfig` and its plan."""
    rllm = config.rllm
    algorithm_config = typed_algorithm_config(config, estimator_map)  # the trainer's map merged
    plan = AdvantagePlan(algorithm_config)  # every estimator named: registered, runnable in the stepwise mode
    for name in sorted(plan.estimators):
        check_estimator_call(name, algorithm_config, rllm.rollout.n)
        if "reward_components" in registration(name).needs and rllm.algorithm.use_kl_in_reward:
            raise ConfigError(
                f"estimator {name} normalises each reward function's rewards (Trajectory.reward_components), and the KL "
                f"penalty of rllm.algorithm.use_kl_in_reward=true comes off the scalar reward: it would not reach {name}'s "
                f"advantages. Use rllm.algorithm.use_kl_loss=true for a KL term with {name}."
            )
    return algorithm_config, plan


def check_estimator_call(name: object, algorithm_config: AlgorithmConfig, group_size: int) -> None:
    """Run estimator ``name`` once with the run's options on a synthetic group of ``group_size``
    binary rewards (one correct; as reward components too, one column per ``reward_weights``
    entry or two; token-level estimators: responses of two tokens, zero values), so an option it
    does not take, a missing or out-of-range option (``pass_at_k``'s ``k`` above
    ``rllm.rollout.n``) stops the run at start-up instead of at the first step.

    Raises:
        ConfigError: naming the estimator, the option keys and the estimator's own message.
    """
    kwargs = {}
    if "baselines" in registration(name).needs:  # the trainer's greedy reward of the group
        kwargs |= {"baselines": torch.zeros(1, dtype=torch.float64)}
    n = max(int(group_size), 1)
    if is_token_level(name):
        rewards = torch.zeros(n, 2)
        rewards[0, 1] = 1.0
        ones = torch.ones(n, 2)
        batch = TokenRewards(
            rewards,
            ones,
            values=torch.zeros(n, 2),
            old_log_probs=-ones,
            sum_pi_squared=ones / 2,
            group_index=torch.zeros(n, dtype=torch.int64),
        )
    else:
        rewards = torch.zeros(1, n, dtype=torch.float64)
        rewards[0, 0] = 1.0
        columns = algorithm_config.estimator_call_kwargs(name).get(
            "reward_weights"
        )  # gdpo's: one per reward function, else two
        columns = len(columns) if isinstance(columns, (list, tuple)) else 2
        components = rewards[..., None].expand(1, n, columns)
        batch = GroupedRewards.from_padded(rewards, weights=torch.ones(1, n), reward_components=components)
    label = getattr(name, "value", name)
    try:
        compute_advantages(batch, name, algorithm_config=algorithm_config, **kwargs)
    except (ConfigError, InvalidRewardsError, InvalidRewardTypeError) as exc:
        raise ConfigError(
            f"estimator {label!r} with its options (rllm.algorithm.estimator_options.{label}, and the run-wide "
            f"gamma/lam/epsilon/std_correction) fails on a group of rllm.rollout.n={n} rewards: {exc}"
        ) from exc


def _check_loss_kl_and_critic(config: Any, algorithm_config: AlgorithmConfig, plan: AdvantagePlan) -> None:
    algorithm, backend = config.rllm.algorithm, config.backend
    torch_section = issubclass(OmegaConf.get_type(config, "backend"), BackendConfig)  # else another backend's settings
    for where, loss_fn in algorithm_config.losses_in_use().items():  # the run's loss and each role's
        custom = registered_loss(loss_fn)
        if custom is not None:  # a user's loss: it must train on a small batch, here, not at step 1
            check_registered_loss(loss_fn, custom.fn)
        if not torch_section:  # the loss's options are the torch backend's settings
            continue
        takes = loss_options(loss_fn) if custom is None else frozenset()
        for option, what in (("clip_ratio_c", "a ratio cap (dual-clip PPO, DPPO)"), ("delta", "TRL's two-sided clip")):
            if backend[option] is not None and option not in takes:
                takers = ", ".join(name for name in LOSS_FNS if option in loss_options(name))
                raise ConfigError(
                    f"backend.{option}={backend[option]} is {what}, and rllm.algorithm.{where}={loss_fn!r} has none: "
                    f"drop backend.{option}, or use one of rllm.algorithm.loss_fn={takers}."
                )
        settings = {
            "clip_cov_lb": backend.clip_cov_lb,
            "clip_cov_ub": backend.clip_cov_ub,
            "loss_agg_mode": algorithm.loss_agg_mode,
            "tis_mode": algorithm.rollout_correction.tis_mode,
        }
        if why := loss_requirement(loss_fn, settings):
            raise ConfigError(
                f"rllm.algorithm.{where}={loss_fn}: {why} (backend.*, rllm.algorithm.loss_agg_mode and "
                "rllm.algorithm.rollout_correction)."
            )
    if algorithm.use_bias_correction_kl and not algorithm.use_kl_loss:
        raise ConfigError(
            "rllm.algorithm.use_bias_correction_kl=true corrects the KL loss term: set rllm.algorithm.use_kl_loss=true too."
        )
    if config.model.ref_path is not None and not (algorithm.use_kl_loss or algorithm.use_kl_in_reward):
        raise ConfigError(
            f"model.ref_path={config.model.ref_path!r} is set but no KL term uses a reference policy; set "
            "rllm.algorithm.use_kl_loss=true or use_kl_in_reward=true, or leave model.ref_path unset."
        )
    uses_values = plan.estimators_needing("values")
    if not torch_section:  # another backend provides what the plan needs itself (TrainerState.needs)
        return
    if uses_values and not backend.critic.enable:
        raise ConfigError(
            f"estimator {', '.join(uses_values)} needs the critic's values: set backend.critic.enable=true "
            "(a value model of the policy's architecture, trained with backend.critic.lr)."
        )
    if backend.critic.enable and not uses_values:
        raise ConfigError(
            f"backend.critic.enable=true but no estimator uses a critic (estimators: {sorted(plan.estimators)}); "
            "use rllm.algorithm.adv_estimator=gae, or set backend.critic.enable=false."
        )


def _check_sampler_and_correction(config: Any) -> None:
    """The sampler (``backend.rollout``) and ``rllm.algorithm.rollout_correction``."""
    correction, key = config.rllm.algorithm.rollout_correction, "rllm.algorithm.rollout_correction"
    if correction.tis_mode is not None and correction.bypass_mode:
        raise ConfigError(
            f"{key}.tis_mode={correction.tis_mode!r} with bypass_mode=true: the old policy is then the sampler, so every "
            "weight is exactly 1; set bypass_mode=false (recompute the old log-probs) or tis_mode=null."
        )
    if correction.tis_cap_lower is not None and correction.tis_mode not in ("token_mask", "sequence_mask"):
        raise ConfigError(
            f"{key}.tis_cap_lower={correction.tis_cap_lower} is the lower cap of a mask mode: set {key}.tis_mode=token_mask "
            "(IcePop) or sequence_mask."
        )
    if correction.rollout_rs_threshold is not None and correction.rollout_rs is None:
        raise ConfigError(f"{key}.rollout_rs_threshold is set but {key}.rollout_rs (the options) is not.")
    if correction.rollout_rs is not None:
        if correction.bypass_mode:
            raise ConfigError(
                f"{key}.rollout_rs with bypass_mode=true: the old policy is then the sampler, so every token's statistic is "
                "0; set bypass_mode=false (recompute the old log-probs) or rollout_rs=null."
            )
        try:
            parse_rollout_rs(correction.rollout_rs, correction.rollout_rs_threshold)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{key}.rollout_rs={correction.rollout_rs!r}: {exc}") from exc


def _check_filters(config: Any, plan: AdvantagePlan) -> None:
    rllm = config.rllm

    if rllm.rejection_sample.multiplier != 1:  # rLLM's key; no trainer of rLLM main reads it
        raise ConfigError(
            f"rllm.rejection_sample.multiplier={rllm.rejection_sample.multiplier:g} is read by no trainer of rLLM main nor "
            "here (rLLM's verl-era batch multiplier): drop it; rllm.algorithm.filter_groups.enable=true fills a step."
        )
    if rllm.algorithm.filter_groups.enable and "baselines" in plan.needs:
        raise ConfigError(
            f"estimator {', '.join(plan.estimators_needing('baselines'))} samples one greedy rollout of each prompt of "
            "the step's batch, and rllm.algorithm.filter_groups.enable=true (dynamic sampling) draws prompts from "
            "several batches: use one."
        )
    check_refill(rllm.rejection_sample)
    if rllm.algorithm.filter_groups.enable and rllm.rejection_sample.enable:
        raise ConfigError(
            "rllm.algorithm.filter_groups.enable=true and rllm.rejection_sample.enable=true both accumulate groups; "
            "enable one (dynamic sampling fills each step with prompts that have signal)."
        )


def _check_async_training(config: Any, plan: AdvantagePlan) -> None:
    """``rllm.async_training``: its settings read only in async mode, and what async mode cannot honour."""
    section, key = config.rllm.async_training, "rllm.async_training"
    if not section.enable:
        defaults = OmegaConf.structured(TrainConfig).rllm.async_training
        if changed := [name for name in section if name != "enable" and section[name] != defaults[name]]:
            raise ConfigError(
                f"{key}.{changed[0]}={section[changed[0]]} is read only in async mode: add {key}.enable=true, or drop it."
            )
        return
    check_rllm_async_keys(section, prompts_per_step(config))
    greedy = plan.estimators_needing("baselines")
    cannot = {
        f"estimator {', '.join(greedy)} (greedy baselines sampled with the step's own weights)": bool(greedy),
        "backend.parallelism=fsdp (the sampler holds a whole copy of the policy; use ddp)": (
            OmegaConf.select(config, "backend.parallelism", default=None) == "fsdp"
        ),
    }
    for setting_, refused in cannot.items():
        if refused:
            raise ConfigError(f"{key}.enable=true cannot run with {setting_}; set {key}.enable=false, or change it.")


def check_world_size(config: Any, world_size: int) -> None:
    """Settings a run of ``world_size`` processes cannot honour (checked before the process group
    is set up, so every rank raises the same error and none waits for the others).

    Raises:
        DistributedSetupError: more ranks than prompts per step, a ``data.train_batch_size`` not
            divisible by the world size, episode-mode rejection sampling (it accumulates per
            rank, so the ranks would disagree on when a batch is released) on several processes.
        ConfigError: ``backend.parallelism=fsdp`` on one process, or with LoRA or a critic.
    """
    batch = prompts_per_step(config)
    name = "data.train_batch_size" if batch == config.data.train_batch_size else "rllm.async_training.mini_batch_size"
    if world_size > batch:
        raise DistributedSetupError(
            f"{world_size} processes for {name}={batch} prompts per step: each rank needs at least one; "
            f"launch at most {batch} processes or raise {name}."
        )
    if batch % world_size:
        raise DistributedSetupError(
            f"{name}={batch} is not divisible by the world size {world_size}: every rank takes an equal "
            f"share of each step's prompts; use a multiple of {world_size} (e.g. {batch - batch % world_size or world_size})."
        )
    if world_size > 1 and config.rllm.rejection_sample.enable:
        raise DistributedSetupError(
            "rllm.rejection_sample.enable=true is not supported on more than one process: it accumulates groups per rank, "
            "so the ranks would release batches at different steps. Run it on one process, or disable it."
        )
    if OmegaConf.select(config, "backend.parallelism", default=None) != "fsdp":  # the torch backend's setting
        return
    if world_size == 1:
        raise ConfigError(
            "backend.parallelism=fsdp shards the policy over the processes of a torchrun launch, and this run is one "
            "process: launch it with torchrun --nproc_per_node=N, or leave backend.parallelism=ddp."
        )
    if config.model.lora.r > 0:
        raise ConfigError(
            "model.lora.r > 0 with backend.parallelism=fsdp is not supported: the adapters are small, use "
            "backend.parallelism=ddp (or model.lora.r=0 to shard the whole model)."
        )
    if config.backend.critic.enable:
        raise ConfigError(
            "backend.critic.enable=true with backend.parallelism=fsdp is not supported yet; use backend.parallelism=ddp."
        )
