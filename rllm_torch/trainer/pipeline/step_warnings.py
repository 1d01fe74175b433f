"""A step that would train on nothing says so: every episode failed (the user asked to go on
past failures, ``rllm.workflow.raise_on_error=false``; several such steps in a row stop the run),
or every group was dropped as too small (``rllm.rejection_sample.min_trajs_per_group``). Each
returns the warning's text ("" when the step is fine), the same on every rank."""

from __future__ import annotations

from rllm_torch.core.errors import WorkflowError
from rllm_torch.rllm.types import Episode, TerminationReason
from rllm_torch.trainer.ranks import RunRanks
from rllm_torch.trainer.user_errors import FAILED_STEPS_LIMIT

__all__ = ["FailedSteps", "all_dropped_warning"]

_FAILED = (TerminationReason.ERROR, TerminationReason.TIMEOUT)


class FailedSteps:
    """Counts the training steps in a row in which every episode (on every rank) failed: none has
    a trajectory and each ended with ``error`` or ``timeout`` (``rllm.workflow.raise_on_error=false``
    records them). The first such step warns, quoting the first error with its place in the
    user's code; the :data:`~rllm_torch.trainer.user_errors.FAILED_STEPS_LIMIT`-th in a row stops
    the run with it. A step in which some episode did not fail starts the count again."""

    def __init__(self, limit: int = FAILED_STEPS_LIMIT) -> None:
        self.limit, self.in_a_row = limit, 0

    def observe(self, episodes: list[Episode], ranks: RunRanks, step: int) -> str:
        """Count step ``step``'s episodes (this rank's; the same answer on every rank): the
        warning of the first step of a run of failed ones, "" otherwise.

        Raises:
            WorkflowError: this is the ``limit``-th step in a row whose every episode failed.
        """
        failed = [e for e in episodes if not e.trajectories and e.termination_reason in _FAILED]
        first = next((str(e.info.get("error")) for e in failed if e.info.get("error")), None)
        everyone = ranks.gather((len(episodes), len(failed), first))
        total, failures = sum(p[0] for p in everyone), sum(p[1] for p in everyone)
        if not total or failures < total:
            self.in_a_row = 0
            return ""
        self.in_a_row += 1
        error = next((p[2] for p in everyone if p[2]), "no error recorded")
        if self.in_a_row >= self.limit:
            raise WorkflowError(
                f"steps {step - self.limit + 1}-{step}: every episode failed ({total} in the last), so nothing trains; "
                f"the first error: {error}. Fix it: rllm.workflow.raise_on_error=false goes on past some failed "
                f"episodes, not past {self.limit} steps in a row in which all failed."
            )
        if self.in_a_row > 1:
            return ""  # said at the first step of the run of failures
        return (
            f"step {step}: all {total} episodes failed and nothing trains (rllm.workflow.raise_on_error=false records "
            f"them and goes on); the first error: {error}. Fix it; {self.limit} such steps in a row stop the run."
        )


def all_dropped_warning(metrics: dict[str, float], min_trajs_per_group: int, step: int) -> str:
    """The warning when rejection sampling dropped every group of the step for having fewer than
    ``min_trajs_per_group`` trajectories (``metrics``: its ``batch/*`` counts, over every rank)."""
    before = metrics.get("batch/groups_before_filter", 0.0)
    dropped = metrics.get("batch/groups_dropped_insufficient_trajs", 0.0)
    if not before or dropped < before:
        return ""
    return (
        f"step {step}: every group ({int(before)}) has fewer than rllm.rejection_sample.min_trajs_per_group="
        f"{min_trajs_per_group} trajectories and was dropped (rLLM's rule): nothing trains. Raise rllm.rollout.n, or "
        "set rllm.rejection_sample.min_trajs_per_group=1 for an estimator that learns from one rollout a prompt."
    )
