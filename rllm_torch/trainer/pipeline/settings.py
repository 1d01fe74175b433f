"""Turn a run config's ``rllm.*`` section into the pipeline's config objects, checking it first."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from omegaconf import DictConfig

from rllm_torch.core.errors import ConfigError, InvalidRewardsError, InvalidRewardTypeError
from rllm_torch.core.packing import GroupedRewards
from rllm_torch.core.tokens import TokenRewards
from rllm_torch.rllm.config import AlgorithmConfig
from rllm_torch.rllm.dispatch import compute_advantages
from rllm_torch.rllm.registry import is_token_level
from rllm_torch.rllm.stepwise import check_stepwise_estimator
from rllm_torch.trainer.pipeline.compact_filtering import CompactFilteringConfig
from rllm_torch.trainer.pipeline.rejection_sampling import RejectionSamplingConfig
from rllm_torch.trainer.pipeline.transform import TransformConfig

__all__ = ["PipelineConfigs", "build_pipeline_configs", "check_estimator_call"]


@dataclass
class PipelineConfigs:
    """The four config objects of the trainer's data pipeline."""

    compact_filtering: CompactFilteringConfig
    transform: TransformConfig
    rejection_sampling: RejectionSamplingConfig
    algorithm: AlgorithmConfig


def build_pipeline_configs(config: DictConfig, estimator_map: dict | None = None) -> PipelineConfigs:
    """Read a run config's ``rllm`` section (:func:`~rllm_torch.trainer.schema.typed_run_config`)
    into :class:`PipelineConfigs`.

    ``estimator_map`` (the trainer's ``traj_group_adv_estimator_map``) is merged over
    ``rllm.algorithm.estimator_map``. Unlike rLLM, it does not need ``use_rllm=True``.

    Raises:
        ConfigError: ``rejection_sample.multiplier != 1`` without
            ``rejection_sample.enable``; an invalid algorithm or filtering setting; ``gdpo`` with
            ``use_kl_in_reward`` (the penalty would not reach its reward components).
        UnknownEstimatorError: the estimator or an ``estimator_map`` entry is not registered.
    """
    rllm = config.rllm
    rs = rllm.rejection_sample
    if rs.multiplier != 1 and not rs.enable:
        raise ConfigError(f"rllm.rejection_sample.multiplier={rs.multiplier} needs rllm.rejection_sample.enable=true.")
    try:
        cf = CompactFilteringConfig.from_config(rllm.compact_filtering)
        rs_config = RejectionSamplingConfig(
            mode="episode" if rs.enable else "none",
            min_partial_solve_tasks=rs.min_partial_solve_tasks,
            min_trajs_per_group=rs.min_trajs_per_group,
            filter_uniform_groups=rs.filter_uniform_groups,
            uniform_filter_metric=rs.uniform_filter_metric,
        )
        algorithm = AlgorithmConfig.from_config(config)
        if estimator_map:
            algorithm = AlgorithmConfig(
                **{**vars(algorithm), "estimator_map": {**algorithm.estimator_map, **estimator_map}}
            )
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"invalid rllm config: {exc}") from exc
    for name in {algorithm.estimator, *algorithm.estimator_map.values()}:
        is_token_level(name)  # UnknownEstimatorError for a name that is not registered
        check_stepwise_estimator(name, algorithm.stepwise_advantage_mode)
        check_estimator_call(name, algorithm, rllm.rollout.n)
        if getattr(name, "value", name) == "gdpo" and rllm.algorithm.use_kl_in_reward:
            raise ConfigError(
                "estimator gdpo normalises each reward function's rewards (Trajectory.reward_components), and the KL "
                "penalty of rllm.algorithm.use_kl_in_reward=true comes off the scalar reward: it would not reach gdpo's "
                "advantages. Use rllm.algorithm.use_kl_loss=true for a KL term with gdpo."
            )
    transform = TransformConfig(broadcast=True)  # every mode: a trajectory without a reward takes its last step's
    return PipelineConfigs(cf, transform, rs_config, algorithm)


def check_estimator_call(name: object, algorithm: AlgorithmConfig, group_size: int) -> None:
    """Run estimator ``name`` once with the run's options on a synthetic group of ``group_size``
    binary rewards (one correct; as reward components too, one column per ``reward_weights``
    entry or two; token-level estimators: responses of two tokens, zero values),
    so an option it does not take, a missing or out-of-range option (``pass_at_k``'s ``k`` above
    ``rllm.rollout.n``) stops the run at start-up instead of at the first step.

    Raises:
        ConfigError: naming the estimator, the option keys and the estimator's own message.
    """
    kwargs = algorithm.estimator_call_kwargs(name)
    n = max(int(group_size), 1)
    if is_token_level(name):
        rewards = torch.zeros(n, 2)
        rewards[0, 1] = 1.0
        batch = TokenRewards(rewards, torch.ones(n, 2), values=torch.zeros(n, 2))
    else:
        rewards = torch.zeros(1, n, dtype=torch.float64)
        rewards[0, 0] = 1.0
        columns = kwargs.get("reward_weights")  # gdpo's: one column per reward function, else two
        columns = len(columns) if isinstance(columns, (list, tuple)) else 2
        components = rewards[..., None].expand(1, n, columns)
        batch = GroupedRewards.from_padded(rewards, weights=torch.ones(1, n), reward_components=components)
    label = getattr(name, "value", name)
    try:
        compute_advantages(batch, name, **kwargs)
    except (ConfigError, InvalidRewardsError, InvalidRewardTypeError) as exc:
        raise ConfigError(
            f"estimator {label!r} with its options (rllm.algorithm.estimator_options.{label}, and the run-wide "
            f"gamma/lam/epsilon/std_correction) fails on a group of rllm.rollout.n={n} rewards: {exc}"
        ) from exc
