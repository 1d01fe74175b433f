"""The passes over a batch before its update (:class:`BatchPasses`, a part the
:class:`~rllm_torch.backends.torch_backend.backend.TorchBackend` holds): old, reference and value
log-probs without gradient, in micro-batches of at most ``backend.micro_batch_tokens`` padded
tokens; the KL penalty of the rewards (``use_kl_in_reward``); the rollout-correction weights of
the sampler (``rllm.algorithm.rollout_correction``). How a batch is cut into micro-batches and
counted over the ranks is :class:`MicroBatcher`, which the update
(:mod:`~rllm_torch.backends.torch_backend.update`) holds too."""

from __future__ import annotations

import torch
from omegaconf import DictConfig
from torch import Tensor

from rllm_torch.backends.torch_backend.actor import Actor
from rllm_torch.backends.torch_backend.critic import Critic
from rllm_torch.backends.torch_backend.micro_batches import split_rows, stage_memory
from rllm_torch.backends.torch_backend.shared_prompts import plan_shared_micro_batches, prompt_prefixes
from rllm_torch.core.losses import (
    importance_weight_stats,
    kl_penalty,
    rollout_importance_weights,
    summarise_importance_weights,
)
from rllm_torch.core.losses.rollout_rejection import parse_rollout_rs, rollout_rejection_mask
from rllm_torch.trainer.ranks import RunRanks
from rllm_torch.trainer.runtime.stop import stop_point
from rllm_torch.trainer.state import TrainerState

__all__ = ["BatchPasses", "MicroBatcher", "rollout_weights", "summarise_weights_over_ranks"]


