"""The ``rllm.*`` sections of the run config's schema (:mod:`~rllm_torch.trainer.schema`) that are
plain settings: ``stepwise_advantage`` (``AlgorithmConfig``'s declarations and rLLM's ``enable``),
``workflow``, ``rejection_sample``, ``episode_logging`` and ``async_training``. Each key of rLLM's
own configs (``rllm/trainer/config/rllm/base.yaml``) is here with rLLM's default, or has a
setting that says what it does here."""

from __future__ import annotations

from dataclasses import dataclass, make_dataclass

from rllm_torch.rllm.config import AlgorithmConfig
from rllm_torch.rllm.settings import schema_fields, setting
from rllm_torch.trainer.user_errors import FAILED_STEPS_LIMIT

__all__ = [
    "GROUP_SIGNAL_METRICS",
    "STALE_GROUP_POLICIES",
    "StepwiseAdvantageSection",
    "WorkflowSection",
    "RejectionSampleSection",
    "EpisodeLoggingSection",
    "AsyncTrainingSection",
]

GROUP_SIGNAL_METRICS = ("reward", "is_correct")  # what a group without signal is judged by


@dataclass
class StepwiseAdvantageSection(
    make_dataclass("StepwiseAdvantageOptions", schema_fields(AlgorithmConfig, "rllm.stepwise_advantage"))
):
    enable: bool = setting(
        False,
        "rLLM's key (its verl trainer's switch): rLLM's unified trainer, and this one, credit steps by mode",
        resumable=True,
    )


@dataclass
class WorkflowSection:
    n_parallel_tasks: int = setting(
        1024, "episodes running at once (also the sampling batch)", minimum=1, resumable=True
    )
    retry_limit: int = setting(3, "attempts per episode", minimum=1, resumable=True)
    raise_on_error: bool = setting(
        True, f"False: record failed episodes, go on until all fail {FAILED_STEPS_LIMIT} steps in a row", resumable=True
    )
    use_workflow: bool = setting(
        False,
        "rLLM's key (its verl trainer's agent/workflow switch): read by no trainer of rLLM main nor here",
        resumable=True,
    )
    reward_timeout_s: float | None = setting(
        None, "seconds a reward call may take (an attempt fails past it); null: no limit", resumable=True
    )


@dataclass
class RejectionSampleSection:
    enable: bool = setting(False, "rLLM's episode-mode rejection sampling")
    multiplier: float = setting(
        1.0, "rLLM's verl-era batch multiplier: read by none of rLLM main's trainers nor here; only 1 is accepted"
    )
    min_partial_solve_tasks: int = setting(1, "partially solved tasks a batch needs, else it is dropped (rLLM)")
    accumulate: bool = setting(False, "true: keep a batch short of them for the next step's (rLLM: dropped)")
    min_trajs_per_group: int = setting(2, "groups with fewer trajectories are dropped")
    filter_uniform_groups: bool = setting(False, "drop groups with no signal (by uniform_filter_metric)")
    uniform_filter_metric: str = setting(
        "reward",
        "reward (raw rewards all equal) | is_correct (all right or all wrong, DAPO)",
        choices=GROUP_SIGNAL_METRICS,
    )
    refill_filtered_uniform_groups: bool = setting(
        False,
        "rLLM terminal-rl's async buffer replaces a group dropped as uniform; none is here (true with the filter: refused)",
    )


@dataclass
class EpisodeLoggingSection:
    log_episodes: bool = setting(False, "write every episode to a JSONL file", resumable=True)
    episode_log_dir: str | None = setting(None, "where (None: the run directory)", resumable=True)


STALE_GROUP_POLICIES = ("wait", "drop")  # rllm.async_training.stale_groups


@dataclass
class AsyncTrainingSection:
    """rLLM's ``AsyncTrainingConfig`` (``rllm.async_training``): sampling runs ahead of the update on
    weights it holds, synced every ``trigger_parameter_sync_step`` steps (policy versions)."""

    enable: bool = setting(
        False, "sample the next steps' episodes while the update runs (a producer and a buffer)", resumable=True
    )
    staleness_threshold: float = setting(
        0.0,
        "the most policy versions a trained group may lag the trainer (0 with trigger_parameter_sync_step=1: on-policy)",
        minimum=0,
        maximum=1e6,
        resumable=True,
    )
    trigger_parameter_sync_step: int = setting(
        1,
        "training steps between two weight syncs into the sampler (one sync = one policy version)",
        minimum=1,
        resumable=True,
    )
    partial_rollout: bool = setting(
        False,
        "a sync reaches episodes in flight (their later turns sample the new weights); false: between batches",
        resumable=True,
    )
    mini_batch_size: int | None = setting(
        None, "prompts per training step in async mode; null: data.train_batch_size", minimum=1
    )
    fwd_bwd_group_size: int | None = setting(
        None,
        "rLLM's task batches per forward-backward pass; null: mini_batch_size (one pass a step, the only one here)",
        minimum=1,
    )
    episode_offload_dir: str | None = setting(
        None,
        "rLLM's disk offload of episodes waiting in the buffer; not here (a warning): they stay in memory",
        resumable=True,
    )
    trajectory_group_offload_dir: str | None = setting(
        None,
        "rLLM's disk offload of the buffer's queued groups; not here (a warning): they stay in memory",
        resumable=True,
    )
    stale_groups: str = setting(
        "wait",
        "wait: sampling waits rather than run past the bound | drop: it runs on, and groups past the bound are dropped",
        choices=STALE_GROUP_POLICIES,
        resumable=True,
    )
