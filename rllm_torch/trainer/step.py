"""One training step, as straight-line code the trainer owns (:class:`TrainingStep`)::

    # 1. sample         episodes of the step's batch (sync: sampled now; async: from the buffer),
    #                   greedy baselines if an estimator needs them, more batches (dynamic sampling)
    # 2. groups         episodes -> trajectory groups (one per task and role), compact filtering,
    #                   groups with signal (dynamic sampling), rejection sampling, greedy baselines
    # 3. token batch    backend.transform_to_backend_batch
    # 4. score          backend.process_backend_batch: old log-probs, and what the plan needs
    #                   (state.needs: sum_pi_squared, values, ...)
    # 5. advantages     the plan's estimator of each role (the backend's compute_advantages, if it has its own)
    # 6. update         backend.update_policy

Each stage is timed into ``time/{generate, transform, log_probs, advantages, update}`` (seconds).
The backend serves the model (sampling, scoring, the update); the step decides what happens in
what order. In async mode stages 4-6 run in a thread of their own, so the event loop keeps
sampling meanwhile.

On several processes every rank runs the step on its share of the prompts; a stage that finds
nothing to train on, on every rank, ends the step on every rank together.
"""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import torch

from rllm_torch.rllm.roles import unseen_map_roles
from rllm_torch.rllm.types import Episode, TrajectoryGroup
from rllm_torch.trainer.batches import PositionedBatch
from rllm_torch.trainer.config_checks import RunSettings
from rllm_torch.trainer.logs.step_metrics import stage_timer, workflow_metrics
from rllm_torch.trainer.pipeline.baselines import attach_reward_baselines, sample_greedy_episodes
from rllm_torch.trainer.pipeline.dynamic_sampling import DynamicSampler
from rllm_torch.trainer.pipeline.rejection_sampling import apply_rejection_sampling_and_filtering
from rllm_torch.trainer.pipeline.step_warnings import FailedSteps, all_dropped_warning
from rllm_torch.trainer.pipeline.token_advantages import compute_token_advantages
from rllm_torch.trainer.pipeline.transform import TrajGroupingHook, transform_episodes_to_trajectory_groups
from rllm_torch.trainer.protocol import BackendProtocol
from rllm_torch.trainer.ranks import RunRanks
from rllm_torch.trainer.state import TrainerState

__all__ = ["TrainingStep"]


