"""A step that would train on nothing says so: every episode failed (the user asked to go on
past failures, ``rllm.workflow.raise_on_error=false``), or every group was dropped as too small
(``rllm.rejection_sample.min_trajs_per_group``). Each returns the warning's text ("" when the
step is fine), the same on every rank."""

from __future__ import annotations

from rllm_torch.rllm.types import Episode, TerminationReason
from rllm_torch.trainer.ranks import RunRanks

__all__ = ["all_failed_warning", "all_dropped_warning"]

_FAILED = (TerminationReason.ERROR, TerminationReason.TIMEOUT)


def all_failed_warning(episodes: list[Episode], ranks: RunRanks, step: int) -> str:
    """The warning when every episode of the step (on every rank) failed: none has a trajectory
    and each ended with ``error`` or ``timeout``; it quotes the first error."""
    failed = [e for e in episodes if not e.trajectories and e.termination_reason in _FAILED]
    first = next((str(e.info.get("error")) for e in failed if e.info.get("error")), None)
    everyone = ranks.gather((len(episodes), len(failed), first))
    total, failures = sum(p[0] for p in everyone), sum(p[1] for p in everyone)
    if not total or failures < total:
        return ""
    error = next((p[2] for p in everyone if p[2]), "no error recorded")
    return (
        f"step {step}: all {total} episodes failed and nothing trains (rllm.workflow.raise_on_error=false records "
        f"them and goes on); the first error: {error}. Fix the workflow, or set rllm.workflow.raise_on_error=true "
        "to stop at the first failure."
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
