"""``UnifiedTrainer``: the backend-agnostic RL training loop (rLLM's ``UnifiedTrainer``).

A run, in order::

    settings = check_run_config(config)            # checked once: the typed objects every stage reads
    resume from the newest checkpoint              # (rllm.trainer.resume_mode=auto)
    validate                                       # (val_before_train)
    for each step:                                 # the one loop; batches from SyncBatches or AsyncBatches
        TrainingStep.run                           # sample -> groups -> token batch -> score -> advantages -> update
        log, validate (every test_freq), checkpoint (every save_freq)
    final validation and checkpoint; backend.on_train_end (the final export)

A run resumes from its newest complete checkpoint and continues exactly where it stopped
(:class:`~rllm_torch.trainer.runtime.run_checkpoint.RunCheckpointer`).

On several processes (``ranks``, :class:`~rllm_torch.trainer.ranks.RunRanks`) every rank runs
this loop on its share of each step's prompts; every metric is that of the global batch (each
stage reduces its own: sums of counts, means over every rank's items, the maximum of timings),
and rank 0 alone prints, logs and writes checkpoints. A stage that finds nothing to train on
skips the step on every rank together, so the ranks' collectives stay in step.

In async mode (``rllm.async_training.enable=true``) the batches come from a producer that samples
ahead on the sampler's own weights (:class:`~rllm_torch.trainer.batches.AsyncBatches`); the loop
and the step are the same.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig

from rllm_torch.rllm.collect import collect_reward_and_advantage_from_trajectory_groups
from rllm_torch.rllm.config import AlgorithmConfig
from rllm_torch.rllm.types import Episode
from rllm_torch.trainer.backend_args import backend_args_for
from rllm_torch.trainer.backend_registry import typed_backend_config
from rllm_torch.trainer.batches import AsyncBatches, SyncBatches, positioned_batches
from rllm_torch.trainer.config_checks import RunSettings, check_run_config
from rllm_torch.trainer.logs.run_directory import config_as_run, run_directory, run_loggers, write_run_files
from rllm_torch.trainer.logs.run_lock import hold_run_directory
from rllm_torch.trainer.logs.step_metrics import episode_metrics, workflow_metrics
from rllm_torch.trainer.logs.summary import StepPlan, plan_steps, startup_summary
from rllm_torch.trainer.pipeline.compact_filtering import CompactFilteringConfig
from rllm_torch.trainer.pipeline.rejection_sampling import RejectionSamplingConfig
from rllm_torch.trainer.pipeline.transform import TransformConfig, transform_episodes_to_trajectory_groups
from rllm_torch.trainer.pipeline.validation import validation_pass_metrics
from rllm_torch.trainer.protocol import BackendProtocol
from rllm_torch.trainer.ranks import RunRanks
from rllm_torch.trainer.runtime.run_checkpoint import RunCheckpointer
from rllm_torch.trainer.runtime.stop import StopGuard, StopSignals, TrainingStopped
from rllm_torch.trainer.state import TrainerState
from rllm_torch.trainer.step import TrainingStep
from rllm_torch.trainer.trainer_arguments import refuse_unknown_arguments
from rllm_torch.trainer.workflow import Workflow
from rllm_torch.trainer.workflow_engine import UnifiedWorkflowEngine

__all__ = ["UnifiedTrainer"]


class UnifiedTrainer:
    """Backend-agnostic trainer: workflows sample episodes, the backend trains on them.

    Args:
        backend_cls: a :class:`BackendProtocol` subclass, built ``backend_cls(config=config, **backend_args)``
            with the tasks as ``tasks=`` and the checked ``algorithm_config=`` when it reads them
            (:func:`~rllm_torch.trainer.backend_args.backend_args_for`).
        config: the run config (a composed ``rllm-torch-train`` config, or any subset of its keys), its ``backend``
            section typed by ``backend_cls``'s settings (:func:`~.backend_registry.typed_backend_config`).
        workflow_class: the :class:`Workflow` run on each task.
        train_dataset, val_dataset: what ``backend.get_dataloader`` batches (lists of task dicts).
        workflow_args, backend_args: keyword arguments of the workflow and backend.
        traj_grouping_hook: replaces the default episode → group transform.
        traj_group_adv_estimator_map: group role → estimator name, over ``rllm.algorithm.estimator_map``.
        ranks: the run's processes (default: one); given to the backend as ``ranks=``.
        run_files: ``{path relative to the run directory: text}`` that rank 0 writes when the run
            starts to train (not when its checkpoint already holds every step: such a run writes
            nothing), e.g. the command line's ``config.yaml`` (the ``null`` settings the backend fills
            written with their values and sources: :func:`~.logs.run_directory.config_as_run`).
        stop_signals: a :class:`~rllm_torch.trainer.runtime.stop.StopSignals` whose request (a
            SIGTERM; a SIGINT once the steps began) :meth:`fit` honours within the step it is in:
            the trained weights' checkpoint, then :class:`~rllm_torch.trainer.runtime.stop.TrainingStopped`.
            None: signals are not handled.
        store: rLLM's cross-episode store, given to each workflow as ``store=``.
        settings: ``config`` already checked (:func:`~rllm_torch.trainer.config_checks.check_run_config`,
            as the command line does before it starts the processes); None: checked here.

    Raises:
        UnknownArgumentError: a keyword argument not listed here (the closest one named), or one of
            rLLM's agent-flow arguments (``agent_flow``, ``evaluator``, ``hooks``), not implemented.
        ConfigError / UnknownEstimatorError: bad settings, before anything is trained; the run
            directory is another process's (:mod:`~rllm_torch.trainer.logs.run_lock`).
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
        settings: RunSettings | None = None,
        store: Any = None,
        **kwargs: Any,
    ) -> None:
        refuse_unknown_arguments(kwargs, UnifiedTrainer)
        config = typed_backend_config(config, backend_cls)  # its backend section typed by the backend's settings
        self.stop_signals, self.ranks = stop_signals, ranks if ranks is not None else RunRanks()
        self.run_files = dict(run_files or {})
        self.already_complete = False  # set by fit: the checkpoint held every planned step
        self.workflow_class = workflow_class
        self.workflow_args = {**(workflow_args or {}), **({"store": store} if store is not None else {})}
        self.train_dataset, self.val_dataset = train_dataset, val_dataset
        self.config, self.rllm_config = config, config.rllm
        self.traj_grouping_hook = traj_grouping_hook
        self.traj_group_adv_estimator_map = traj_group_adv_estimator_map or {}
        if settings is None or self.traj_group_adv_estimator_map:  # (the command line's are checked already)
            settings = check_run_config(config, self.ranks.world_size, estimator_map=self.traj_group_adv_estimator_map)
        self.settings = settings
        self.run_lock = hold_run_directory(run_directory(config), self.ranks)  # one run per directory, until shutdown
        backend_args = backend_args_for(
            backend_cls, backend_args, settings.algorithm_config, train_dataset, val_dataset
        )
        self.backend = backend_cls(config=config, ranks=self.ranks, **backend_args)
        self.backend.validate_config()
        if "config.yaml" in self.run_files:  # the settings the backend filled in, with where each came from
            used, sources = getattr(self.backend, "config", config), getattr(self.backend, "setting_sources", {})
            self.run_files["config.yaml"] = config_as_run(self.run_files["config.yaml"], used, sources)
        self.backend.validate_prompts([t for ds in (train_dataset, val_dataset) if isinstance(ds, list) for t in ds])
        self.run_dir, self.episode_logger, self.logger = run_loggers(config, self.ranks)
        self.checkpointer = RunCheckpointer(self.backend, config, self.run_dir, self.ranks)
        rollout_engine = self.backend.init_rollout_engine(
            cf_config=settings.cf_config,
            transform_config=settings.transform_config,
            rs_config=settings.rs_config,
            algorithm_config=settings.algorithm_config,
        )
        self.agent_workflow_engine = self._workflow_engine(rollout_engine)
        self.async_workflow_engine = (  # async training: the training episodes from an engine with its own weights
            self._workflow_engine(self.backend.init_async_rollout_engine()) if settings.async_training.enable else None
        )
        self.training_step = TrainingStep(
            self.backend, settings, self.ranks, self.agent_workflow_engine, self.traj_grouping_hook
        )
        self.tokenizer, self.val_history = getattr(self.backend, "tokenizer", None), []
        # issue 43: a SIGTERM inside a step, a validation or the export abandons it and checkpoints (runtime/stop.py)
        self.stop_guard = StopGuard(
            stop_signals,
            checkpoint=lambda state: self.checkpointer.save(state, self.val_history),
            saved_step=lambda: self.checkpointer.saved_step,
            newest=self.checkpointer.newest,
            backend=self.backend,
            distributed=self.ranks.distributed or settings.async_training.enable,
        )

    _collect_workflow_metrics_from_episodes = staticmethod(episode_metrics)  # rLLM's UnifiedTrainer attributes:

    @property
    def algorithm_config(self) -> AlgorithmConfig:
        return self.settings.algorithm_config

    @property
    def cf_config(self) -> CompactFilteringConfig:
        return self.settings.cf_config

    @property
    def transform_config(self) -> TransformConfig:
        return self.settings.transform_config

    @property
    def rs_config(self) -> RejectionSamplingConfig:
        return self.settings.rs_config

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
        final validation (with ``test_freq > 0`` only, as rLLM's ``_fit_on_policy``), its checkpoint
        and the backend's ``on_train_end`` (the torch backend's ``checkpoints/final`` export).

        The end of the run is a stage of its own: a run stopped during it (after its last step)
        does on the next start only what is missing. A run is complete, and a start says so and
        writes nothing, only when its checkpoint holds every planned step, the final validation
        (when due) and the backend's :meth:`~BackendProtocol.train_end_complete`. ``rllm.trainer.val_only=true``
        validates the checkpoint's (or the initial) weights again, and trains nothing. Rank 0 prints the summary.
        """
        await self.agent_workflow_engine.initialize_pool()
        state = TrainerState(needs=self.settings.plan.needs, plan=self.settings.plan)  # needs: what the passes compute
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
            await self._train_steps(state, dataloader, plan)
            self.stop_if_asked(state)  # a SIGTERM during the last step: its checkpoint before the end of the run
        validated = trainer.test_freq > 0 and await self._validate_async(state)  # rLLM: test_freq <= 0, none
        if validated or self.checkpointer.saved_step != state.global_step:
            if state.global_step > 0:  # the final validation's metrics belong in the last checkpoint
                self.checkpointer.save(state, self.val_history)
        with self.stop_guard.stage(state):  # a SIGTERM during the export: it is done again by the same command
            await self.backend.on_train_end(state)
        if plan.note and self.ranks.is_main:
            print(f"trained {state.global_step} steps over {state.epoch + 1} epochs: {plan.note}", flush=True)
        if self.settings.dynamic_sampling.enable and state.global_step < plan.total_steps and self.ranks.is_main:
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
        unfinished, trainer = [], self.rllm_config.trainer
        if self.val_dataset is not None and trainer.test_freq > 0 and state.last_validation_step != state.global_step:
            unfinished.append("the final validation")
        if self.ranks.any(not self.backend.train_end_complete()):
            unfinished.append("the end of training (the torch backend: the checkpoints/final export)")
        return unfinished

    def epochs(self, state: TrainerState, plan: StepPlan) -> Any:
        """The epochs to train (dynamic sampling with ``total_batches``: as many as its steps take)."""
        by_steps = self.settings.dynamic_sampling.enable and self.rllm_config.trainer.total_batches
        return itertools.count(state.epoch) if by_steps else range(state.epoch, plan.epochs)

    def _batches(self, state: TrainerState, dataloader: Any, plan: StepPlan) -> SyncBatches | AsyncBatches:
        """Where the steps' batches come from: sampled when taken, or ahead (async training)."""
        batches = positioned_batches(dataloader, self.epochs(state, plan), state.epoch, state.batch_in_epoch)
        if not self.settings.async_training.enable:
            return SyncBatches(self.backend, self.agent_workflow_engine, batches)
        engine, config = self.async_workflow_engine, self.settings.async_training
        return AsyncBatches(self.backend, engine, batches, config, self.ranks, start_step=state.global_step)

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

    async def _train_steps(self, state: TrainerState, dataloader: Any, plan: StepPlan) -> None:
        """The one loop: each step takes its batch (waiting for it in async mode: its
        ``time/generate``), runs :class:`~rllm_torch.trainer.step.TrainingStep`, then
        :meth:`end_step`; the backend's epoch hooks around each epoch's steps. A batch that is
        None on any rank (the data ran out) ends the loop on every rank."""
        self.logger.start_progress(state.total_steps, state.global_step)
        if self.stop_signals is not None:  # from here a Ctrl-C keeps the trained weights, as SIGTERM (issue 49)
            self.stop_signals.take_ctrl_c()
        source = self._batches(state, dataloader, plan)
        await source.start()
        epoch_started = None
        try:
            while state.global_step < plan.total_steps:
                self.stop_if_asked(state)  # a SIGTERM during the step before (or the start-up)
                start = time.perf_counter()
                item = await source.next(state.global_step + 1)
                waited = time.perf_counter() - start
                if self.ranks.any(item is None):  # the data ran out (on some rank: every rank stops)
                    break
                with self.stop_guard.stage(state):  # a SIGTERM inside: the step undone, the one before checkpointed
                    if item.epoch != epoch_started:
                        state.epoch = epoch_started = item.epoch
                        await self.backend.on_epoch_start(state)
                    state.reset_batch()
                    state.global_step += 1
                    source.take(item, state)
                    await self.backend.on_batch_start(state)
                    await self.training_step.run(item, state, source)
                state.metrics |= source.step_metrics(state)
                state.metrics["time/generate"] = state.metrics.get("time/generate", 0.0) + waited
                weight_sync = state.metrics.get("time/weight_sync", 0.0)
                state.metrics["time/step"] = time.perf_counter() - start + weight_sync
                await self.end_step(state)
                last_step = state.global_step >= plan.total_steps
                if state.batch_in_epoch == len(dataloader) or last_step:
                    await self.backend.on_epoch_end(state)
                    if not last_step:  # where a checkpoint taken now resumes
                        state.epoch, state.batch_in_epoch = state.epoch + 1, 0
                await source.after_step(state, last_step)
        finally:
            await source.stop()

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
        state.is_training = False  # the backend batches validation its own way (data.val_batch_size)
        try:
            for batch in self.backend.get_dataloader(self.val_dataset, state):
                episodes += await self.backend.generate_episodes(
                    batch, agent_workflow_engine=self.agent_workflow_engine, is_validation=True
                )
        finally:
            state.is_training = True
        hook = self.traj_grouping_hook
        groups, _ = transform_episodes_to_trajectory_groups(
            episodes, self.transform_config, self.cf_config, traj_grouping_hook=hook, process_group=group
        )
        rewards = collect_reward_and_advantage_from_trajectory_groups(
            groups, self.algorithm_config, collect_advantage=False, process_group=group
        )
        metrics = {f"val/{k}": v for k, v in rewards.items()}
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
        self.run_lock.release()
