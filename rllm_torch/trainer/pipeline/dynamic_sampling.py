"""DAPO's dynamic sampling: a training step keeps drawing batches of prompts until it holds
``data.train_batch_size`` prompts whose groups carry a learning signal (not every rollout scored
alike), then trains on exactly that many; a cap on the batches drawn per step bounds the cost,
and a step that reaches it (or the end of the epoch's data) first trains on what it found and
says so.

Keys (verl's ``algorithm.filter_groups``): ``rllm.algorithm.filter_groups.enable``, ``.metric``
(``reward``: the raw rewards of a group are not all equal, within ``uniform_reward_tolerance``;
``is_correct``: neither every rollout right nor every one wrong, verl's ``acc``),
``.max_num_gen_batches`` (the batches a step may draw, the first included). verl's trainer
filters and draws more batches too; TRL filters nothing (its issue #3708).

Source: Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
arXiv:2503.14476, Section 3.2 (dynamic sampling).
"""

from __future__ import annotations

import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from rllm_torch.core.errors import ConfigError
from rllm_torch.rllm.types import Episode, TrajectoryGroup
from rllm_torch.trainer.pipeline.rejection_sampling import (
    UNIFORM_REWARD_TOLERANCE,
    RejectionSamplingConfig,
    groups_with_signal,
)
from rllm_torch.trainer.schema import GROUP_SIGNAL_METRICS, FilterGroupsSection, prompts_per_step

__all__ = ["DynamicSamplingConfig", "DynamicSampler"]


@dataclass
class DynamicSamplingConfig:
    """Options of dynamic sampling.

    Attributes:
        enable: draw batches until ``target_prompts`` prompts have signal.
        metric: ``"reward"`` or ``"is_correct"`` (see the module docstring).
        max_num_gen_batches: batches a step may draw, the first included (>= 1).
        target_prompts: prompts a step trains on (``data.train_batch_size``).
        uniform_reward_tolerance: rewards within this distance count as equal (``metric="reward"``).

    Raises:
        ConfigError: an unknown metric, a cap below 1 or a target below 1.
    """

    enable: bool = FilterGroupsSection.enable
    metric: str = FilterGroupsSection.metric
    max_num_gen_batches: int = FilterGroupsSection.max_num_gen_batches
    target_prompts: int = 1
    uniform_reward_tolerance: float = UNIFORM_REWARD_TOLERANCE

    def __post_init__(self) -> None:
        if self.metric not in GROUP_SIGNAL_METRICS:
            raise ConfigError(
                f"rllm.algorithm.filter_groups.metric must be one of {', '.join(map(repr, GROUP_SIGNAL_METRICS))} (verl's 'acc' is "
                f"'is_correct'), got {self.metric!r}."
            )
        for name in ("max_num_gen_batches", "target_prompts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"rllm.algorithm.filter_groups.{name} must be an int >= 1, got {value!r}.")

    @classmethod
    def from_config(cls, config: DictConfig) -> DynamicSamplingConfig:
        """From a run config's ``rllm.algorithm.filter_groups`` and its prompts per step
        (:func:`~rllm_torch.trainer.schema.typed_run_config`)."""
        section = config.rllm.algorithm.filter_groups
        return cls(
            enable=bool(section.enable),
            metric=section.metric,
            max_num_gen_batches=section.max_num_gen_batches,
            target_prompts=prompts_per_step(config),
        )

    def signal(self, groups: list[TrajectoryGroup]) -> list[TrajectoryGroup]:
        """The groups with a learning signal (two or more trajectories, not scored alike)."""
        return groups_with_signal(
            groups,
            RejectionSamplingConfig(
                filter_uniform_groups=True,
                uniform_filter_metric=self.metric,
                uniform_reward_tolerance=self.uniform_reward_tolerance,
            ),
        )


@dataclass
class DynamicSampler:
    """Fills one step's batch (:meth:`fill`); counts the steps that fell short over the run.

    On several processes (``ranks``, a :class:`~rllm_torch.trainer.ranks.RunRanks`) each rank
    fills its share of the step, ``target_prompts / world_size`` prompts, from its own batches:
    the ranks draw the same number of batches (one all-reduce a round: a rank keeps drawing while
    any rank is short), so every rank counts the same batches of the epoch, and each trains on its
    first share (a rank short of it trains on what it found).
    """

    config: DynamicSamplingConfig
    short_steps: int = 0
    ranks: Any = None

    async def fill(
        self,
        episodes: list[Episode],
        draw: Callable[[], Awaitable[list[Episode] | None]],
        to_groups: Callable[[list[Episode]], list[TrajectoryGroup]],
        step: int,
    ) -> tuple[list[Episode], list[Episode], dict[str, float]]:
        """Draw until ``target_prompts`` prompts have signal, or the cap or the data end.

        Args:
            episodes: the episodes of the step's first batch.
            draw: samples the next batch of the epoch and returns its episodes (None: no batch left).
            to_groups: episodes to trajectory groups (the trainer's transform).
            step: the training step, named in the warning.

        Returns:
            ``(episodes, all_episodes, metrics)``: the episodes of the first ``target_prompts``
            prompts with signal (by task id, in the order drawn), every episode drawn, and
            ``batch/dynamic_sampling/{gen_batches, prompts_with_signal, prompts_short}``.
        """
        ranks = self.ranks
        world = ranks.world_size if ranks is not None else 1
        target, cap = self.config.target_prompts // world, self.config.max_num_gen_batches
        drawn, kept, rounds = list(episodes), self.config.signal(to_groups(episodes)), 1

        def anyone(flag: bool) -> bool:  # the same answer on every rank
            return ranks.any(flag) if ranks is not None else flag

        while anyone(len(_task_ids(kept)) < target) and rounds < cap:
            more = await draw()
            if anyone(more is None):  # the epoch's data ran out (on every rank together: equal shares)
                break
            rounds += 1
            drawn += more
            kept += self.config.signal(to_groups(more))
        found = _task_ids(kept)
        chosen = set(found[:target])
        short = max(target - len(found), 0)
        found_total = float(len(found))
        if ranks is not None:  # the step's totals, over every rank
            found_total, short = ranks.reduce([found_total, float(short)])
        if anyone(short > 0):
            self.short_steps += 1
            if rounds >= cap:
                why, fix = (
                    f"max_num_gen_batches={cap} reached",
                    "raise rllm.algorithm.filter_groups.max_num_gen_batches",
                )
            else:
                why, fix = "the epoch's data ran out", "the next epoch starts a full step again"
            if ranks is None or ranks.is_main:
                warnings.warn(
                    f"dynamic sampling, step {step}: {why} with {int(found_total)} of {self.config.target_prompts} "
                    f"prompts with signal after {rounds} batch(es); training on {int(found_total)} (short step "
                    f"{self.short_steps} of this run): {fix}, or check that the prompts are not all too easy or too "
                    "hard for the policy.",
                    UserWarning,
                    stacklevel=2,
                )
        metrics = {
            "batch/dynamic_sampling/gen_batches": float(rounds),
            "batch/dynamic_sampling/prompts_with_signal": float(found_total),
            "batch/dynamic_sampling/prompts_short": float(short),
        }
        return [e for e in drawn if e.task_id in chosen], drawn, metrics


def _task_ids(groups: list[TrajectoryGroup]) -> list:
    """The distinct task ids of ``groups``, in order."""
    return list(dict.fromkeys(g.task_id for g in groups))
