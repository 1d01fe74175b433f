"""Validation metrics: ``pass@1`` and ``pass@n`` per data source, with the unbiased pass@k
estimator of Chen et al. (2021), "Evaluating Large Language Models Trained on Code",
arXiv:2107.03374, eq. 1.
"""

from __future__ import annotations

from collections import defaultdict
from math import comb

from rllm_torch.rllm.types import Episode
from rllm_torch.trainer.ranks import RunRanks

__all__ = ["unbiased_pass_at_k", "validation_pass_metrics"]


def unbiased_pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Unbiased probability that at least one of ``k`` samples drawn without replacement from
    ``num_samples`` (of which ``num_correct`` are correct) is correct: ``1 - C(n-c, k) / C(n, k)``.

    Args:
        num_samples: ``n >= k`` samples of one task.
        num_correct: ``c`` correct among them, ``0 <= c <= n``.
        k: samples per attempt, ``k >= 1``.

    Raises:
        ValueError: ``k < 1``, ``n < k`` or ``c`` outside ``[0, n]``.

    Examples:
        >>> unbiased_pass_at_k(4, 1, 1), unbiased_pass_at_k(4, 1, 4), round(unbiased_pass_at_k(4, 1, 2), 4)
        (0.25, 1.0, 0.5)
    """
    if k < 1 or num_samples < k or not 0 <= num_correct <= num_samples:
        raise ValueError(
            f"unbiased_pass_at_k needs 1 <= k <= n and 0 <= c <= n; got n={num_samples}, c={num_correct}, k={k}."
        )
    if num_samples - num_correct < k:
        return 1.0
    return 1.0 - comb(num_samples - num_correct, k) / comb(num_samples, k)


def _data_source(episode: Episode) -> str:
    source = episode.info.get("data_source")
    if source is None and isinstance(episode.task, dict):
        source = episode.task.get("data_source")
    return str(source if source is not None else "unknown")


def validation_pass_metrics(
    episodes: list[Episode], n_val: int, prefix: str = "val", *, ranks: RunRanks | None = None
) -> dict[str, float]:
    """``{prefix}/{data_source}/pass@1`` and, for ``n_val > 1``, ``pass@{n_val}``, averaged over
    the tasks (``task_id``) of each data source (``episode.info["data_source"]``, else the
    task's ``data_source`` as rLLM reads it, else ``"unknown"``). With ``ranks``, over the episodes of every rank (each rank's per-task
    sample and correct counts are gathered once: ``O(tasks)``, not ``O(episodes)``).

    pass@1 is the mean over tasks of the fraction of correct samples. pass@n uses
    :func:`unbiased_pass_at_k` with k = n_val; a task with fewer than n_val samples (some errored) uses
    k = its sample count. Episodes that ended in error count as incorrect samples.
    """
    tallies: dict[tuple[str, object], list[int]] = defaultdict(lambda: [0, 0])  # (source, task) -> [n, c]
    for episode in episodes:
        tally = tallies[(_data_source(episode), episode.task_id)]
        tally[0] += 1
        tally[1] += bool(episode.is_correct)
    if ranks is not None and ranks.distributed:
        merged: dict[tuple[str, object], list[int]] = defaultdict(lambda: [0, 0])
        for part in ranks.gather(dict(tallies)):
            for key, (n, c) in part.items():
                merged[key][0] += n
                merged[key][1] += c
        tallies = merged
    by_source: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for (source, _), (n, c) in tallies.items():
        by_source[source].append((n, c))
    metrics: dict[str, float] = {}
    for source, counts in sorted(by_source.items()):
        metrics[f"{prefix}/{source}/pass@1"] = sum(unbiased_pass_at_k(n, c, 1) for n, c in counts) / len(counts)
        if n_val > 1:
            metrics[f"{prefix}/{source}/pass@{n_val}"] = sum(
                unbiased_pass_at_k(n, c, min(n_val, n)) for n, c in counts
            ) / len(counts)
    return metrics