class MicroBatcher:
    """How a batch's rows are cut into micro-batches and counted over the ranks, for the passes
    and the update alike.

    Args:
        settings: ``config.backend`` (``micro_batch_tokens``, ``ppo_epochs``,
            ``mini_batch_size``, and what the out-of-memory advice names).
        ranks: the run's processes.
        lora_r: ``model.lora.r`` (the advice suggests LoRA when it is 0).
        compute_dtype: the forwards' autocast dtype (None: float32).
    """

    def __init__(
        self,
        settings: DictConfig,
        ranks: RunRanks,
        *,
        lora_r: int,
        compute_dtype: torch.dtype | None,
        share_prompts: bool = False,
    ):
        self.settings, self.ranks, self.lora_r, self.compute_dtype = settings, ranks, lora_r, compute_dtype
        self.share_prompts = share_prompts

    def split(self, batch, rows: Tensor, *, collective: bool) -> list[Tensor]:
        """``rows`` in micro-batches of at most ``backend.micro_batch_tokens`` padded tokens
        (:func:`~rllm_torch.backends.torch_backend.micro_batches.split_rows`). ``collective``:
        the passes are collectives (training; FSDP forwards), so every rank gets the largest
        count over the ranks (one all-reduce), padded with empty micro-batches. With
        ``share_prompts`` a prompt's rows stay together and the budget counts packed tokens
        (:func:`~rllm_torch.backends.torch_backend.shared_prompts.plan_shared_micro_batches`)."""
        budget = self.settings.micro_batch_tokens
        if self.share_prompts and rows.numel():
            ids, mask, scored = batch.input_ids[rows], batch.attention_mask[rows], batch.response_mask[rows]
            plan = plan_shared_micro_batches(prompt_prefixes(ids, mask, scored), mask.sum(-1).tolist(), budget)
            micro = [rows[torch.tensor(group, device=rows.device)] for group in plan]
        else:
            micro = split_rows(rows, batch.attention_mask, budget)
        if collective and self.ranks.distributed:
            count = int(self.ranks.reduce([float(len(micro))], op="max")[0])
            micro += [rows[:0]] * (count - len(micro))
        return micro

    def global_rows(self, batch) -> int:
        """The batch's rows over every rank: one all-reduce per batch, its result kept in
        ``batch.extras`` for the update."""
        if "global_rows" not in batch.extras:
            batch.extras["global_rows"] = int(self.ranks.reduce([float(batch.input_ids.shape[0])])[0])
        return batch.extras["global_rows"]

    def updates_per_batch(self, total_rows: int) -> tuple[int, int]:
        """``(ppo_epochs, mini-batches per epoch)`` for a batch of ``total_rows`` rows over every rank."""
        s = self.settings
        return s.ppo_epochs, -(-total_rows // min(s.mini_batch_size or total_rows, total_rows))

    def memory_advice(self) -> str:
        """The settings that lower a stage's memory, for an out-of-memory error."""
        s = self.settings
        advice = [f"lower backend.micro_batch_tokens (now {s.micro_batch_tokens})"]
        if not s.gradient_checkpointing:
            advice.append("set backend.gradient_checkpointing=true")
        if self.compute_dtype is None:
            advice.append("set backend.dtype=bfloat16")
        if self.lora_r == 0:
            advice.append("train LoRA adapters (model.lora.r=16)")
        return ", ".join(advice[:-1]) + f" or {advice[-1]}" if len(advice) > 1 else advice[0]


def rollout_weights(
    old_log_probs: Tensor, rollout_log_probs: Tensor, response_mask: Tensor, correction
) -> tuple[Tensor, Tensor]:
    """Rollout correction's per-token weights (``rllm.algorithm.rollout_correction``'s ``tis_mode``,
    ``tis_cap``, ``tis_cap_lower``; :func:`~rllm_torch.core.losses.rollout_importance_weights`) of
    ``[R, T]`` rows, and their ``[5]`` stats (:func:`~rllm_torch.core.losses.importance_weight_stats`)
    to add up over micro-batches and ranks with :func:`summarise_weights_over_ranks`."""
    weights, capped = rollout_importance_weights(
        old_log_probs,
        rollout_log_probs,
        response_mask,
        tis_mode=correction.tis_mode,
        tis_cap=correction.tis_cap,
        tis_cap_lower=correction.tis_cap_lower,
    )
    return weights, importance_weight_stats(weights, capped, response_mask, tis_mode=correction.tis_mode)


def summarise_weights_over_ranks(stats: list[Tensor], ranks: RunRanks) -> dict[str, float]:
    """The ``rollout_corr/*`` metrics of :func:`rollout_weights`' stats of several parts of a
    batch, over every rank (two all-reduces)."""
    table = torch.stack(stats)
    sums, largest = table[:, :4].sum(0).tolist(), float(table[:, 4].max())
    return summarise_importance_weights(ranks.reduce(sums) + ranks.reduce([largest], "max"))


class BatchPasses:
    """The no-gradient passes before an update (the backend's ``process_backend_batch``).

    Args:
        actor: the policy (and the reference policy, when a KL term needs one).
        critic: the value model, or None.
        micro: the micro-batching shared with the update.
        algorithm: ``config.rllm.algorithm`` (the KL in the reward, rollout correction).
        device: where the batch lives.
    """

    def __init__(self, actor: Actor, critic: Critic | None, micro: MicroBatcher, algorithm: DictConfig, device):
        self.actor, self.critic, self.micro, self.algorithm, self.device = actor, critic, micro, algorithm, device
        self.use_kl_in_reward = bool(algorithm.use_kl_in_reward)

    @torch.no_grad()
    def log_probs(self, scorer: torch.nn.Module, batch, micro_batches: list[Tensor], *, sum_pi_squared: bool = False):
        """``[R, T]`` log-probs of the batch's trained response tokens (0 elsewhere), one forward
        per micro-batch; an empty micro-batch runs a zero-loss forward (FSDP: a collective). With
        ``sum_pi_squared``, ``(log_probs, Σ_v π_v²)``, the second from the same chunks of logits."""
        log_probs = torch.zeros_like(batch.response_mask)
        squares = torch.zeros_like(batch.response_mask) if sum_pi_squared else None
        for rows in micro_batches:
            stop_point()  # a SIGTERM: the step is abandoned here (trainer/runtime/stop.py)
            if rows.numel():
                positions = batch.response_mask[rows] > 0
                extra = {"with_sum_pi_squared": True} if sum_pi_squared else {}
                scores = scorer(batch.input_ids[rows], batch.attention_mask[rows], positions, **extra)
                log_probs[rows] = scores.log_probs
                if sum_pi_squared:
                    squares[rows] = scores.sum_pi_squared
            elif scorer is self.actor.train_model:
                self.actor.dummy_loss()
        return (log_probs, squares) if sum_pi_squared else log_probs

    async def run(self, trainer_state: TrainerState) -> None:
        """Old log-probs (and, when configured, the reference policy's log-probs, the KL penalty
        of the rewards and the critic's values) of every row, without gradient, in micro-batches.

        With a single update per batch (one epoch, one mini-batch) and no KL in the reward, the
        old log-probs are left None: the update's own forward runs on the weights the update
        starts from, so a separate no-gradient pass would compute the same numbers (TRL skips it
        too), and the update takes them from its forward, detached. That holds with rollout
        correction's weights too (``rllm.algorithm.rollout_correction.tis_mode``: the update makes
        them from its forward, :func:`rollout_weights`; AReaL's decoupled PPO, whose proximal policy
        is then the update's starting point), unless rejection (``rollout_rs``) or an estimator
        needs them before the advantages: ``trainer_state.needs`` (what the run's estimators
        declare, :attr:`~rllm_torch.rllm.plan.AdvantagePlan.needs`) names ``old_log_probs``, or
        ``sum_pi_squared`` (``sum_v pi_old(v)^2`` at each token, from the same pass; e.g.
        ``optimal_token_baseline``). With ``bypass_mode`` they are the sampler's.

        Raises:
            OutOfMemoryError: a pass ran out of memory (naming the settings that lower it).
        """
        batch, actor, micro = trainer_state.backend_batch, self.actor, self.micro
        total_rows = micro.global_rows(batch)
        correction = self.algorithm.rollout_correction
        sum_pi_squared = "sum_pi_squared" in trainer_state.needs
        single_update = (
            micro.updates_per_batch(max(total_rows, 1)) == (1, 1)
            and not self.use_kl_in_reward
            and correction.rollout_rs is None
            and not trainer_state.needs & {"old_log_probs", "sum_pi_squared"}
        )
        rows = torch.arange(batch.input_ids.shape[0], device=self.device)
        with stage_memory("computing the old, reference and value passes", micro.memory_advice()):
            if correction.bypass_mode:  # rLLM's bypass_mode: the sampler's log-probs are π_old
                batch.old_log_probs = batch.rollout_log_probs
            elif single_update:
                batch.old_log_probs = None
            else:
                parts = micro.split(batch, rows, collective=actor.sharded)
                if sum_pi_squared:
                    batch.old_log_probs, batch.sum_pi_squared = self.log_probs(
                        actor.scoring_module(), batch, parts, sum_pi_squared=True
                    )
                else:
                    batch.old_log_probs = self.log_probs(actor.scoring_module(), batch, parts)
            if actor.has_reference:
                scorer, context = actor.reference()
                with context:
                    batch.ref_log_probs = self.log_probs(scorer, batch, micro.split(batch, rows, collective=False))
            if self.critic is not None:
                batch.values = self.critic.values(batch, micro.split(batch, rows, collective=False))
        if correction.rollout_rs is not None:  # before the advantages (verl's order): a rejected sequence is untrained
            trainer_state.metrics |= self._reject_rollouts(batch)
        if correction.tis_mode is not None and batch.old_log_probs is not None:
            weights, stats = rollout_weights(
                batch.old_log_probs, batch.rollout_log_probs, batch.response_mask, correction
            )
            batch.extras["rollout_is_weights"] = weights
            trainer_state.metrics |= summarise_weights_over_ranks([stats], self.micro.ranks)
        if self.use_kl_in_reward:
            algorithm, mask = self.algorithm, batch.response_mask
            kl = kl_penalty(batch.old_log_probs, batch.ref_log_probs, algorithm.kl_penalty)
            batch.reward_penalty = algorithm.kl_coef * kl * mask
            penalty, tokens = micro.ranks.reduce([float(batch.reward_penalty.sum()), float(mask.sum())])
            trainer_state.metrics["reward/kl_penalty"] = penalty / max(tokens, 1.0)  # mean per trained token

    def _reject_rollouts(self, batch) -> dict[str, float]:
        """``rollout_correction.rollout_rs``: the rejected tokens leave ``batch.response_mask``
        (:func:`~rllm_torch.core.losses.rollout_rejection.rollout_rejection_mask`); the
        ``rollout_corr/rollout_rs_*`` metrics over every rank (one all-reduce)."""
        correction = self.algorithm.rollout_correction
        rules = parse_rollout_rs(correction.rollout_rs, correction.rollout_rs_threshold)
        keep, stats = rollout_rejection_mask(batch.old_log_probs, batch.rollout_log_probs, batch.response_mask, rules)
        batch.response_mask = batch.response_mask * keep
        names = sorted(stats)
        totals = dict(zip(names, self.micro.ranks.reduce([float(stats[n]) for n in names]), strict=True))
        out = {
            "rollout_corr/rollout_rs_masked_fraction": totals["rejected_tokens"] / max(totals["tokens"], 1.0),
            "rollout_corr/rollout_rs_seq_masked_fraction": totals["rejected_sequences"] / max(totals["sequences"], 1.0),
        }
        for rule in rules:
            share = totals[f"rejected_tokens/{rule.option}"] / max(totals["tokens"], 1.0)
            out[f"rollout_corr/rollout_rs_{rule.option}_masked_fraction"] = share
        return out
