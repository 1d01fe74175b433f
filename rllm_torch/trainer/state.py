"""``TrainerState``: what one training run carries from stage to stage and from batch to batch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rllm_torch.rllm.plan import AdvantagePlan
from rllm_torch.rllm.types import Episode, TrajectoryGroup
from rllm_torch.trainer.pipeline.rejection_sampling import RejectionSamplingState

__all__ = ["TrainerState"]


@dataclass
class TrainerState:
    """Mutable state of a :class:`~rllm_torch.trainer.unified_trainer.UnifiedTrainer` run.

    Attributes:
        global_step: the current training step, 1-based (0 before the first batch).
        epoch: the current epoch, 0-based (``total_epochs`` once every epoch is done).
        batch_in_epoch: batches of the current epoch done so far (a resumed run skips them).
        total_steps: the number of training steps the run will take.
        episodes: the current batch's episodes.
        trajectory_groups: the current batch's groups (after filtering).
        backend_batch: the backend's form of the batch (for the torch backend a ``TokenBatch``).
        metrics: this batch's metrics, logged after the batch.
        timing_dict: seconds spent in each stage of this batch.
        rs_state: rejection-sampling accumulation, kept across batches.
        last_validation_step: the step of the last validation (None: none yet); validation never
            runs twice for one step.
        is_training: False while a validation runs (rLLM's field; the torch backend batches
            validation by ``data.val_batch_size``).
        needs: what the run's estimators and losses need from the batch besides its rewards
            (:attr:`~rllm_torch.rllm.plan.AdvantagePlan.needs`, e.g. ``old_log_probs``,
            ``sum_pi_squared``): the trainer asks the backend for them through this field.
        plan: the run's :class:`~rllm_torch.rllm.plan.AdvantagePlan` (each role's bound estimator
            and loss), for a backend's update; None outside a trainer.
    """

    global_step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    total_steps: int = 0
    episodes: list[Episode] = field(default_factory=list)
    trajectory_groups: list[TrajectoryGroup] = field(default_factory=list)
    backend_batch: Any = None
    metrics: dict[str, float] = field(default_factory=dict)
    timing_dict: dict[str, float] = field(default_factory=dict)
    rs_state: RejectionSamplingState = field(default_factory=RejectionSamplingState)
    last_validation_step: int | None = None
    is_training: bool = True
    needs: frozenset[str] = frozenset()
    plan: AdvantagePlan | None = None

    def reset_batch(self) -> None:
        """Forget the previous batch (episodes, groups, backend batch, metrics, timings)."""
        self.episodes, self.trajectory_groups, self.backend_batch = [], [], None
        self.metrics, self.timing_dict = {}, {}

    @property
    def has_episodes(self) -> bool:
        return bool(self.episodes)

    @property
    def has_trajectory_groups(self) -> bool:
        return bool(self.trajectory_groups)

    @property
    def has_backend_batch(self) -> bool:
        return self.backend_batch is not None
