"""The policy update (:class:`PolicyUpdater`, a part the
:class:`~rllm_torch.backends.torch_backend.backend.TorchBackend` holds): ``backend.ppo_epochs``
passes of shuffled mini-batches, each one AdamW step whose gradient accumulates over micro-batches.

Every loss is divided by the token (or sequence) count of the *global* mini-batch and, on
several processes, multiplied by the world size, so DDP's gradient average is the gradient of
the global loss and the weights stay identical on every rank. Ranks agree on the number of
micro-batches of each mini-batch (a rank with fewer runs zero-loss forwards), and gradients
cross the ranks once per optimizer step. With a critic, its value loss and AdamW step run beside
the policy's, one per mini-batch; ``use_kl_loss`` adds the KL to the reference to the loss.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any, NamedTuple

import torch
from omegaconf import DictConfig
from torch import Tensor
from transformers import get_scheduler

from rllm_torch.backends.torch_backend.actor import Actor
from rllm_torch.backends.torch_backend.critic import Critic
from rllm_torch.backends.torch_backend.loss_settings import loss_params
from rllm_torch.backends.torch_backend.micro_batches import gradient_sync, stage_memory
from rllm_torch.backends.torch_backend.passes import MicroBatcher, rollout_weights, summarise_weights_over_ranks
from rllm_torch.core.losses import (
    Aggregation,
    LossContext,
    bias_corrected_kl,
    entropy_bonus,
    high_entropy_mask,
    kl_penalty,
    loss_normaliser,
    off_policy_sequence_mask,
)
from rllm_torch.rllm.config import AlgorithmConfig
from rllm_torch.rllm.plan import AdvantagePlan, RoleLoss
from rllm_torch.trainer.runtime.stop import StopRequested, no_stop_points, stop_point
from rllm_torch.trainer.state import TrainerState

__all__ = ["PolicyUpdater"]

_SCHEDULES = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}
# update stats that are each rank's share of a global loss (summed over the ranks); the others
# are token sums (divided by the global token count)
_SHARE_STATS = ("loss", "kl_loss", "critic/vf_loss")


class _Forward(NamedTuple):
    """One micro-batch's forward: the policy's log-probs (with gradient) and entropy, the old
    policy's log-probs, and the zero anchor of a rank without rows."""

    log_probs: Tensor
    entropy: Tensor | None
    old_log_probs: Tensor
    anchor: Tensor | float


