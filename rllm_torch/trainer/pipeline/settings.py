"""Turn a run config's ``rllm.*`` section into the pipeline's config objects."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from rllm_torch.rllm.config import AlgorithmConfig
from rllm_torch.trainer.pipeline.compact_filtering import CompactFilteringConfig
from rllm_torch.trainer.pipeline.rejection_sampling import RejectionSamplingConfig
from rllm_torch.trainer.pipeline.transform import TransformConfig

__all__ = ["PipelineConfigs", "build_pipeline_configs"]


@dataclass
class PipelineConfigs:
    """The four config objects of the trainer's data pipeline."""

    compact_filtering: CompactFilteringConfig
    transform: TransformConfig
    rejection_sampling: RejectionSamplingConfig
    algorithm: AlgorithmConfig


def build_pipeline_configs(config: DictConfig, estimator_map: dict | None = None) -> PipelineConfigs:
    """Read a run config's ``rllm`` section (:func:`~rllm_torch.trainer.schema.typed_run_config`,
    checked by :func:`~rllm_torch.trainer.config_checks.check_run_config`) into
    :class:`PipelineConfigs`.

    ``estimator_map`` (the trainer's ``traj_group_adv_estimator_map``) is merged over
    ``rllm.algorithm.estimator_map``. Unlike rLLM, it does not need ``use_rllm=True``.

    Raises:
        ConfigError: what the config objects' own checks raise (a run config that passed
            ``check_run_config`` raises nothing here).
    """
    rllm = config.rllm
    rs = rllm.rejection_sample
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
    transform = TransformConfig(broadcast=True)  # every mode: a trajectory without a reward takes its last step's
    return PipelineConfigs(cf, transform, rs_config, algorithm)
