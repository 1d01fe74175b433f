"""What every step logs besides its stages' own metrics: each stage's seconds
(:func:`stage_timer`, ``time/*``) and the workflows' episode metrics and termination reasons
(:func:`workflow_metrics`), over every rank."""

from __future__ import annotations

import time
from collections import Counter
from contextlib import contextmanager

import torch

from rllm_torch.core.distributed import gather_objects
from rllm_torch.rllm.types import Episode, TerminationReason
from rllm_torch.trainer.ranks import RunRanks
from rllm_torch.trainer.runtime.stop import stop_point

__all__ = ["stage_timer", "workflow_metrics", "episode_metrics"]


@contextmanager
def stage_timer(metrics: dict[str, float], stage: str):
    """Time the block into ``metrics[f"time/{stage}"]`` (seconds), waiting for queued CUDA work
    at both ends so a stage is not charged for the kernels of the one before. A stop request
    abandons the step before the stage (:func:`~rllm_torch.trainer.runtime.stop.stop_point`)."""
    stop_point()
    synchronize = torch.cuda.synchronize if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    if synchronize:
        synchronize()
    start = time.perf_counter()
    try:
        yield
    finally:
        if synchronize:
            synchronize()
        metrics[f"time/{stage}"] = time.perf_counter() - start


def _tally(episodes: list[Episode]) -> tuple[dict[str, float], Counter, Counter]:
    """Each numeric ``episode.metrics`` key's sum and count, and the termination reasons counted
    (an episode without one counts as ``unknown``, as in rLLM)."""
    sums: dict[str, float] = {}
    counts: Counter = Counter()
    reasons = Counter((e.termination_reason or TerminationReason.UNKNOWN).value for e in episodes)
    for episode in episodes:
        for key, value in episode.metrics.items():
            if isinstance(value, (int, float)):
                sums[key] = sums.get(key, 0.0) + float(value)
                counts[key] += 1
    return sums, counts, reasons


def episode_metrics(episodes: list[Episode]) -> tuple[dict[str, float], Counter]:
    """``(mean of each numeric episode.metrics key, Counter of termination reason values)`` over
    this process's episodes: rLLM's ``UnifiedTrainer._collect_workflow_metrics_from_episodes``
    (``rllm/trainer/unified_trainer.py``), which :func:`workflow_metrics` turns into a step's metrics.

    Examples:
        >>> from rllm_torch.rllm.types import Episode
        >>> episode_metrics([Episode(id="t:0", metrics={"turns": 1}), Episode(id="t:1", metrics={"turns": 3})])
        ({'turns': 2.0}, Counter({'unknown': 2}))
    """
    sums, counts, reasons = _tally(episodes)
    return {k: sums[k] / counts[k] for k in sums}, reasons


def workflow_metrics(episodes: list[Episode], prefix: str, ranks: RunRanks | None = None) -> dict[str, float]:
    """Mean of each numeric ``episode.metrics`` key and the share of each termination reason
    (an episode without one counts as ``unknown``, as in rLLM), over the episodes of every rank
    (``ranks``: one ``all_gather_object`` of sums and counts)."""
    sums, counts, reasons = _tally(episodes)
    if ranks is not None and ranks.distributed:
        parts = gather_objects((sums, counts, reasons), ranks.process_group)
        sums, counts, reasons = {}, Counter(), Counter()
        for part_sums, part_counts, part_reasons in parts:
            for key, value in part_sums.items():
                sums[key] = sums.get(key, 0.0) + value
            counts.update(part_counts)
            reasons.update(part_reasons)
    metrics = {f"{prefix}/{k}": sums[k] / counts[k] for k in sorted(sums)}
    total = max(sum(reasons.values()), 1)
    metrics |= {f"{prefix}/termination_reason/{r.value}": reasons[r.value] / total for r in TerminationReason}
    return metrics