class TrainingStep:
    """The stages of one training step (module docstring), for one run.

    Args:
        backend: the run's backend.
        settings: the run's checked settings (its plan says what the estimators and losses need).
        ranks: the run's processes.
        engine: the workflow engine greedy baselines are sampled with (the policy's own).
        traj_grouping_hook: replaces the default episode -> group transform.
    """

    def __init__(
        self,
        backend: BackendProtocol,
        settings: RunSettings,
        ranks: RunRanks,
        engine: Any,
        traj_grouping_hook: TrajGroupingHook | None = None,
    ) -> None:
        self.backend, self.settings, self.ranks, self.engine = backend, settings, ranks, engine
        self.traj_grouping_hook = traj_grouping_hook
        self.dynamic_sampler = DynamicSampler(settings.dynamic_sampling, ranks=ranks)
        self.greedy_baselines = "baselines" in settings.plan.needs
        self.model_stages_in_thread = settings.async_training.enable
        self.own_advantages = type(backend).compute_advantages is not BackendProtocol.compute_advantages
        self.failed_steps = FailedSteps()  # steps in a row whose every episode failed
        self.roles_checked = False  # set once the first batch's roles were compared with the role maps

    async def run(self, item: PositionedBatch, state: TrainerState, source: Any) -> None:
        """Train on ``item`` (the step's first batch) and whatever else the step draws from ``source``."""
        metrics = state.metrics
        with stage_timer(metrics, "generate"):  # 1. sample
            state.episodes = drawn = await source.episodes(item, state)
            greedy = await self._greedy_episodes(item, state)
            if self.dynamic_sampler.config.enable:
                state.episodes, drawn, sampling = await self.dynamic_sampler.fill(
                    state.episodes, lambda: source.more(state), self._groups_of, state.global_step
                )
                metrics.update(sampling)
        if not self.ranks.any(bool(drawn)):
            return
        metrics.update(workflow_metrics(drawn, prefix="batch", ranks=self.ranks))
        self._warn(self.failed_steps.observe(drawn, self.ranks, state.global_step))  # N in a row: WorkflowError
        with stage_timer(metrics, "transform"):  # 2. groups and filters, 3. the token batch
            state.trajectory_groups = self._groups(state, greedy)
            if not self.ranks.any(state.has_trajectory_groups):  # a rank without groups trains on an empty batch
                return
            state.backend_batch = self.backend.transform_to_backend_batch(state)
        if self.model_stages_in_thread:  # the event loop keeps sampling meanwhile
            threads = torch.get_num_threads()  # a new thread would start with one intra-op thread per core

            def model_stages() -> None:
                torch.set_num_threads(threads)
                asyncio.run(self._model_stages(state))

            await asyncio.to_thread(model_stages)
        else:
            await self._model_stages(state)

    async def _model_stages(self, state: TrainerState) -> None:
        """4. score, 5. advantages, 6. update."""
        with stage_timer(state.metrics, "log_probs"):
            await self.backend.process_backend_batch(state)
        with stage_timer(state.metrics, "advantages"):
            if self.own_advantages:  # rLLM's hook: a backend with its own advantage step
                await self.backend.compute_advantages(state, self.settings.algorithm_config)
            else:
                group = self.ranks.estimator_group
                state.metrics.update(
                    compute_token_advantages(state.backend_batch, self.settings.plan, process_group=group)
                )
        with stage_timer(state.metrics, "update"):
            await self.backend.update_policy(state)

    async def _greedy_episodes(self, item: PositionedBatch, state: TrainerState) -> list[Episode]:
        """One greedy rollout per task of the step's batch (remax's baselines), scored, never
        trained on; none when no estimator of the run needs them."""
        if not self.greedy_baselines:
            return []
        step, epoch = state.global_step, state.epoch
        return await sample_greedy_episodes(self.backend, self.engine, item.batch, step=step, epoch=epoch)

    def _groups_of(self, episodes: list[Episode]) -> list[TrajectoryGroup]:
        """Episodes to groups, on this rank alone (dynamic sampling's count of prompts with signal)."""
        groups, _ = transform_episodes_to_trajectory_groups(
            episodes,
            self.settings.transform_config,
            self.settings.cf_config,
            traj_grouping_hook=self.traj_grouping_hook,
        )
        return groups

    def _groups(self, state: TrainerState, greedy: list[Episode]) -> list[TrajectoryGroup]:
        """The step's trajectory groups: transformed and compact-filtered, those with signal
        (dynamic sampling), rejection sampling, each group's greedy baseline attached."""
        settings, ranks, metrics, group = self.settings, self.ranks, state.metrics, self.ranks.estimator_group
        groups, transform_metrics = transform_episodes_to_trajectory_groups(
            state.episodes,
            settings.transform_config,
            settings.cf_config,
            traj_grouping_hook=self.traj_grouping_hook,
            process_group=group,
        )
        if self.dynamic_sampler.config.enable:  # the chosen prompts' groups that have signal
            groups = self.dynamic_sampler.config.signal(groups)
        metrics.update(transform_metrics)
        if not settings.rs_config.accumulate:  # rLLM's trainer empties it every batch (TrainerState.reset_batch)
            state.rs_state.reset()
        groups, state.episodes, rs_metrics = apply_rejection_sampling_and_filtering(
            state.episodes, groups, settings.rs_config, state.rs_state, process_group=group
        )
        metrics.update(rs_metrics)
        self._warn(all_dropped_warning(rs_metrics, settings.rs_config.min_trajs_per_group, state.global_step))
        if not self.roles_checked:  # the first batch: a role map's entry that matches no role is likely a typo
            self.roles_checked = True
            batch_roles = sorted({g.group_role for g in groups})
            roles = {role for rank_roles in ranks.gather(batch_roles) for role in rank_roles}
            self._warn(unseen_map_roles(settings.algorithm_config, roles))
        if self.greedy_baselines:  # remax: each group's greedy reward, or the group is left out (counted)
            groups, baseline_metrics = attach_reward_baselines(
                groups, greedy, settings.plan, settings.transform_config, self.traj_grouping_hook, ranks
            )
            metrics.update(baseline_metrics)
        return groups

    def _warn(self, warning: str | None) -> None:
        if warning and self.ranks.is_main:
            warnings.warn(warning, UserWarning, stacklevel=1)
