"""Turn a run config's ``rllm.*`` section into the pipeline's config objects, checking it first."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from rllm_torch.config import AlgorithmConfig
from rllm_torch.errors import ConfigError
from rllm_torch.estimators import get_rllm_adv_estimator
from rllm_torch.trainer.compact_filtering import CompactFilteringConfig
from rllm_torch.trainer.rejection_sampling import RejectionSamplingConfig
from rllm_torch.trainer.transform import TransformConfig

__all__ = ["PipelineConfigs", "build_pipeline_configs"]


@dataclass
class PipelineConfigs:
    """The four config objects of the trainer's data pipeline."""

    compact_filtering: CompactFilteringConfig
    transform: TransformConfig
    rejection_sampling: RejectionSamplingConfig
    algorithm: AlgorithmConfig


def build_pipeline_configs(config: DictConfig, estimator_map: dict | None = None) -> PipelineConfigs:
    """Read ``config.rllm`` into :class:`PipelineConfigs`.

    ``estimator_map`` (the trainer's ``traj_group_adv_estimator_map``) is merged over
    ``rllm.algorithm.estimator_map``. Unlike rLLM, it does not need ``use_rllm=True``.

    Raises:
        ConfigError: ``rllm`` is missing; ``rejection_sample.multiplier != 1`` without
            ``rejection_sample.enable``; an invalid algorithm or filtering setting.
        UnknownEstimatorError: the estimator or an ``estimator_map`` entry is not registered.
    """
    rllm = config.get("rllm") if isinstance(config, DictConfig) else None
    if rllm is None:
        raise ConfigError(
            "the config has no `rllm` section; compose it from rllm_torch's configs (see `rllm-torch-train --help`)."
        )
    rs = rllm.rejection_sample
    if rs.get("multiplier", 1) != 1 and not rs.enable:
        raise ConfigError(f"rllm.rejection_sample.multiplier={rs.multiplier} needs rllm.rejection_sample.enable=true.")
    try:
        cf = CompactFilteringConfig.from_config(rllm.compact_filtering)
        rs_config = RejectionSamplingConfig(
            mode="episode" if rs.enable else "none",
            min_partial_solve_tasks=rs.min_partial_solve_tasks,
            min_trajs_per_group=rs.min_trajs_per_group,
            filter_uniform_groups=rs.get("filter_uniform_groups", False),
            uniform_filter_metric=rs.get("uniform_filter_metric", "reward"),
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
        get_rllm_adv_estimator(name)
    transform = TransformConfig(broadcast=algorithm.stepwise_advantage_mode == "broadcast")
    return PipelineConfigs(cf, transform, rs_config, algorithm)
