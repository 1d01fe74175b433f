"""``TorchBackend``: the embedded backend. A ``transformers`` causal LM is sampled by
:class:`TorchRolloutEngine` and trained on :class:`~rllm_torch.trainer.token_batch.TokenBatch`
tensors with the loss ``rllm.algorithm.loss_fn`` aggregated by ``loss_agg_mode``, AdamW and
gradient clipping."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from transformers import get_scheduler

from rllm_torch.backends.torch_backend.data import TaskDataLoader
from rllm_torch.backends.torch_backend.losses import AGG_MODES, LOSS_FNS, policy_loss
from rllm_torch.backends.torch_backend.policy import build_policy, resolve_device
from rllm_torch.backends.torch_backend.rollout import SamplingParams, TorchRolloutEngine
from rllm_torch.backends.torch_backend.sampling import token_log_probs
from rllm_torch.backends.torch_backend.tokenizer import load_tokenizer
from rllm_torch.errors import ConfigError
from rllm_torch.trainer.backend import BackendProtocol
from rllm_torch.trainer.state import TrainerState
from rllm_torch.trainer.token_batch import build_token_batch

__all__ = ["TorchBackend"]

_SCHEDULES = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}


class TorchBackend(BackendProtocol):
    """The pure-PyTorch backend (``backend.name=torch``).

    Args:
        config: the run config: ``model.*``, ``backend.*``, ``data.*``, ``rllm.*``.
        alphabet: characters of the default character tokenizer (used when ``model.path`` has none).

    Raises:
        ConfigError / ModelNotFoundError: bad model, device or loss settings.
    """

    name = "torch"

    def __init__(self, config: DictConfig, alphabet: str = "0123456789+=", **kwargs: Any) -> None:
        super().__init__(config)
        self.settings, rllm = config.backend, config.rllm
        if self.settings.num_threads:
            torch.set_num_threads(self.settings.num_threads)
        self.device = resolve_device(self.settings.device)
        self.tokenizer = load_tokenizer(config.model.path, alphabet)
        self.model = build_policy(config.model, self.tokenizer, seed=self.settings.seed).to(self.device)
        self.loss_fn = rllm.algorithm.loss_fn or "ppo"
        self.loss_agg_mode = rllm.algorithm.get("loss_agg_mode", "token-mean")
        self.loss_agg_horizon = rllm.algorithm.get("loss_agg_horizon") or rllm.rollout.max_new_tokens
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=self.settings.lr, weight_decay=self.settings.weight_decay
        )
        self.scheduler, self._pending_scheduler_state = None, None
        self.run_dir = Path(
            rllm.trainer.default_local_dir or f"outputs/{rllm.trainer.project_name}/{rllm.trainer.experiment_name}"
        )

    def validate_config(self) -> None:
        if self.loss_fn not in LOSS_FNS:
            raise ConfigError(f"rllm.algorithm.loss_fn={self.loss_fn!r}: the torch backend implements {LOSS_FNS}.")
        if self.loss_agg_mode not in AGG_MODES:
            raise ConfigError(f"rllm.algorithm.loss_agg_mode={self.loss_agg_mode!r} is not one of {AGG_MODES}.")
        if self.loss_agg_horizon < 1 or self.settings.get("dro_beta", 0.05) < 0:
            raise ConfigError(
                f"rllm.algorithm.loss_agg_horizon must be >= 1 and backend.dro_beta >= 0, got {self.loss_agg_horizon} and {self.settings.get('dro_beta')}."
            )
        rollout = self.config.rllm.rollout
        if rollout.n < 1 or rollout.n_val < 1 or rollout.max_new_tokens < 1:
            raise ConfigError(
                f"rllm.rollout.n, n_val and max_new_tokens must be >= 1, got {rollout.n}, {rollout.n_val}, {rollout.max_new_tokens}."
            )

    def init_rollout_engine(self, **kwargs: Any) -> TorchRolloutEngine:
        r = self.config.rllm.rollout
        train = SamplingParams(r.temperature, r.top_p, r.max_new_tokens)
        val = SamplingParams(r.val_temperature, r.val_top_p, r.max_new_tokens)
        self.rollout_engine = TorchRolloutEngine(
            self.model,
            self.tokenizer,
            train,
            val,
            max_batch_size=self.settings.rollout_batch_size,
            seed=self.settings.seed,
        )
        return self.rollout_engine

    def get_dataloader(self, dataset: list[dict], trainer_state: TrainerState) -> TaskDataLoader:
        data = self.config.data
        return TaskDataLoader(dataset or [], data.train_batch_size, shuffle=data.shuffle, seed=self.settings.seed)

    async def generate_episodes(
        self, batch: list[tuple[str, dict]], agent_workflow_engine: Any, is_validation: bool = False
    ) -> list:
        n = self.config.rllm.rollout.n_val if is_validation else self.config.rllm.rollout.n
        self.rollout_engine.validation = is_validation
        tasks = [(task_id, task, k) for task_id, task in batch for k in range(n)]
        return await agent_workflow_engine.execute_tasks(
            [t for _, t, _ in tasks], [i for i, _, _ in tasks], [k for _, _, k in tasks]
        )

    def transform_to_backend_batch(self, trainer_state: TrainerState):
        use_pre = bool(self.config.rllm.algorithm.use_precomputed_advantage)
        return build_token_batch(
            trainer_state.trajectory_groups, pad_token_id=self.tokenizer.pad_token_id, use_precomputed_advantage=use_pre
        ).to(self.device)

    def _log_probs(self, batch, rows: slice | torch.Tensor = slice(None)) -> torch.Tensor:
        return token_log_probs(
            self.model,
            batch.input_ids[rows],
            batch.attention_mask[rows],
            temperature=self.config.rllm.rollout.temperature,
        )

    async def process_backend_batch(self, trainer_state: TrainerState) -> None:
        batch = trainer_state.backend_batch
        with torch.no_grad():
            batch.old_log_probs = self._log_probs(batch)
        diff = (
            (batch.old_log_probs - batch.rollout_log_probs).abs() * batch.response_mask
        ).sum() / batch.response_mask.sum().clamp(min=1)
        trainer_state.metrics["actor/rollout_logprob_abs_diff"] = diff.item()

    def _ensure_scheduler(self, trainer_state: TrainerState, updates_per_step: int) -> None:
        if self.scheduler is None:
            total = max(trainer_state.total_steps, 1) * updates_per_step
            warmup = int(self.config.rllm.algorithm.warmup_steps_ratio * total)
            self.scheduler = get_scheduler(
                _SCHEDULES[self.config.rllm.algorithm.lr_schedule],
                self.optimizer,
                num_warmup_steps=warmup,
                num_training_steps=total,
            )
            if self._pending_scheduler_state is not None:
                self.scheduler.load_state_dict(self._pending_scheduler_state)
                self._pending_scheduler_state = None
                for group, lr in zip(self.optimizer.param_groups, self.scheduler.get_last_lr(), strict=True):
                    group["lr"] = lr  # building the scheduler reset it to the step-0 value

    async def update_policy(self, trainer_state: TrainerState) -> None:
        """``backend.ppo_epochs`` passes over the batch in shuffled mini-batches of
        ``backend.mini_batch_size`` rows (one row per step; None: the whole batch), one AdamW step each."""
        batch, s = trainer_state.backend_batch, self.settings
        num_rows = batch.input_ids.shape[0]
        mini = min(s.mini_batch_size or num_rows, num_rows)
        self._ensure_scheduler(trainer_state, s.ppo_epochs * -(-num_rows // mini))
        stats: dict[str, list[float]] = {}
        for _ in range(s.ppo_epochs):
            order = torch.randperm(num_rows, device=self.device)
            for start in range(0, num_rows, mini):
                rows = order[start : start + mini]
                loss, extra = policy_loss(
                    self.loss_fn,
                    self._log_probs(batch, rows),
                    batch.old_log_probs[rows],
                    batch.advantages[rows],
                    batch.response_mask[rows],
                    clip_ratio_low=s.clip_ratio_low,
                    clip_ratio_high=s.clip_ratio_high,
                    beta=s.get("dro_beta", 0.05),
                    loss_agg_mode=self.loss_agg_mode,
                    horizon=self.loss_agg_horizon,
                )
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), s.grad_clip)
                self.optimizer.step()
                self.scheduler.step()
                for key, value in {"loss": loss.detach(), "grad_norm": grad_norm, **extra}.items():
                    stats.setdefault(key, []).append(float(value))
        trainer_state.metrics |= {f"actor/{k}": sum(v) / len(v) for k, v in stats.items()}
        trainer_state.metrics["actor/lr"] = self.scheduler.get_last_lr()[0]

    def state_dict(self) -> dict[str, Any]:
        """Model, optimizer and lr-scheduler state dicts and the sampling generator's state."""
        scheduler = self.scheduler.state_dict() if self.scheduler is not None else self._pending_scheduler_state
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": scheduler,
            "rollout_generator": self.rollout_engine.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s dict; the lr scheduler, built at the first update, gets its state then."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler, self._pending_scheduler_state = None, state["scheduler"]
        self.rollout_engine.generator.set_state(state["rollout_generator"])

    def save_checkpoint(self, name: str) -> Path:
        """Save the model and tokenizer to ``{run_dir}/checkpoints/{name}`` (``save_pretrained``)."""
        path = self.run_dir / "checkpoints" / name
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        return path

    async def on_train_end(self, trainer_state: TrainerState) -> None:
        """Export the trained model as ``checkpoints/final`` (``model.path=`` loads it); the
        trainer's resumable checkpoints are ``checkpoints/step_*``."""
        self.save_checkpoint("final")
