"""``UnifiedTrainer``: the backend-agnostic RL training loop (rLLM's ``UnifiedTrainer``).

One training step, in order::

    episodes = generate_episodes(batch)           # workflows sample from the policy
    (remax: generate_baseline_episodes(batch), one greedy rollout per task)
    metrics  = workflow + termination metrics
    groups   = transform_to_groups(episodes)      # one group per (task, role)
    groups   = rejection_sampling(groups)         # (remax: each group's greedy reward attached)
    batch    = transform_to_backend_batch(groups) # packed tensors
    process_backend_batch(batch)                  # old log-probs
    compute_advantages(batch)                     # tensor estimators, per role
    update_policy(batch)
    log(metrics)
    validate (every test_freq steps), checkpoint (every save_freq steps)

A run resumes from its newest complete checkpoint (``rllm.trainer.resume_mode=auto``, see
:class:`~rllm_torch.trainer.runtime.run_checkpoint.RunCheckpointer`) and continues exactly where it stopped.

On several processes (``ranks``, :class:`~rllm_torch.trainer.ranks.RunRanks`) every rank runs
this loop on its share of each step's prompts; every metric is that of the global batch (each
stage reduces its own: sums of counts, means over every rank's items, the maximum of timings),
and rank 0 alone prints, logs and writes checkpoints. A stage that finds nothing to train on
skips the step on every rank together, so the ranks' collectives stay in step.

In async mode (``rllm.async_training.enable=true``) the episodes of a step come from a producer
that samples ahead on the sampler's own weights (:mod:`~rllm_torch.trainer.async_loop`), and the
stages from the log-probs on run in a thread, so sampling goes on during the update.

**Length.** Longer than a module here should be (about 450 lines) because one step's stages,
the epochs, validation, the end of a run and SIGTERM are one loop read in one order; each stage's
work is a function of :mod:`~rllm_torch.trainer.pipeline` or :mod:`~rllm_torch.trainer.runtime`,
and the async loop is its own module.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from rllm_torch.rllm.collect import collect_reward_and_advantage_from_trajectory_groups
from rllm_torch.rllm.config import AlgorithmConfig
from rllm_torch.rllm.roles import needs_greedy_baselines, unseen_map_roles
from rllm_torch.rllm.types import Episode
from rllm_torch.trainer.async_loop import fit_streaming
from rllm_torch.trainer.config_checks import check_run_config
from rllm_torch.trainer.logs.run_directory import run_loggers, write_run_files
from rllm_torch.trainer.logs.step_metrics import stage_timer, workflow_metrics
from rllm_torch.trainer.logs.summary import StepPlan, plan_steps, startup_summary
from rllm_torch.trainer.pipeline.async_rollouts import AsyncTrainingConfig
from rllm_torch.trainer.pipeline.baselines import attach_reward_baselines, sample_greedy_episodes
from rllm_torch.trainer.pipeline.dynamic_sampling import DynamicSampler, DynamicSamplingConfig
from rllm_torch.trainer.pipeline.rejection_sampling import apply_rejection_sampling_and_filtering
from rllm_torch.trainer.pipeline.settings import build_pipeline_configs
from rllm_torch.trainer.pipeline.transform import transform_episodes_to_trajectory_groups
from rllm_torch.trainer.pipeline.validation import validation_pass_metrics
from rllm_torch.trainer.protocol import BackendProtocol
from rllm_torch.trainer.ranks import RunRanks
from rllm_torch.trainer.runtime.run_checkpoint import RunCheckpointer
from rllm_torch.trainer.runtime.stop import StopGuard, StopSignals, TrainingStopped
from rllm_torch.trainer.schema import typed_run_config
from rllm_torch.trainer.state import TrainerState
from rllm_torch.trainer.workflow import Workflow
from rllm_torch.trainer.workflow_engine import UnifiedWorkflowEngine

__all__ = ["UnifiedTrainer"]


class UnifiedTrainer:
    """Backend-agnostic trainer: workflows sample episodes, the backend trains on them.

    Args:
        backend_cls: a :class:`BackendProtocol` subclass, built ``backend_cls(config=config, **backend_args)``.
        config: the run config, typed by :func:`~rllm_torch.trainer.schema.typed_run_config`
            (a composed ``rllm-torch-train`` config, or any subset of its keys).
        workflow_class: the :class:`Workflow` run on each task.
        train_dataset, val_dataset: what ``backend.get_dataloader`` batches (lists of task dicts).
        workflow_args, backend_args: keyword arguments of the workflow and backend.
        traj_grouping_hook: replaces the default episode → group transform.
        traj_group_adv_estimator_map: group role → estimator name, over ``rllm.algorithm.estimator_map``.
        ranks: the run's processes (default: one); given to the backend as ``ranks=``.
        run_files: ``{path relative to the run directory: text}`` that rank 0 writes when the run
            starts to train (not when its checkpoint already holds every step: such a run writes
            nothing), e.g. the command line's ``config.yaml``.
        stop_signals: a :class:`~rllm_torch.trainer.runtime.stop.StopSignals` whose request (a
            SIGTERM) :meth:`fit` honours after the step it is in: that step's checkpoint, then
            :class:`~rllm_torch.trainer.runtime.stop.TrainingStopped`. None: signals are not handled.

    Raises:
        ConfigError / UnknownEstimatorError: bad settings, before anything is trained.
        CheckpointMismatchError / CheckpointError: the checkpoint to resume from does not fit
            the config or cannot be read (here); a checkpoint could not be written (in :meth:`fit`).
    """

    def __init__(
        self,
        backend_cls: type[BackendProtocol],
        config: DictConfig,
        workflow_class: type[Workflow],
        train_dataset: Any = None,
        val_dataset: Any = None,
        workflow_args: dict | None = None,
        backend_args: dict | None = None,
        *,
        traj_grouping_hook: Callable | None = None,
        traj_group_adv_estimator_map: dict | None = None,
        ranks: RunRanks | None = None,
        run_files: dict[str, str] | None = None,
        stop_signals: StopSignals | None = None,
        **kwargs: Any,
    ) -> None:
        config = typed_run_config(config)
        self.stop_signals = stop_signals
        self.ranks = ranks if ranks is not None else RunRanks()
        self.run_files = dict(run_files or {})
        self.already_complete = False  # set by fit: the checkpoint held every planned step
        self.workflow_class, self.workflow_args = workflow_class, workflow_args or {}
        self.train_dataset, self.val_dataset = train_dataset, val_dataset
        self.config, self.rllm_config = config, config.rllm
        self.traj_grouping_hook = traj_grouping_hook
        self.traj_group_adv_estimator_map = traj_group_adv_estimator_map or {}
        if losses := AlgorithmConfig(estimator_map=dict(self.traj_group_adv_estimator_map)).loss_fn_map:
            # the (estimator, loss) pairs' losses join the run config's, for its checks and the backend's update
            merged = {**(OmegaConf.select(config, "rllm.algorithm.loss_fn_map") or {}), **losses}
            OmegaConf.update(config, "rllm.algorithm.loss_fn_map", merged, force_add=True)
        check_run_config(config, self.ranks.world_size, estimator_map=self.traj_group_adv_estimator_map)
        pipeline = build_pipeline_configs(config, self.traj_group_adv_estimator_map)
        self.cf_config, self.transform_config = pipeline.compact_filtering, pipeline.transform
        self.rs_config, self.algorithm_config = pipeline.rejection_sampling, pipeline.algorithm
        self.dynamic_sampler = DynamicSampler(DynamicSamplingConfig.from_config(config), ranks=self.ranks)
        self.roles_checked = False  # set once the first batch's roles were compared with the role maps
        self.greedy_baselines = needs_greedy_baselines(self.algorithm_config, self.traj_group_adv_estimator_map)
        self.backend = backend_cls(config=config, ranks=self.ranks, **(backend_args or {}))
        self.backend.validate_config()
        self.backend.validate_prompts([t for ds in (train_dataset, val_dataset) if isinstance(ds, list) for t in ds])
        self.run_dir, self.episode_logger, self.logger = run_loggers(config, self.ranks)
        self.checkpointer = RunCheckpointer(self.backend, config, self.run_dir, self.ranks)
        rollout_engine = self.backend.init_rollout_engine(
            cf_config=self.cf_config,
            transform_config=self.transform_config,
            rs_config=self.rs_config,
            algorithm_config=self.algorithm_config,
        )
        self.agent_workflow_engine = self._workflow_engine(rollout_engine)
        self.async_config = AsyncTrainingConfig.from_config(config)
        # async training: the training episodes come from a second engine with its own weights
        self.async_workflow_engine = (
            self._workflow_engine(self.backend.init_async_rollout_engine()) if self.async_config.enable else None
        )
        self.tokenizer, self.val_history = getattr(self.backend, "tokenizer", None), []
        # issue 43: a SIGTERM inside a step, a validation or the export abandons it and checkpoints (runtime/stop.py)
        self.stop_guard = StopGuard(
            stop_signals,
            checkpoint=lambda state: self.checkpointer.save(state, self.val_history),
            saved_step=lambda: self.checkpointer.saved_step,
            newest=self.checkpointer.newest,
            backend=self.backend,
            distributed=self.ranks.distributed or self.async_config.enable,
        )

    def _workflow_engine(self, rollout_engine: Any) -> UnifiedWorkflowEngine:
        wf = self.rllm_config.workflow
        return UnifiedWorkflowEngine(
            self.workflow_class,
            self.workflow_args,
            rollout_engine,
            self.config,
            n_parallel_tasks=wf.n_parallel_tasks,
            retry_limit=wf.retry_limit,
            raise_on_error=wf.raise_on_error,
            reward_timeout_s=wf.reward_timeout_s,
            episode_logger=self.episode_logger,
        )

    def fit(self) -> None:
        """Train (sync entry point; runs :meth:`fit_async` in a new event loop)."""
        asyncio.run(self.fit_async())

    async def fit_async(self) -> None:
        """Validate (if configured), train for the planned steps, then the end of the run: the
        final validation, its checkpoint and the backend's ``on_train_end`` (the torch backend's
        ``checkpoints/final`` export). Rank 0 prints the start-up summary first.

        The end of the run is a stage of its own: a run stopped during it (after its last step)
        does on the next start only what is missing. A run is complete, and a start says so and
        writes nothing, only when its checkpoint holds every planned step, the final validation
        (when there is a validation set) and the backend's :meth:`~BackendProtocol.train_end_complete`.
        ``rllm.trainer.val_only=true`` validates the checkpoint's (or the initial) weights again
        whatever was done, and trains nothing.
        """
        await self.agent_workflow_engine.initialize_pool()
        state = TrainerState()
        resumed = self.checkpointer.resume(state, self.val_history)
        trainer = self.rllm_config.trainer
        dataloader = self.backend.get_dataloader(self.train_dataset, state)
        plan = plan_steps(len(dataloader), trainer.total_epochs, trainer.total_batches)
        state.total_steps = plan.total_steps
        trained = resumed is not None and state.global_step >= plan.total_steps
        unfinished = self._unfinished_end(state) if trained else []
        if self.ranks.is_main:
            print("\n".join(startup_summary(self, state, resumed, plan, unfinished)), flush=True)
        if trained and not unfinished and not trainer.val_only:
            self.already_complete = True
            return  # nothing to train, and nothing in the run directory is written again
        if self.ranks.is_main:
            write_run_files(self.run_dir, self.run_files, resumed, self.checkpointer.changes)
        resume_step = resumed.step if resumed is not None else -1
        self.logger.open(resume_step=resume_step, validated=state.last_validation_step == resume_step)
        if self.val_history:  # the bar and the next metrics table show the last validation
            self.logger.restore_validation(*self.val_history[-1])
        await self.backend.on_train_start(state)
        if trainer.val_only:
            await self._validate_async(state, again=True)
            return
        if trainer.val_before_train and resumed is None:
            await self._validate_async(state)
        if resumed is not None and not trained and self._validation_due(state):  # stopped during it (issue 43)
            await self._validate_async(state)
        if not trained:
            await self._fit_async(state, dataloader, plan)
            self.stop_if_asked(state)  # a SIGTERM during the last step: its checkpoint before the end of the run
        if await self._validate_async(state) or self.checkpointer.saved_step != state.global_step:
            if state.global_step > 0:  # the final validation's metrics belong in the last checkpoint
                self.checkpointer.save(state, self.val_history)
        with self.stop_guard.stage(state):  # a SIGTERM during the export: it is done again by the same command
            await self.backend.on_train_end(state)
        if plan.note and self.ranks.is_main:
            print(f"trained {state.global_step} steps over {state.epoch + 1} epochs: {plan.note}", flush=True)
        if self.dynamic_sampler.config.enable and state.global_step < plan.total_steps and self.ranks.is_main:
            print(
                f"dynamic sampling: trained {state.global_step} steps in rllm.trainer.total_epochs={trainer.total_epochs} "
                f"(of {plan.total_steps} batches): a step draws batches until it has enough prompts with signal; set "
                "rllm.trainer.total_batches to train a number of steps",
                flush=True,
            )

    def stop_if_asked(self, state: TrainerState) -> None:
        """On a stop request (any rank): checkpoint the step reached if new, raise TrainingStopped."""
        if self.stop_signals is None or not self.ranks.any(self.stop_signals.requested):
            return
        if state.global_step > 0 and self.checkpointer.saved_step != state.global_step:
            self.checkpointer.save(state, self.val_history)
        raise TrainingStopped(self.stop_signals.name or "SIGTERM", state.global_step, self.checkpointer.newest())

    def _unfinished_end(self, state: TrainerState) -> list[str]:
        """What the end of a run resumed at its last step still has to do (the same on every rank)."""
        unfinished = []
        if self.val_dataset is not None and state.last_validation_step != state.global_step:
            unfinished.append("the final validation")
        if self.ranks.any(not self.backend.train_end_complete()):
            unfinished.append("the end of training (the torch backend: the checkpoints/final export)")
        return unfinished

    def epochs(self, state: TrainerState, plan: StepPlan) -> Any:
        """The epochs to train: with dynamic sampling and ``total_batches``, as many as it takes
        (a step draws several batches)."""
        by_steps = self.dynamic_sampler.config.enable and self.rllm_config.trainer.total_batches
        return itertools.count(state.epoch) if by_steps else range(state.epoch, plan.epochs)

    async def end_step(self, state: TrainerState) -> None:
        """After a step's update: the slowest rank's timings, the log, validation and checkpoint when due."""
        await self.backend.on_batch_end(state)
        self.ranks.reduce_max_metrics(state.metrics)  # the slowest rank's timings
        self.logger.log(state.metrics, step=state.global_step)
        if self._validation_due(state):
            await self._validate_async(state)
        if self.checkpointer.due(state):
            self.checkpointer.save(state, self.val_history)

    def _validation_due(self, state: TrainerState) -> bool:
        """Whether ``state.global_step`` is a step to validate at (``test_freq``) not validated yet."""
        test_freq = self.rllm_config.trainer.test_freq
        step = state.global_step
        return test_freq > 0 and step > 0 and step % test_freq == 0 and state.last_validation_step != step

    async def _fit_async(self, state: TrainerState, dataloader: Any, plan: StepPlan) -> None:
        self.logger.start_progress(state.total_steps, state.global_step)
        if self.async_config.enable:
            await fit_streaming(self, state, dataloader, plan)
            return
        for epoch in self.epochs(state, plan):
            state.epoch = epoch
            await self.backend.on_epoch_start(state)
            if hasattr(dataloader, "set_epoch"):
                dataloader.set_epoch(epoch)
            batches = iter(itertools.islice(dataloader, state.batch_in_epoch, None))  # resumed: skip the done ones

            async def next_batch(it=batches) -> Any:  # dynamic sampling: more of the epoch's batches
                batch = next(it, None)
                state.batch_in_epoch += batch is not None  # drawn counts as done (a resumed run skips it)
                return batch

            for batch in batches:
                if state.global_step >= plan.total_steps:
                    break
                self.stop_if_asked(state)  # a SIGTERM during the step before (or the start-up)
                with self.stop_guard.stage(state):  # a SIGTERM inside: the step undone, the one before checkpointed
                    state.reset_batch()
                    state.global_step += 1
                    state.batch_in_epoch += 1
                    await self.backend.on_batch_start(state)
                    start = time.perf_counter()
                    await self.train_batch(batch, state, next_batch, self._generate_now)
                state.metrics["time/step"] = time.perf_counter() - start
                await self.end_step(state)
            await self.backend.on_epoch_end(state)
            if state.global_step >= plan.total_steps:
                break
            state.epoch, state.batch_in_epoch = epoch + 1, 0  # where a checkpoint taken now resumes

    async def _generate_now(self, batch: Any, state: TrainerState) -> list[Episode]:
        """The synchronous run's sampling: ``batch``'s episodes from the policy as it is now."""
        self.agent_workflow_engine.set_training_step(state.global_step, mode="train", epoch=state.epoch)
        return await self.backend.generate_episodes(
            batch, agent_workflow_engine=self.agent_workflow_engine, is_validation=False
        )

    async def train_batch(
        self,
        batch: Any,
        state: TrainerState,
        next_batch: Callable[[], Awaitable[Any]],
        episodes_of: Callable[[Any, TrainerState], Awaitable[list[Episode]]],
    ) -> None:
        """One step's stages, each timed into ``time/{generate, transform, log_probs, advantages,
        update}`` (seconds; the slowest rank's once reduced; ``time/step`` is their total with
        the metrics in between). ``episodes_of(batch, state)`` gives a batch's episodes (sampled
        now, or in async mode taken from the buffer: ``time/generate`` is then the wait). With
        dynamic sampling, ``generate`` draws more batches (``next_batch``) until the step has
        enough prompts with signal."""
        ranks, group = self.ranks, self.ranks.estimator_group
        with stage_timer(state.metrics, "generate"):
            state.episodes = await episodes_of(batch, state)
            drawn = state.episodes
            greedy = []  # remax: one greedy rollout per task, scored, never trained on
            if self.greedy_baselines:
                engine, step = self.agent_workflow_engine, state.global_step
                greedy = await sample_greedy_episodes(self.backend, engine, batch, step=step, epoch=state.epoch)
            if self.dynamic_sampler.config.enable:
                state.episodes, drawn, sampling_metrics = await self._fill_with_signal(state, next_batch, episodes_of)
                state.metrics.update(sampling_metrics)
        if not ranks.any(bool(drawn)):
            return
        state.metrics.update(workflow_metrics(drawn, prefix="batch", ranks=ranks))
        with stage_timer(state.metrics, "transform"):
            state.trajectory_groups, transform_metrics = transform_episodes_to_trajectory_groups(
                state.episodes,
                self.transform_config,
                self.cf_config,
                traj_grouping_hook=self.traj_grouping_hook,
                process_group=group,
            )
            if self.dynamic_sampler.config.enable:  # the chosen prompts' groups that have signal
                state.trajectory_groups = self.dynamic_sampler.config.signal(state.trajectory_groups)
            state.metrics.update(transform_metrics)
            state.trajectory_groups, state.episodes, rs_metrics = apply_rejection_sampling_and_filtering(
                state.episodes, state.trajectory_groups, self.rs_config, state.rs_state, process_group=group
            )
            state.metrics.update(rs_metrics)
            if not self.roles_checked:  # the first batch: a role map's entry that matches no role is likely a typo
                self.roles_checked = True
                batch_roles = sorted({g.group_role for g in state.trajectory_groups})
                roles = {role for rank_roles in ranks.gather(batch_roles) for role in rank_roles}
                if (warning := unseen_map_roles(self.algorithm_config, roles)) and ranks.is_main:
                    warnings.warn(warning, UserWarning, stacklevel=1)
            if self.greedy_baselines:  # remax: each group's greedy reward, or the group is left out (counted)
                state.trajectory_groups, baseline_metrics = attach_reward_baselines(
                    state.trajectory_groups,
                    greedy,
                    self.algorithm_config,
                    self.transform_config,
                    self.traj_grouping_hook,
                    ranks,
                )
                state.metrics.update(baseline_metrics)
            if not ranks.any(state.has_trajectory_groups):  # a rank without groups trains on an empty batch
                return
            state.backend_batch = self.backend.transform_to_backend_batch(state)
        if self.async_config.enable:  # in a thread of its own: the event loop keeps sampling meanwhile
            threads = torch.get_num_threads()  # a new thread would start with one intra-op thread per core

            def update() -> None:
                torch.set_num_threads(threads)
                asyncio.run(self._update_async(state))

            await asyncio.to_thread(update)
        else:
            await self._update_async(state)

    async def _update_async(self, state: TrainerState) -> None:
        """The stages after the backend batch: log-probs, advantages, update (timed)."""
        with stage_timer(state.metrics, "log_probs"):
            await self.backend.process_backend_batch(state)
        with stage_timer(state.metrics, "advantages"):
            await self.backend.compute_advantages(state, self.algorithm_config)
        with stage_timer(state.metrics, "update"):
            await self.backend.update_policy(state)

    async def _fill_with_signal(
        self,
        state: TrainerState,
        next_batch: Callable[[], Awaitable[Any]],
        episodes_of: Callable[[Any, TrainerState], Awaitable[list[Episode]]],
    ) -> tuple[list[Episode], list[Episode], dict[str, float]]:
        """DAPO's dynamic sampling (:class:`~rllm_torch.trainer.pipeline.dynamic_sampling.DynamicSampler`):
        every extra batch drawn counts as done in the epoch (a resumed run skips it)."""

        async def draw() -> list[Episode] | None:
            batch = await next_batch()
            return None if batch is None else await episodes_of(batch, state)

        def to_groups(episodes: list[Episode]) -> list:
            groups, _ = transform_episodes_to_trajectory_groups(
                episodes, self.transform_config, self.cf_config, traj_grouping_hook=self.traj_grouping_hook
            )
            return groups

        return await self.dynamic_sampler.fill(state.episodes, draw, to_groups, state.global_step)

    async def _validate_async(self, state: TrainerState, *, again: bool = False) -> dict[str, float]:
        """:meth:`_validate_now`, abandoned by a SIGTERM (the trained weights checkpointed, runtime/stop.py)."""
        with self.stop_guard.stage(state, self.val_history):
            return await self._validate_now(state, again=again)

    async def _validate_now(self, state: TrainerState, *, again: bool = False) -> dict[str, float]:
        """Validate once per step (``again``: even a step already validated): pass@1 / pass@n_val
        per data source, plus reward metrics, over every rank's share of the validation set;
        returns the metrics ({}: no validation ran)."""
        if self.val_dataset is None or (state.last_validation_step == state.global_step and not again):
            return {}
        if not await self.backend.on_validation_start(state):
            return {}
        state.last_validation_step = state.global_step
        start = time.perf_counter()
        group = self.ranks.estimator_group
        self.agent_workflow_engine.set_training_step(state.global_step, mode="val", epoch=state.epoch)
        episodes: list[Episode] = []
        for batch in self.backend.get_dataloader(self.val_dataset, state):
            episodes += await self.backend.generate_episodes(
                batch, agent_workflow_engine=self.agent_workflow_engine, is_validation=True
            )
        groups, _ = transform_episodes_to_trajectory_groups(
            episodes,
            self.transform_config,
            self.cf_config,
            traj_grouping_hook=self.traj_grouping_hook,
            process_group=group,
        )
        metrics = {
            f"val/{k}": v
            for k, v in collect_reward_and_advantage_from_trajectory_groups(
                groups, self.algorithm_config, collect_advantage=False, process_group=group
            ).items()
        }
        metrics |= validation_pass_metrics(episodes, self.rllm_config.rollout.n_val, ranks=self.ranks)
        metrics |= workflow_metrics(episodes, prefix="val", ranks=self.ranks)
        metrics["time/testing"] = time.perf_counter() - start
        self.ranks.reduce_max_metrics(metrics)
        self.logger.log(metrics, step=state.global_step)
        self.val_history.append((state.global_step, metrics))
        await self.backend.on_validation_end(state)
        return metrics

    def shutdown(self) -> None:
        """Release the workflow pool, the backend and the metric files."""
        self.agent_workflow_engine.shutdown()
        self.backend.shutdown()
        self.logger.finish()