class PolicyUpdater:
    """The backend's ``update_policy``, and the learning-rate schedule it steps.

    Args:
        actor: the policy, its optimizer and (with a KL loss) its reference.
        critic: the value model trained beside it, or None.
        micro: the micro-batching shared with the passes.
        config: the run config (``backend.*`` for the clip, DRO and entropy settings and the
            learning rate; ``rllm.algorithm.*`` for the loss, its aggregation, the KL loss and the
            schedule; ``rllm.rollout.max_new_tokens`` for the default aggregation horizon).
        device: where the batch lives.
    """

    def __init__(
        self,
        actor: Actor,
        critic: Critic | None,
        micro: MicroBatcher,
        config: DictConfig,
        device,
        algorithm_config: AlgorithmConfig,
    ) -> None:
        self.actor, self.critic, self.micro, self.device, self.config = actor, critic, micro, device, config
        self.settings, self.algorithm, self.ranks = config.backend, config.rllm.algorithm, micro.ranks
        # the run's loss and each role's (rllm.algorithm.loss_fn_map, or estimator_map's pairs)
        self.algorithm_config = algorithm_config
        self.plan = AdvantagePlan(algorithm_config)  # the trainer's own, when it gives one (TrainerState.plan)
        self._row_losses: list[tuple[RoleLoss, Tensor | None]] = [(self.plan.loss, None)]
        self.loss_agg_mode = self.algorithm.loss_agg_mode or "token-mean"
        self.loss_agg_horizon = self.algorithm.loss_agg_horizon or config.rllm.rollout.max_new_tokens
        self.use_kl_loss = bool(self.algorithm.use_kl_loss)
        self._loss_params: dict[str, dict[str, Any]] = {}  # each loss's LossContext.params, read once
        self.scheduler, self._pending_scheduler_state = None, None
        self._weight_stats: list[Tensor] = []  # an update's rollout correction stats, made in its forwards

    def scheduler_state(self) -> dict | None:
        """The lr scheduler's state dict (the one a checkpoint restored, before the first update)."""
        return self.scheduler.state_dict() if self.scheduler is not None else self._pending_scheduler_state

    def load_scheduler_state(self, state: dict | None) -> None:
        """Restore :meth:`scheduler_state`; the scheduler, built at the first update, takes it then."""
        self.scheduler, self._pending_scheduler_state = None, state

    def _ensure_scheduler(self, trainer_state: TrainerState, updates_per_step: int) -> None:
        if self.scheduler is None:
            total = max(trainer_state.total_steps, 1) * updates_per_step
            steps = self.algorithm.warmup_steps  # rLLM's: optimizer steps; <= 0: the ratio of the total
            warmup = steps if steps > 0 else int(self.algorithm.warmup_steps_ratio * total)
            self.scheduler = get_scheduler(
                _SCHEDULES[self.algorithm.lr_schedule],
                self.actor.optimizer,
                num_warmup_steps=warmup,
                num_training_steps=total,
            )
            if self._pending_scheduler_state is not None:
                # resumed: the checkpoint's step count, with the current backend.lr, lr_schedule and
                # warmup (resumable settings: trainer/runtime/fingerprint.py), so a changed one applies from here
                base_lrs = [self.settings.lr] * len(self.actor.optimizer.param_groups)
                self.scheduler.load_state_dict({**self._pending_scheduler_state, "base_lrs": base_lrs})
                self._pending_scheduler_state = None
                step = self.scheduler.last_epoch
                for group, base, lr_lambda in zip(
                    self.actor.optimizer.param_groups, base_lrs, self.scheduler.lr_lambdas, strict=True
                ):
                    group["lr"] = base * lr_lambda(step)  # building the scheduler reset it to the step-0 value

    async def update(self, trainer_state: TrainerState) -> None:
        """``backend.ppo_epochs`` passes over the batch, each in ``ceil(R / backend.mini_batch_size)``
        shuffled, near-equal mini-batches of the ``R`` rows of every rank (one row per step;
        ``mini_batch_size`` None: the whole batch), one AdamW step each, its gradient accumulated
        over micro-batches. Each rank trains on its own rows of every mini-batch; the loss is
        normalised over the global mini-batch.

        Raises:
            OutOfMemoryError: the update ran out of memory (naming the settings that lower it).
        """
        batch, ranks = trainer_state.backend_batch, self.ranks
        num_rows, total_rows = batch.input_ids.shape[0], self.micro.global_rows(batch)
        if total_rows == 0:  # nothing to train on anywhere (the trainer skips such steps itself)
            return
        epochs, num_minis = self.micro.updates_per_batch(total_rows)
        self._ensure_scheduler(trainer_state, epochs * num_minis)
        self._row_losses = self.row_losses(batch, trainer_state.plan or self.plan)
        modes = sorted({self.agg_mode_of(loss) for loss, _ in self._row_losses} - {self.loss_agg_mode})
        local_stats, grad_norms = [], []
        self._weight_stats.clear()
        # before the first optimizer step a stop may abandon the update (nothing changed yet); after it the
        # update runs to its end (no_stop_points): the step is then checkpointed as done (issue 52)
        with stage_memory("updating the policy", self.micro.memory_advice()), self._abandonable(), ExitStack() as taken:
            for _ in range(epochs):
                order = torch.randperm(num_rows, device=self.device)
                for rows in order.tensor_split(num_minis):  # this rank's part of each global mini-batch
                    normaliser = self.global_normaliser(batch.response_mask[rows])
                    agg = Aggregation(self.loss_agg_mode, self.loss_agg_horizon, normaliser)
                    # a loss that pins another aggregation (gspo, a registered one) is normalised in its mode
                    pinned = {mode: self.global_normaliser(batch.response_mask[rows], mode) for mode in modes}
                    micro = self.micro.split(batch, rows, collective=True)
                    # no gradient to zero: the previous step (Actor.step) freed it
                    stats = {}
                    for i, micro_rows in enumerate(micro):
                        stop_point()  # trainer/runtime/stop.py
                        last = i == len(micro) - 1
                        with gradient_sync(self.actor.train_model, last):
                            loss, micro_stats = self.micro_batch_loss(batch, micro_rows, normaliser, pinned)
                            loss.backward()
                        if self.critic is not None:
                            with gradient_sync(self.critic.train_model, last):
                                micro_stats |= self.critic.backward(batch, micro_rows, agg, world_size=ranks.world_size)
                        stats = {k: stats.get(k, 0) + v for k, v in micro_stats.items()}
                    stop_point()  # the whole gradient, not yet applied: still abandonable before the first step
                    grad_norms.append(self.actor.step())
                    if len(grad_norms) == 1:  # the weights moved: no stop point abandons the update from here
                        taken.enter_context(no_stop_points())
                    self.scheduler.step()
                    if self.critic is not None:
                        self.critic.step()
                    local_stats.append(stats)
        trainer_state.metrics |= self._global_update_stats(local_stats, grad_norms)
        if self._weight_stats:
            trainer_state.metrics |= summarise_weights_over_ranks(self._weight_stats, ranks)
        trainer_state.metrics["actor/lr"] = self.scheduler.get_last_lr()[0]
        if self.critic is not None and (critic_norm := self.critic.take_grad_norm()) is not None:
            trainer_state.metrics["critic/grad_norm"] = critic_norm

    @contextmanager
    def _abandonable(self) -> Iterator[None]:
        """An update abandoned by a stop request (only before its first optimizer step: after it,
        :func:`~rllm_torch.trainer.runtime.stop.no_stop_points`) leaves no gradient behind."""
        try:
            yield
        except StopRequested:
            self.actor.optimizer.zero_grad(set_to_none=True)
            if self.critic is not None:
                self.critic.optimizer.zero_grad(set_to_none=True)
            raise

    def row_losses(self, batch, plan: AdvantagePlan) -> list[tuple[RoleLoss, Tensor | None]]:
        """The policy loss of each row of ``batch``, each role's from its plan:
        ``[(loss, None)]`` when every group's role trains with the same loss (the run's
        ``loss_fn`` unless a role's entry says otherwise), else one ``(loss, [R] bool rows)`` per
        loss in use; all of them aggregated over the mini-batch's one normaliser."""
        of_role = {role: plan.role(role).loss for role in set(batch.group_roles)}
        losses = {loss.name: loss for loss in of_role.values()}
        used = sorted(losses)
        if len(used) <= 1:
            return [(losses[used[0]] if used else plan.loss, None)]
        loss_G = torch.tensor([used.index(of_role[r].name) for r in batch.group_roles], device=batch.group_index.device)
        trajectory_R = batch.row_index if batch.row_index is not None else torch.arange(len(batch.input_ids))
        loss_R = loss_G[batch.group_index[trajectory_R.to(batch.group_index.device)]]
        return [(losses[name], loss_R == i) for i, name in enumerate(used)]

    def agg_mode_of(self, loss: RoleLoss) -> str:
        """The aggregation of ``loss``: its pinned one (``gspo``'s, or its registration's), else
        the run's ``loss_agg_mode``."""
        return loss.agg_mode or self.loss_agg_mode

    def global_normaliser(self, mask_RT: Tensor, mode: str | None = None) -> Tensor:
        """``mode``'s (default: ``loss_agg_mode``'s) normaliser of a mini-batch over every rank's
        rows (one all-reduce)."""
        normaliser = loss_normaliser(mask_RT, mode or self.loss_agg_mode)
        if self.ranks.distributed:
            normaliser = normaliser.clone()
            torch.distributed.all_reduce(normaliser, group=self.ranks.process_group)
        return normaliser

    def micro_batch_loss(
        self, batch, rows: Tensor, normaliser: Tensor, pinned: dict[str, Tensor] | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """This rank's loss on the micro-batch ``rows`` of a global mini-batch (divided by the
        mini-batch's global ``normaliser``, or by ``pinned[mode]`` for a loss that pins ``mode``;
        times the world size for DDP's mean) and its local stats: shares of the global loss
        (:data:`_SHARE_STATS`), token sums of the diagnostics (the policy's entropy among them), and
        ``tokens``. Old log-probs left None by the passes
        (:class:`~rllm_torch.backends.torch_backend.passes.BatchPasses`) are this forward's, detached."""
        mask_RT, agg = batch.response_mask[rows], Aggregation(self.loss_agg_mode, self.loss_agg_horizon, normaliser)
        fwd = self._forward(batch, rows)
        advantages = self._rollout_weighted(batch, rows, fwd.old_log_probs)
        trained_RT, selection = self._policy_tokens(
            fwd.log_probs, fwd.entropy, advantages, batch.rollout_log_probs[rows], mask_RT
        )
        loss, loss_stats = self._role_losses(batch, rows, fwd, advantages, trained_RT, agg, pinned or {})
        tokens = mask_RT.sum()
        stats = {"loss": loss.detach(), "tokens": tokens} | loss_stats | selection
        stats["entropy"] = (fwd.entropy.detach() * mask_RT).sum() if fwd.entropy is not None else tokens * 0.0
        if (bonus := self._entropy_bonus(fwd.entropy, mask_RT, agg)) is not None:
            loss = loss + bonus
        stats |= self._kl_diagnostics(batch, rows, fwd.old_log_probs, mask_RT)
        if self.use_kl_loss:  # DeepSeekMath's GRPO: + beta * KL(policy || reference), aggregated like the loss
            kl_loss = self._kl_loss(batch, rows, fwd, agg)
            loss = loss + self.algorithm.kl_loss_coef * kl_loss
            stats["kl_loss"] = kl_loss.detach()
        return (loss + fwd.anchor) * self.ranks.world_size, stats

    def _forward(self, batch, rows: Tensor) -> _Forward:
        """The policy's forward on ``rows`` (on a rank without rows a zero loss through the same
        forward, so the gradient collectives still run); π_old the passes' or this forward's."""
        scored_RT = batch.response_mask[rows] > 0
        if batch.obs_mask is not None:  # a loss that trains the observation tokens (echo) needs theirs too
            scored_RT = scored_RT | (batch.obs_mask[rows] > 0)
        if rows.numel():
            scores = self.actor.train_model(batch.input_ids[rows], batch.attention_mask[rows], scored_RT, True)
            log_probs, entropy, anchor = scores.log_probs, scores.entropy, 0.0
        else:
            log_probs, entropy, anchor = batch.rollout_log_probs[rows], None, self.actor.dummy_loss()
        old_log_probs = log_probs.detach() if batch.old_log_probs is None else batch.old_log_probs[rows]
        return _Forward(log_probs, entropy, old_log_probs, anchor)

    def _rollout_weighted(self, batch, rows: Tensor, old_log_probs: Tensor) -> Tensor:
        """The advantages of ``rows``, times the rollout correction's importance weights with a
        ``tis_mode`` (issue 18: w·ℓ(A) = ℓ(w·A) for the losses linear in A, w >= 0): the passes', or
        made here from this forward's π_old (their stats kept for the update's metrics)."""
        advantages, correction = batch.advantages[rows], self.algorithm.rollout_correction
        if correction.tis_mode is None:
            return advantages
        if batch.old_log_probs is None:
            mask_RT = batch.response_mask[rows]
            weights, weight_stats = rollout_weights(old_log_probs, batch.rollout_log_probs[rows], mask_RT, correction)
            self._weight_stats.append(weight_stats)
        else:
            weights = batch.extras["rollout_is_weights"][rows]
        return advantages * weights

    def _role_losses(
        self, batch, rows: Tensor, fwd: _Forward, advantages: Tensor, trained_RT: Tensor, agg: Aggregation, pinned: dict
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Each loss in use on its rows of the micro-batch, every one called alike (a
        :class:`~rllm_torch.core.losses.LossContext`, :class:`~rllm_torch.rllm.plan.RoleLoss`): their
        sum, and the token sums of their metrics over their rows, as ``actor/<key>``."""
        mask_RT, rollout = batch.response_mask[rows], batch.rollout_log_probs[rows]
        reference = batch.ref_log_probs[rows] if batch.ref_log_probs is not None else None
        no_obs_RT = torch.zeros_like(mask_RT)  # what a loss that does not ask for the observation tokens sees
        obs_RT = batch.obs_mask[rows] if batch.obs_mask is not None else no_obs_RT
        loss, stats = fwd.log_probs.new_zeros(()), {}
        for role_loss, of_loss_R in self._row_losses:  # one loss for the whole batch, or one per role's rows
            part_RT, action_RT, observed_RT = mask_RT, trained_RT, obs_RT
            if of_loss_R is not None:
                if not bool(of_loss_R[rows].any()):
                    continue  # none of this loss's rows in the micro-batch
                of_rows = of_loss_R[rows, None]
                part_RT, action_RT, observed_RT = mask_RT * of_rows, trained_RT * of_rows, obs_RT * of_rows
            mode = self.agg_mode_of(role_loss)
            ctx = LossContext(
                logp_curr=fwd.log_probs,
                logp_old=fwd.old_log_probs,
                advantages=advantages,
                action_mask=action_RT,  # the tokens trained on; the normaliser stays the mini-batch's (as TRL)
                obs_mask=observed_RT if "obs_mask" in role_loss.needs else no_obs_RT,
                aggregate=agg.pinned(mode, pinned.get(mode, agg.normaliser)),
                logp_ref=reference,
                logp_rollout=rollout,
                params=self._params(role_loss),
            )
            part, metrics = role_loss(ctx)
            loss, part_tokens = loss + part, part_RT.sum()
            for k, v in metrics.items():  # token sums of each loss's diagnostics, over its rows
                stats[f"actor/{k}"] = stats.get(f"actor/{k}", 0) + v.detach() * part_tokens
        return loss, stats

    def _params(self, loss: RoleLoss) -> dict[str, Any]:
        """``loss``'s ``LossContext.params``, read from the run config once."""
        if loss.name not in self._loss_params:
            self._loss_params[loss.name] = loss_params(loss, self.config)
        return self._loss_params[loss.name]

    def _entropy_bonus(self, entropy: Tensor | None, mask_RT: Tensor, agg: Aggregation) -> Tensor | None:
        """verl's actor's ``- entropy_coeff · agg(entropy)`` with ``backend.entropy_coeff`` > 0, else None."""
        if not self.settings.entropy_coeff or entropy is None:
            return None
        return entropy_bonus(entropy, mask_RT, entropy_coeff=self.settings.entropy_coeff, agg=agg)[0]

    def _kl_diagnostics(self, batch, rows: Tensor, old_log_probs: Tensor, mask_RT: Tensor) -> dict[str, Tensor]:
        """Token sums of the sampler against the trainer on the same weights
        (``rollout_logprob_abs_diff``) and, with a reference, of the old policy's KL to it (k1, k3)."""
        stats = {"rollout_logprob_abs_diff": ((old_log_probs - batch.rollout_log_probs[rows]).abs() * mask_RT).sum()}
        if self.actor.has_reference:
            for name, kind in (("ref/kl_k1", "kl"), ("ref/kl_k3", "low_var_kl")):
                stats[name] = (kl_penalty(old_log_probs, batch.ref_log_probs[rows], kind) * mask_RT).sum()
        return stats

    def _kl_loss(self, batch, rows: Tensor, fwd: _Forward, agg: Aggregation) -> Tensor:
        """``agg`` of the policy's per-token KL to the reference (``kl_loss_type``; with
        ``use_bias_correction_kl`` TRL's, for tokens sampled from π_old)."""
        kl = kl_penalty(fwd.log_probs, batch.ref_log_probs[rows], self.algorithm.kl_loss_type)
        if self.algorithm.use_bias_correction_kl:
            kl = bias_corrected_kl(kl, fwd.log_probs, fwd.old_log_probs)
        return agg(kl, batch.response_mask[rows])

    def _policy_tokens(
        self, log_probs: Tensor, entropy: Tensor | None, advantages: Tensor, rollout_log_probs: Tensor, mask_RT: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The tokens the policy loss trains on: ``mask_RT``, less the low-entropy ones
        (``backend.top_entropy_quantile < 1``, a quantile over every rank's micro-batch) and the
        off-policy negative sequences (``rollout_correction.off_policy_mask_threshold``); and the
        token sums of what was left out (``entropy_masked``, ``off_policy_masked``)."""
        s, stats, keep_RT = self.settings, {}, mask_RT
        if s.top_entropy_quantile < 1:
            group = self.ranks.process_group if self.ranks.distributed else None
            values = entropy.detach() if entropy is not None else torch.zeros_like(mask_RT)
            keep_RT = keep_RT * high_entropy_mask(values, mask_RT, s.top_entropy_quantile, process_group=group)
            stats["entropy_masked"] = (mask_RT - keep_RT).sum()
        threshold = self.algorithm.rollout_correction.off_policy_mask_threshold
        if threshold is not None:
            sequences = off_policy_sequence_mask(log_probs, rollout_log_probs, advantages, mask_RT, threshold)
            stats["off_policy_masked"] = (keep_RT * (1 - sequences)).sum()
            keep_RT = keep_RT * sequences
        return keep_RT, stats

    def _global_update_stats(self, local_stats: list[dict], grad_norms: list[torch.Tensor]) -> dict[str, float]:
        """Means over the mini-batches of the global values: the shares of a loss (summed over the
        ranks), ``grad_norm`` (the same on every rank after DDP's all-reduce) and the token means
        of the diagnostics over every rank's tokens. Keys without a ``/`` get ``actor/``. One
        all-reduce for the whole update."""
        keys = sorted({k for stats in local_stats for k in stats} - {"tokens"})
        table = torch.stack(
            [
                torch.stack([stats["tokens"]] + [stats.get(k, stats["tokens"] * 0) for k in keys]).float()
                for stats in local_stats
            ]
        )
        if self.ranks.distributed:
            torch.distributed.all_reduce(table, group=self.ranks.process_group)
        tokens_M = table[:, 0].clamp(min=1.0)
        norms = [g.full_tensor() if hasattr(g, "full_tensor") else g for g in grad_norms]  # FSDP: a DTensor
        out = {"actor/grad_norm": torch.stack(norms).float().mean()}
        for i, k in enumerate(keys):
            column = table[:, 1 + i]
            out[k if "/" in k else f"actor/{k}"] = (column if k in _SHARE_STATS else column / tokens_M).mean()
        return {k: float(v) for k, v in out.items()}
