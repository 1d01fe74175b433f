"""``TorchBackend``: the embedded backend. A ``transformers`` causal LM (the
:class:`~rllm_torch.backends.torch_backend.actor.Actor`) is sampled by :class:`TorchRolloutEngine`
and trained on :class:`~rllm_torch.trainer.pipeline.token_batch.TokenBatch` tensors with the loss
``rllm.algorithm.loss_fn`` aggregated by ``loss_agg_mode``, AdamW and gradient clipping.

The backend holds its parts, each built with explicit inputs: the policy
(:class:`~rllm_torch.backends.torch_backend.actor.Actor`), the critic, the sampler, the
micro-batching (:class:`~rllm_torch.backends.torch_backend.passes.MicroBatcher`), the passes
before an update (old, reference and value log-probs, KL in the reward, rollout correction:
:class:`~rllm_torch.backends.torch_backend.passes.BatchPasses`) and the update
(:class:`~rllm_torch.backends.torch_backend.update.PolicyUpdater`); this module builds them and
runs the sampling phase and the checkpoints. Its prompt checks are
:func:`~rllm_torch.backends.torch_backend.setup_checks.check_prompts`.

Where each concern is told in full: memory (chunked log-probs, micro-batches, bf16, activation
checkpointing, LoRA) in :mod:`.logprobs`, :mod:`.micro_batches` and :mod:`.actor`; the ranks
(each samples its share of every step's prompts and trains a ``DistributedDataParallel`` or FSDP2
copy on the global loss) in :mod:`.update`; the reference policy and the KL terms, the critic,
and rollout correction in :mod:`.passes`, :mod:`.critic` and
:mod:`~rllm_torch.core.losses.rollout_correction`; the sampling engines in :mod:`.samplers`;
the export in :mod:`.export`.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from rllm_torch.backends.torch_backend.actor import Actor
from rllm_torch.backends.torch_backend.critic import critic_for
from rllm_torch.backends.torch_backend.data import TaskDataLoader
from rllm_torch.backends.torch_backend.export import export_complete, export_pretrained
from rllm_torch.backends.torch_backend.forward import causal_lm
from rllm_torch.backends.torch_backend.logprobs import default_chunk_tokens
from rllm_torch.backends.torch_backend.micro_batches import map_host_tensors
from rllm_torch.backends.torch_backend.model import resolve_device
from rllm_torch.backends.torch_backend.passes import BatchPasses, MicroBatcher
from rllm_torch.backends.torch_backend.precision import probe_shapes
from rllm_torch.backends.torch_backend.pretrained import pretrained_dir
from rllm_torch.backends.torch_backend.rollout import TorchRolloutEngine
from rllm_torch.backends.torch_backend.samplers import Samplers
from rllm_torch.backends.torch_backend.sampling import default_rollout_batch_size
from rllm_torch.backends.torch_backend.setup_checks import check_prompts
from rllm_torch.backends.torch_backend.task_defaults import (
    LengthLimitWatch,
    check_alphabet,
    choose_alphabet,
    response_length,
)
from rllm_torch.backends.torch_backend.tokenizer import has_saved_tokenizer, load_tokenizer, require_chat_template
from rllm_torch.backends.torch_backend.update import PolicyUpdater
from rllm_torch.backends.torch_backend.vllm_rollout import VllmRolloutEngine
from rllm_torch.rllm.config import AlgorithmConfig
from rllm_torch.trainer.config_checks import typed_algorithm_config
from rllm_torch.trainer.model_defaults import apply_model_defaults, default_sources
from rllm_torch.trainer.pipeline.token_batch import build_token_batch
from rllm_torch.trainer.protocol import BackendProtocol
from rllm_torch.trainer.ranks import RunRanks
from rllm_torch.trainer.schema import prompts_per_step
from rllm_torch.trainer.state import TrainerState

__all__ = ["TorchBackend"]


class TorchBackend(BackendProtocol):
    """The pure-PyTorch backend (``backend.name=torch``).

    Args:
        config: the run config: ``model.*``, ``backend.*``, ``data.*``, ``rllm.*``. A null
            ``rllm.rollout.max_new_tokens`` is set here, in ``config`` too (the run's checkpoints
            record the length it trains with): ``max_new_tokens``, else from ``tasks``' answers
            (:func:`~rllm_torch.backends.torch_backend.task_defaults.response_length`).
        alphabet: characters of the default character tokenizer (used when ``model.path`` has
            none); None: every character of ``tasks`` (:mod:`.task_defaults`).
        answer_in_response: the task's reward scores the whole answer in the response, so
            :meth:`validate_prompts` also checks that ``max_new_tokens`` holds the longest answer.
        ranks: the run's processes (default: one); with several, the policy is wrapped by
            ``backend.parallelism`` (``ddp``: ``DistributedDataParallel``).
        max_new_tokens: the task's own response length, for a null ``rllm.rollout.max_new_tokens``.
        tasks: the training and validation task dicts (``UnifiedTrainer`` passes them), whose
            text sets the alphabet and the response length when they are not given.
        algorithm_config: the run's checked losses (``UnifiedTrainer`` passes its own); None: typed
            from ``config`` (:func:`~rllm_torch.trainer.config_checks.typed_algorithm_config`).

    Raises:
        ConfigError / ModelNotFoundError: bad model, device, dtype, memory, loss or parallelism settings.
    """

    name = "torch"

    def __init__(
        self,
        config: DictConfig,
        alphabet: str | None = None,
        ranks: RunRanks | None = None,
        *,
        answer_in_response: bool = False,
        max_new_tokens: int | None = None,
        tasks: Sequence[dict] | None = None,
        algorithm_config: AlgorithmConfig | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(config, ranks)
        if algorithm_config is None:  # built on its own, outside a run: typed from the config
            algorithm_config = typed_algorithm_config(self.config)
        # typed, every setting of the schema; the backend's own copy, whose null settings take the
        # defaults of what is loaded (the run's config, its fingerprint and resume keep what was given)
        run_config, rows = self.config, [t for t in tasks or () if isinstance(t, dict)]
        self.config = config = copy.deepcopy(self.config)
        self.setting_sources = default_sources(config)  # what the run directory's config.yaml records
        self.model_defaults = apply_model_defaults(
            config, processes_per_machine=int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if self.ranks.distributed else 1
        )
        self.answer_in_response = answer_in_response
        self.settings, rllm = config.backend, config.rllm
        self.device = resolve_device(
            self.settings.device, local_rank=self.ranks.local_rank if self.ranks.distributed else None
        )
        if self.device.type == "cpu":  # the host heap keeps no freed activation pages (micro_batches.py)
            map_host_tensors()
        model_dir = (
            pretrained_dir(config.model.path, cache_dir=config.model.gguf_cache_dir) if config.model.path else None
        )
        self.alphabet, self.alphabet_source = choose_alphabet(alphabet, rows)
        self.tokenizer = load_tokenizer(model_dir, self.alphabet, pad_token=config.model.pad_token)
        self.tokenizer_from_path = has_saved_tokenizer(model_dir)
        self.response_length = response_length(
            self.tokenizer,
            rows,
            given=rllm.rollout.max_new_tokens,
            task_length=max_new_tokens,
            task_name=config.task.name,
        )  # set in the run's config too: its fingerprint records the length the run trains with
        if rllm.rollout.max_new_tokens is None:
            self.setting_sources["rllm.rollout.max_new_tokens"] = f"null: {self.response_length.source}"
        rllm.rollout.max_new_tokens = run_config.rllm.rollout.max_new_tokens = self.response_length.tokens
        self.length_watch = LengthLimitWatch(self.response_length.tokens, self.response_length.longest_answer)
        self.apply_chat_template = bool(config.task.apply_chat_template)
        losses = algorithm_config.losses_in_use().values()
        shapes = probe_shapes(config, len(self.tokenizer), self.response_length.tokens)
        self.actor = Actor(config, self.tokenizer, self.device, self.ranks, losses, probe_shapes=shapes)
        self.model, self.precision, self.compute_dtype = (
            self.actor.model,
            self.actor.precision,
            self.actor.compute_dtype,
        )
        self.critic = critic_for(self.actor, config, self.ranks, self.device, self.tokenizer.pad_token_id)
        micro = MicroBatcher(
            self.settings,
            self.ranks,
            lora_r=config.model.lora.r,
            compute_dtype=self.compute_dtype,
            share_prompts=self.actor.share_prompts,
        )
        self.passes = BatchPasses(self.actor, self.critic, micro, rllm.algorithm, self.device)
        self.updater = PolicyUpdater(self.actor, self.critic, micro, config, self.device, algorithm_config)
        self.run_dir = Path(
            rllm.trainer.default_local_dir or f"outputs/{rllm.trainer.project_name}/{rllm.trainer.experiment_name}"
        )
        self.samplers = Samplers(
            self.actor,
            self.tokenizer,
            config,
            self.ranks,
            compute_dtype=self.precision.sampling,
            apply_chat_template=self.apply_chat_template,
        )

    @property
    def rollout_batch_size(self) -> int:
        """Prompts per sampling call: ``backend.rollout_batch_size``, or as many as 256 MiB of one
        step's logits hold, at most 1024
        (:func:`~rllm_torch.backends.torch_backend.sampling.default_rollout_batch_size`)."""
        vocab = causal_lm(self.model).get_output_embeddings().weight.shape[0]
        return self.settings.rollout_batch_size or default_rollout_batch_size(vocab)

    @property
    def ref_model(self) -> torch.nn.Module | None:
        """The frozen reference policy's own copy (None without a KL term, or with LoRA, whose
        reference is the model with its adapters disabled)."""
        return self.actor.ref_model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.actor.optimizer

    def validate_config(self) -> None:
        """What the run config's check could not see before the model was loaded: a chat template
        the tokenizer does not have (the settings were checked by
        :func:`~rllm_torch.trainer.config_checks.check_run_config`).

        Raises:
            ConfigError: ``task.apply_chat_template=true`` with a tokenizer without one.
        """
        if self.apply_chat_template:
            require_chat_template(self.tokenizer)

    def validate_prompts(self, tasks: list[dict]) -> None:
        """:func:`~rllm_torch.backends.torch_backend.setup_checks.check_prompts` with this policy,
        and for the character tokenizer :func:`~.task_defaults.check_alphabet`."""
        if not self.tokenizer_from_path:
            check_alphabet(tasks, self.tokenizer, given=self.alphabet_source.startswith("the alphabet given"))
        check_prompts(
            tasks,
            self.config,
            self.tokenizer,
            self.model,
            tokenizer_from_path=self.tokenizer_from_path,
            apply_chat_template=self.apply_chat_template,
            answer_in_response=self.answer_in_response,
        )

    async def process_backend_batch(self, trainer_state: TrainerState) -> None:
        """The no-gradient passes (:meth:`BatchPasses.run <rllm_torch.backends.torch_backend.passes.BatchPasses.run>`)."""
        await self.passes.run(trainer_state)

    async def update_policy(self, trainer_state: TrainerState) -> None:
        """The update (:meth:`PolicyUpdater.update <rllm_torch.backends.torch_backend.update.PolicyUpdater.update>`)."""
        await self.updater.update(trainer_state)

    def summary_rows(self) -> list[tuple[str, str]]:
        """The start-up summary's ``defaults`` row (the settings left null and what they took,
        :func:`~rllm_torch.trainer.model_defaults.apply_model_defaults`; absent when every one was
        given) and its ``memory`` row: compute dtype, micro-batch budget, head chunk,
        activation checkpointing and LoRA."""
        s, lora = self.settings, self.config.model.lora
        vocab = causal_lm(self.model).get_output_embeddings().weight.shape[0]
        chunk = s.log_prob_chunk_tokens or default_chunk_tokens(vocab)
        parts = [
            f"micro-batches of {s.micro_batch_tokens} tokens" if s.micro_batch_tokens else "no micro-batches",
            f"log-probs in chunks of {chunk} tokens",
            f"sampling {self.rollout_batch_size} prompts per generate call",
            f"activation checkpointing {'on' if s.gradient_checkpointing else 'off'}",
            "prompts shared by their rollouts (computed once)"
            if self.actor.share_prompts
            else f"prompts not shared ({self.actor.unshared_reason})"
            if self.actor.unshared_reason
            else "prompts not shared",
        ]
        if self.actor.lora:
            trainable = sum(p.numel() for p in self.actor.parameters)
            targets = ",".join(lora.target_modules)
            parts.append(
                f"LoRA r={lora.r} alpha={lora.alpha} on {targets} ({trainable / 1e6:.2f}M trainable parameters)"
            )
        else:
            parts.append("no LoRA")
        defaults = [("defaults", self.model_defaults)] if self.model_defaults else []
        length = self.response_length
        unset = "" if length.source.startswith("rllm.rollout.") else "; rllm.rollout.max_new_tokens sets another"
        responses = f"at most {length.tokens} tokens ({length.source}{unset})"
        precision = [("precision", self.precision.summary)]
        warning = [("warning", self.precision.warning)] if self.precision.warning else []
        return [*defaults, *precision, *warning, ("memory", ", ".join(parts)), ("responses", responses)]

    @property
    def rollout_engine(self) -> TorchRolloutEngine | VllmRolloutEngine | None:
        """The main sampling engine (None before :meth:`init_rollout_engine`)."""
        return self.samplers.main

    @property
    def async_rollout_engine(self) -> TorchRolloutEngine | VllmRolloutEngine | None:
        """Async training's sampler (None before :meth:`init_async_rollout_engine`)."""
        return self.samplers.async_sampler

    def init_rollout_engine(self, **kwargs: Any) -> TorchRolloutEngine | VllmRolloutEngine:
        """The main engine (:meth:`Samplers.build <.samplers.Samplers.build>`)."""
        return self.samplers.build(self.rollout_batch_size)

    def init_async_rollout_engine(self) -> TorchRolloutEngine | VllmRolloutEngine:
        """Async training's sampler (:meth:`Samplers.build_async <.samplers.Samplers.build_async>`)."""
        return self.samplers.build_async()

    def publish_weights(self, version: int) -> None:
        """The policy's weights staged in the async sampler (:meth:`Samplers.publish <.samplers.Samplers.publish>`)."""
        self.samplers.publish(version)

    def get_dataloader(self, dataset: list[dict], trainer_state: TrainerState) -> TaskDataLoader:
        """Training batches of ``prompts_per_step`` prompts; while the trainer validates
        (``trainer_state.is_training`` False), ``data.val_batch_size`` when set (-1: all at once)."""
        data, size = self.config.data, prompts_per_step(self.config)
        if not trainer_state.is_training and data.val_batch_size is not None:
            size = max(len(dataset or []), 1) if data.val_batch_size == -1 else data.val_batch_size
        return TaskDataLoader(
            dataset or [],
            size,
            shuffle=data.shuffle,
            seed=self.settings.seed,
            rank=self.ranks.rank,
            world_size=self.ranks.world_size,
        )

    async def generate_episodes(
        self, batch: list[tuple[str, dict]], agent_workflow_engine: Any, is_validation: bool = False
    ) -> list:
        n = self.config.rllm.rollout.n_val if is_validation else self.config.rllm.rollout.n
        episodes = await self._run_tasks(batch, agent_workflow_engine, range(n), validation=is_validation)
        if not is_validation and self.ranks.is_main:
            self.length_watch.observe(episodes)  # one warning when the length keeps every reward at 0
        return episodes

    async def generate_baseline_episodes(self, batch: list[tuple[str, dict]], agent_workflow_engine: Any) -> list:
        """One greedy rollout of each task (``remax``'s baselines): training's sampling settings at
        temperature 0, rollout index ``rollout.n`` (after the sampled ones)."""
        return await self._run_tasks(batch, agent_workflow_engine, [self.config.rllm.rollout.n], greedy=True)

    async def _run_tasks(self, batch, engine: Any, indices, *, validation: bool = False, greedy: bool = False) -> list:
        """The workflows of each task of ``batch`` once per rollout index, sampled with the
        settings of ``validation`` / ``greedy`` (left at training's afterwards)."""
        tasks = [(task_id, task, k) for task_id, task in batch for k in indices]
        rollout = engine.rollout_engine  # the main engine, or async training's sampler
        rollout.validation, rollout.greedy = validation, greedy
        try:
            with self._sampling_weights(rollout):
                return await engine.execute_tasks(
                    [t for _, t, _ in tasks], [i for i, _, _ in tasks], [k for *_, k in tasks]
                )
        finally:
            rollout.greedy = False

    def _sampling_weights(self, rollout: Any = None) -> AbstractContextManager:
        """The weights a sampling phase runs on (:meth:`Samplers.weights <.samplers.Samplers.weights>`)."""
        return self.samplers.weights(rollout)

    def transform_to_backend_batch(self, trainer_state: TrainerState):
        return build_token_batch(
            trainer_state.trajectory_groups,
            pad_token_id=self.tokenizer.pad_token_id,
            use_precomputed_advantage=bool(self.config.rllm.algorithm.use_precomputed_advantage),
            stepwise_mode=self.config.rllm.stepwise_advantage.mode,
            length_mismatch="zeros" if self.config.rllm.algorithm.compat == "rllm" else "raise",
            observation_mask="obs_mask" in trainer_state.needs,
        ).to(self.device)

    def state_dict(self) -> dict[str, Any]:
        """Model (LoRA: adapters), optimizer and lr-scheduler state dicts (the same on every
        rank), and the critic's model and optimizer when there is one; with FSDP the scheduler
        only (the model and optimizer shards are :meth:`sharded_state_dict`)."""
        state = self.actor.state_dict() | {"scheduler": self.updater.scheduler_state()}
        if self.critic is not None:
            state |= self.critic.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s dict; the lr scheduler, built at the first update, gets its state then."""
        self.actor.load_state_dict(state)
        if self.critic is not None:
            self.critic.load_state_dict(state)
            for group in self.critic.optimizer.param_groups:  # resumable: the current backend.critic.lr
                group["lr"] = self.settings.critic.lr
        self.updater.load_scheduler_state(state["scheduler"])

    def sharded_state_dict(self) -> dict[str, Any] | None:
        """FSDP: this rank's model and optimizer shards, for ``torch.distributed.checkpoint``."""
        return self.actor.sharded_state_dict() if self.actor.sharded else None

    def load_sharded_state_dict(self, state: dict[str, Any]) -> None:
        self.actor.load_sharded_state_dict(state)

    def rank_state_dict(self) -> dict[str, Any]:
        """This rank's sampling generator (the training episodes')."""
        return {"rollout_generator": self.samplers.training.generator.get_state()}

    def load_rank_state_dict(self, state: dict[str, Any]) -> None:
        self.samplers.training.generator.set_state(state["rollout_generator"])

    def shutdown(self) -> None:
        """Release the vLLM engines (:meth:`Samplers.shutdown <.samplers.Samplers.shutdown>`)."""
        self.samplers.shutdown()

    def save_checkpoint(self, name: str) -> Path | None:
        """Save the model (LoRA: adapters merged) and tokenizer to ``{run_dir}/checkpoints/{name}``
        (:func:`~rllm_torch.backends.torch_backend.export.export_pretrained`; rank 0 writes and
        returns the path; with FSDP every rank must call, to gather the weights).

        Raises:
            CheckpointError: writing failed; the run's checkpoints are intact.
        """
        return export_pretrained(self.actor, self.tokenizer, self.run_dir / "checkpoints" / name, self.ranks.is_main)

    async def on_train_end(self, trainer_state: TrainerState) -> None:
        """Export the trained model as ``checkpoints/final`` (``model.path=`` loads it; rank 0
        writes it); the trainer's resumable checkpoints are ``checkpoints/step_*``."""
        self.save_checkpoint("final")

    def train_end_complete(self) -> bool:
        """``checkpoints/final`` holds every file of the export, each of the size and SHA-256 that
        ``checkpoints/final.sha256.json`` records (written after the export was renamed into place);
        other ranks: True."""
        return not self.ranks.is_main or export_complete(self.run_dir / "checkpoints" / "final")
