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
:mod:`~rllm_torch.core.losses.rollout_correction`; the vLLM engine in :mod:`.vllm_rollout`.

**Length.** Longer than a module here should be (about 470 lines) because it implements the
whole ``BackendProtocol`` (start-up, the sampling phases, the passes, the checkpoints and the
export) as one class whose methods each hand over to a part; each part is its own module.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from rllm_torch.backends.torch_backend.actor import Actor, wrap_ddp
from rllm_torch.backends.torch_backend.critic import Critic
from rllm_torch.backends.torch_backend.data import TaskDataLoader
from rllm_torch.backends.torch_backend.forward import causal_lm
from rllm_torch.backends.torch_backend.logprobs import default_chunk_tokens
from rllm_torch.backends.torch_backend.micro_batches import map_host_tensors
from rllm_torch.backends.torch_backend.model import compute_dtype_summary, resolve_compute_dtype, resolve_device
from rllm_torch.backends.torch_backend.passes import BatchPasses, MicroBatcher
from rllm_torch.backends.torch_backend.pretrained import pretrained_dir
from rllm_torch.backends.torch_backend.rollout import SamplingParams, TorchRolloutEngine
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
from rllm_torch.backends.torch_backend.vllm_setup import full_weights
from rllm_torch.core.errors import CheckpointError
from rllm_torch.rllm.config import AlgorithmConfig
from rllm_torch.trainer.config_checks import typed_algorithm_config
from rllm_torch.trainer.model_defaults import apply_model_defaults
from rllm_torch.trainer.pipeline.token_batch import build_token_batch
from rllm_torch.trainer.protocol import BackendProtocol
from rllm_torch.trainer.ranks import RunRanks
from rllm_torch.trainer.runtime.checkpoint import directory_digests, directory_matches, replace_directory
from rllm_torch.trainer.runtime.stop import StopRequested, stop_point
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
        self.model_defaults = apply_model_defaults(
            config, processes_per_machine=int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if self.ranks.distributed else 1
        )
        self.answer_in_response = answer_in_response
        self.settings, rllm = config.backend, config.rllm
        self.device = resolve_device(
            self.settings.device, local_rank=self.ranks.local_rank if self.ranks.distributed else None
        )
        pretrained = config.model.path is not None
        if self.device.type == "cpu":  # the host heap keeps no freed activation pages (micro_batches.py)
            map_host_tensors()
        self.compute_dtype = resolve_compute_dtype(self.settings.dtype, self.device, pretrained=pretrained)
        self.dtype_summary = compute_dtype_summary(self.settings.dtype, self.device, pretrained=pretrained)
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
        rllm.rollout.max_new_tokens = run_config.rllm.rollout.max_new_tokens = self.response_length.tokens
        self.length_watch = LengthLimitWatch(self.response_length.tokens, self.response_length.longest_answer)
        self.apply_chat_template = bool(config.task.apply_chat_template)
        losses = algorithm_config.losses_in_use().values()
        self.actor = Actor(config, self.tokenizer, self.device, self.ranks, self.compute_dtype, losses)
        self.model = self.actor.model
        self.rollout_engine = self.async_rollout_engine = None  # init_rollout_engine, init_async_rollout_engine
        self.critic = (
            Critic(
                config.model,
                self.actor.base,
                self.settings.critic,
                seed=self.settings.seed + 1,
                # fsdp: refused by the run config's check
                wrap=(lambda module: module)
                if self.actor.sharded
                else (lambda m: wrap_ddp(m, self.ranks, self.device)),
                pad_token_id=self.tokenizer.pad_token_id,
                autocast_dtype=self.compute_dtype,
                gradient_checkpointing=self.settings.gradient_checkpointing,
            )
            if self.settings.critic.enable
            else None
        )
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
            self.dtype_summary,
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
        return [*defaults, ("memory", ", ".join(parts)), ("responses", responses)]

    def init_rollout_engine(self, **kwargs: Any) -> TorchRolloutEngine:
        r = self.config.rllm.rollout
        train = SamplingParams(r.temperature, r.top_p, r.max_new_tokens)
        val = SamplingParams(r.val_temperature, r.val_top_p, r.max_new_tokens)
        common = dict(
            max_batch_size=self.rollout_batch_size,
            seed=self.settings.seed + self.ranks.rank,  # each rank its own rollouts
            apply_chat_template=self.apply_chat_template,
        )
        engine = self.settings.rollout
        if engine.engine == "vllm":  # issue 18: a colocated vLLM engine, synced after optimizer steps
            self.rollout_engine = VllmRolloutEngine(
                self.model,
                self.tokenizer,
                train,
                val,
                max_model_len=engine.max_model_len,
                gpu_memory_utilization=engine.gpu_memory_utilization,
                kv_cache_memory_bytes=engine.kv_cache_memory_bytes,
                enforce_eager=engine.enforce_eager,
                dtype=engine.dtype or ("bfloat16" if self.compute_dtype == torch.bfloat16 else None),
                distributed=self.ranks.distributed,
                **common,
            )
            vllm_engine = self.rollout_engine  # the engine, also when async training makes it the sampler
            self.optimizer.register_step_post_hook(lambda *_: vllm_engine.mark_stale())
        else:
            self.rollout_engine = TorchRolloutEngine(
                self.model,
                self.tokenizer,
                train,
                val,
                autocast_dtype=self.compute_dtype,
                share_prompts=self.actor.share_prompts,
                **common,
            )
        return self.rollout_engine

    def init_async_rollout_engine(self) -> TorchRolloutEngine | VllmRolloutEngine:
        """Async training's sampler, at policy version 0 until :meth:`publish_weights`, sampling
        with training's settings and the rank's one sampling generator (the checkpoint's).

        ``hf``: an engine over its own copy of the policy (the policy's weights' memory once more).
        ``vllm``: the vLLM engine itself, which holds its own weights already (it then takes only
        the published ones); validation, which samples the current policy, gets an ``hf`` engine
        over the policy in its place."""
        main = self.rollout_engine
        on_vllm = isinstance(main, VllmRolloutEngine)
        # hf: as it is, requires_grad too (sampling runs under no_grad, and a frozen copy takes
        # other kernels: its log-probs then differ from the policy's in the last bits)
        hf = TorchRolloutEngine(
            self.model if on_vllm else copy.deepcopy(self.model),
            self.tokenizer,
            main.train_params,
            main.val_params,
            max_batch_size=main.max_batch_size,
            seed=self.settings.seed + self.ranks.rank,
            apply_chat_template=self.apply_chat_template,
            autocast_dtype=self.compute_dtype,
            share_prompts=self.actor.share_prompts,
        )
        if on_vllm:  # vLLM samples the training episodes, hf over the policy validates
            main.published_weights_only = True
            self.rollout_engine, engine = hf, main
        else:  # the copy samples with the run's one generator (the checkpoint's)
            hf.generator, engine = main.generator, hf
        engine.version = 0
        engine.sync_in_flight = bool(self.config.rllm.async_training.partial_rollout)
        self.async_rollout_engine = engine
        return engine

    def publish_weights(self, version: int) -> None:
        """Stage the policy's weights as ``version`` in the async sampler, which takes them between
        batches (or, with ``partial_rollout``, at its next sampling call): copies of the trainable
        parameters for the ``hf`` sampler (with LoRA only the adapters: the frozen base is its
        already); for vLLM every weight by the base model's names, LoRA merged
        (:func:`~rllm_torch.backends.torch_backend.vllm_setup.full_weights`)."""
        if isinstance(self.async_rollout_engine, VllmRolloutEngine):
            weights = {name: tensor.clone() for name, tensor in full_weights(self.model)}
        else:
            weights = {name: p.detach().clone() for name, p in self.model.named_parameters() if p.requires_grad}
        self.async_rollout_engine.stage_weights(weights, version)

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
        """The weights a sampling phase runs on. The vLLM engine holds its own copy: it is synced
        here if an optimizer step changed the policy (under FSDP one parameter at a time, every
        rank together); async training's sampler takes its staged weights. The main ``hf`` engine
        runs on the policy itself: under FSDP, gathered whole for the phase (:meth:`Actor.sampling_weights`).
        ``rollout``: the engine of the phase (None: the main one)."""
        rollout = rollout if rollout is not None else self.rollout_engine
        rollout.sync_weights()  # a no-op for the main hf engine
        own_weights = isinstance(rollout, VllmRolloutEngine) or rollout is not self.rollout_engine
        return nullcontext() if own_weights else self.actor.sampling_weights()

    def transform_to_backend_batch(self, trainer_state: TrainerState):
        return build_token_batch(
            trainer_state.trajectory_groups,
            pad_token_id=self.tokenizer.pad_token_id,
            use_precomputed_advantage=bool(self.config.rllm.algorithm.use_precomputed_advantage),
            stepwise_mode=self.config.rllm.stepwise_advantage.mode,
            length_mismatch="zeros" if self.config.rllm.algorithm.compat == "rllm" else "raise",
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

    def _training_sampler(self) -> TorchRolloutEngine | VllmRolloutEngine:
        """The engine that samples the training episodes (async training with vLLM: its sampler)."""
        return (
            self.async_rollout_engine
            if isinstance(self.async_rollout_engine, VllmRolloutEngine)
            else self.rollout_engine
        )

    def rank_state_dict(self) -> dict[str, Any]:
        """This rank's sampling generator (the training episodes')."""
        return {"rollout_generator": self._training_sampler().generator.get_state()}

    def load_rank_state_dict(self, state: dict[str, Any]) -> None:
        self._training_sampler().generator.set_state(state["rollout_generator"])

    def shutdown(self) -> None:
        """Release the vLLM engine (the sampler's, in async training) at the end of the run, not
        whenever the garbage collector gets to it: vLLM's process-wide parallel state goes with it,
        which a later engine in the same process (a second run) would otherwise lose mid-run."""
        for engine in {id(e): e for e in (self.rollout_engine, self.async_rollout_engine)}.values():
            if isinstance(engine, VllmRolloutEngine) and engine.llm is not None:
                engine.shutdown()

    def save_checkpoint(self, name: str) -> Path | None:
        """Save the model (LoRA: adapters merged) and tokenizer to ``{run_dir}/checkpoints/{name}``
        (``save_pretrained``; rank 0 writes and returns the path; with FSDP every rank must call,
        to gather the weights). Written into ``.tmp-{name}-<pid>`` and renamed into place, replacing
        an older one: a process stopped at any moment leaves the whole directory or none. A stop
        request (SIGTERM) between its files abandons it (:func:`~rllm_torch.trainer.runtime.stop.stop_point`).

        Raises:
            CheckpointError: writing failed (a full disk, or a model ``save_pretrained`` refuses);
                the temporary directory is removed, the run's checkpoints are intact.
        """
        path = self.run_dir / "checkpoints" / name
        tmp = path.with_name(f".tmp-{name}-{os.getpid()}")
        try:
            if self.ranks.is_main:
                shutil.rmtree(tmp, ignore_errors=True)
            stop_point()
            if not self.actor.save_pretrained(tmp):
                return None
            stop_point()
            self.tokenizer.save_pretrained(tmp)
            digests = directory_digests(tmp)
            stop_point()
            replace_directory(tmp, path)
            path.with_name(f"{name}.sha256.json").write_text(json.dumps(digests))  # after: a kill leaves none
        except StopRequested:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        except Exception as exc:  # noqa: BLE001 - any failure: the export is missing, the checkpoints are not
            shutil.rmtree(tmp, ignore_errors=True)
            detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
            raise CheckpointError(
                f"exporting the model to {path} failed ({detail.splitlines()[0] if detail else type(exc).__name__}); "
                "the run's checkpoints are intact and the same command writes it again. Free disk space (or fix "
                "the path) first."
            ) from exc
        return path

    async def on_train_end(self, trainer_state: TrainerState) -> None:
        """Export the trained model as ``checkpoints/final`` (``model.path=`` loads it; rank 0
        writes it); the trainer's resumable checkpoints are ``checkpoints/step_*``."""
        self.save_checkpoint("final")

    def train_end_complete(self) -> bool:
        """``checkpoints/final`` holds every file of the export, each of the size and SHA-256 that
        ``checkpoints/final.sha256.json`` records (written after the export was renamed into place);
        other ranks: True."""
        final = self.run_dir / "checkpoints" / "final"
        return not self.ranks.is_main or directory_matches(final, final.with_name("final.sha256.json"))
