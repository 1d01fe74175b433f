"""What a run is about to do, said once before it starts: the step plan and the start-up summary."""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import OmegaConf

from rllm_torch.rllm.bound_estimator import BoundEstimator
from rllm_torch.rllm.plan import AdvantagePlan
from rllm_torch.trainer.runtime.fingerprint import describe_changes
from rllm_torch.trainer.schema import prompts_per_step

__all__ = ["StepPlan", "plan_steps", "startup_summary"]


@dataclass(frozen=True)
class StepPlan:
    """The training steps of a run.

    Attributes:
        total_steps: steps the run trains in all (a resumed run counts the ones already done).
        epochs: passes over the data the loop may make (more than ``total_epochs`` when
            ``total_batches`` asks for more steps than those epochs hold).
        steps_per_epoch: batches in one pass over the training data.
        note: what was decided when the two settings disagree, else None.
    """

    total_steps: int
    epochs: int
    steps_per_epoch: int
    note: str | None = None


def plan_steps(steps_per_epoch: int, total_epochs: int, total_batches: int | None) -> StepPlan:
    """The step plan of ``rllm.trainer.total_epochs`` and ``total_batches``.

    ``total_batches`` (when set, > 0) is the number of steps to train: fewer than the epochs
    hold stops early; more trains further epochs, and the plan says so (the run never stops
    short of a step count it was given without a word).

    Examples:
        >>> plan_steps(4, 1, 5).note
        'rllm.trainer.total_batches=5 is more than rllm.trainer.total_epochs=1 holds (4 steps of 4 a pass): training 5 steps, over 2 epochs'
        >>> plan_steps(64, 4, None)
        StepPlan(total_steps=256, epochs=4, steps_per_epoch=64, note=None)
    """
    if not total_batches or total_batches <= 0:
        return StepPlan(steps_per_epoch * total_epochs, total_epochs, steps_per_epoch)
    if steps_per_epoch == 0:
        return StepPlan(0, total_epochs, 0, "the training set is empty: nothing to train")
    epochs = math.ceil(total_batches / steps_per_epoch)
    if total_batches <= steps_per_epoch * total_epochs:
        return StepPlan(total_batches, epochs, steps_per_epoch)
    note = (
        f"rllm.trainer.total_batches={total_batches} is more than rllm.trainer.total_epochs={total_epochs} holds "
        f"({steps_per_epoch * total_epochs} steps of {steps_per_epoch} a pass): training {total_batches} steps, over {epochs} epochs"
    )
    return StepPlan(total_batches, epochs, steps_per_epoch, note)


def _changed_options(estimator: BoundEstimator, options: dict) -> dict:
    """``options`` but those equal to the estimator's own default (its signature's)."""
    try:
        params = inspect.signature(estimator.registration.tensor_fn or estimator.registration.fn).parameters
    except (TypeError, ValueError):  # no signature
        params = {}
    return {k: v for k, v in options.items() if k not in params or params[k].default != v}


def _names(estimator_map: dict) -> dict[str, str]:
    return {role: getattr(name, "value", name) for role, name in estimator_map.items()}


def _extras_line(config: Any, plan: AdvantagePlan) -> str:
    """The settings beyond the default algorithm: estimator options, discounts, KL terms, the
    reference policy, the critic, the vLLM sampler and rollout correction ("" when none is set)."""
    algorithm = config.rllm.algorithm
    critic, critic_lr = (OmegaConf.select(config, f"backend.critic.{k}", default=None) for k in ("enable", "lr"))
    parts = []
    estimators = plan.estimators
    for name, options in algorithm.estimator_options.items():
        if name in estimators and (changed := _changed_options(estimators[name], dict(options))):
            parts.append(f"{name} {', '.join(f'{k}={v}' for k, v in changed.items())}")
    if algorithm.gamma != 1.0 or algorithm.lam != 1.0:
        parts.append(f"gamma={algorithm.gamma}, lam={algorithm.lam}")
    if algorithm.use_kl_loss:
        parts.append(f"KL loss {algorithm.kl_loss_type} x {algorithm.kl_loss_coef}")
    if algorithm.use_kl_in_reward:
        parts.append(f"KL in reward {algorithm.kl_penalty} x {algorithm.kl_coef}")
    if algorithm.use_kl_loss or algorithm.use_kl_in_reward:
        parts.append(f"reference {config.model.ref_path or 'the initial policy'}")
    if critic:  # the torch backend's settings (another backend's section may have none)
        parts.append("critic" + (f" (lr {critic_lr})" if critic_lr is not None else ""))
    if OmegaConf.select(config, "backend.rollout.engine", default=None) == "vllm":
        parts.append("rollouts through vLLM")
    correction = algorithm.rollout_correction
    if correction.tis_mode:
        parts.append(f"rollout correction {correction.tis_mode} (cap {correction.tis_cap})")
    if correction.bypass_mode:
        parts.append("bypass_mode (the rollout log-probs are the old policy's)")
    return "; ".join(parts)


def _model_line(config: Any, backend: Any) -> str:
    model, settings = getattr(backend, "model", None), config.model
    parts = [str(settings.path or settings.arch)]
    if settings.path is None:
        parts.append(f"{settings.num_layers} layers, d = {settings.hidden_size}, random weights")
    if model is not None:
        parts.append(f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters")
    if (tokenizer := getattr(backend, "tokenizer", None)) is not None:
        saved = getattr(backend, "tokenizer_from_path", False)
        kind = "saved tokenizer" if saved else "character tokenizer"
        chat = ", chat template" if config.task.apply_chat_template else ""
        source = getattr(backend, "alphabet_source", None)
        alphabet = f": {source}" if source and not saved else ""  # where its characters came from
        parts.append(f"{kind} ({len(tokenizer)} tokens{chat}{alphabet})")
    return ", ".join(parts)


def _task_line(config: Any, train: list | None, val: list | None) -> str:
    rows = [row for row in (train or []) if isinstance(row, dict)]
    sources = sorted({str(row["data_source"]) for row in rows if "data_source" in row})
    if rows and not sources:  # tasks of the caller's own (UnifiedTrainer from Python), not task.name's
        line = f"{len(train)} training prompts of your own (no data_source: their metrics are val/unknown/...)"
    else:
        line = f"{config.task.name}: {len(train or [])} training prompts"
        line += f" ({', '.join(sources)})" if sources else ""
    if val:
        return f"{line}, {len(val)} validation prompts"
    hint = " (task.val_path is not set)" if config.task.name == "file" else ""
    return f"{line}; no validation{hint}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _prompts_per_step(config: Any, train: list | None) -> str:
    """Prompts per step (:func:`~rllm_torch.trainer.schema.prompts_per_step`), as the data loader
    will really batch the training set."""
    batch_size = prompts_per_step(config)
    key = (
        "rllm.async_training.mini_batch_size" if batch_size != config.data.train_batch_size else "data.train_batch_size"
    )
    if train is None:
        return f"{batch_size} prompts per step"
    if 0 < len(train) < batch_size:
        return f"{len(train)} prompts per step (the whole training set; {key}={batch_size})"
    last = len(train) % batch_size
    return f"{batch_size} prompts per step" + (f" ({last} in the last step of each epoch)" if last else "")


def _warnings(config: Any, plan: AdvantagePlan) -> str:
    """The start-up summary's warnings: settings that run but are likely not what was meant."""
    rllm, found = config.rllm, [_singleton_groups_warning(config, plan)]
    rs = rllm.rejection_sample
    if rs.min_trajs_per_group > rllm.rollout.n:  # rLLM drops such groups with or without enable
        found.append(
            f"rllm.rejection_sample.min_trajs_per_group={rs.min_trajs_per_group} is above rllm.rollout.n="
            f"{rllm.rollout.n}: a group of one trajectory per rollout is dropped, so only workflows with several "
            "trajectories of a role per episode train; lower min_trajs_per_group or raise rllm.rollout.n"
        )
    section = rllm.async_training
    if section.enable and section.staleness_threshold >= 1 and rllm.algorithm.rollout_correction.tis_mode is None:
        found.append(
            f"rllm.async_training.staleness_threshold={section.staleness_threshold:g} trains groups sampled by older "
            "weights with no importance correction; rllm.algorithm.rollout_correction.tis_mode=token_mask (AReaL's "
            "decoupled PPO, docs/async.md) weighs each token by pi_old / pi_sampler"
        )
    return "; ".join(w for w in found if w)


def _async_line(config: Any) -> str:
    """The ``async`` row: how far sampling may run ahead, and the off-policy correction in use."""
    section = config.rllm.async_training
    if not section.enable:
        return ""
    correction = config.rllm.algorithm.rollout_correction
    parts = [
        f"sampling runs ahead, groups at most {section.staleness_threshold:g} policy versions stale "
        f"({'waits' if section.stale_groups == 'wait' else 'drops past it'})",
        f"weights synced every {_count(section.trigger_parameter_sync_step, 'step')}"
        + (", mid-episode too (partial rollouts)" if section.partial_rollout else ""),
        f"off-policy correction: tis_mode={correction.tis_mode}" if correction.tis_mode else "no off-policy correction",
    ]
    return ", ".join(parts)


def _steps_text(plan: StepPlan, total_batches: int | None) -> str:
    """``256 (4 epochs of 64 steps)``; a run that stops within an epoch says so (``16 of the 512
    steps of an epoch (rllm.trainer.total_batches=16)``, not ``16 (1 epoch of 512 steps)``)."""
    per_epoch, total = plan.steps_per_epoch, plan.total_steps
    if plan.note or per_epoch == 0 or total % per_epoch == 0:
        return f"{total} ({_count(plan.epochs, 'epoch')} of {_count(per_epoch, 'step')})"
    whole, rest = divmod(total, per_epoch)
    if whole == 0:
        return f"{total} of the {per_epoch} steps of an epoch (rllm.trainer.total_batches={total_batches})"
    return (
        f"{total}: {_count(whole, 'epoch')} of {_count(per_epoch, 'step')} and {rest} of the next "
        f"(rllm.trainer.total_batches={total_batches})"
    )


def _singleton_groups_warning(config: Any, plan: AdvantagePlan) -> str:
    """Estimators whose baseline is a statistic of the prompt's group of rollouts (declared at
    registration): with one rollout a prompt every group is a singleton, and each advantage is
    the reward itself ("group of one")."""
    rllm = config.rllm
    grouped = [name for name, bound in sorted(plan.estimators.items()) if bound.registration.group_baseline]
    if rllm.rollout.n != 1 or not grouped:
        return ""
    return (
        f"rllm.rollout.n=1: every group is one rollout, so {', '.join(grouped)} has no baseline: each advantage is the "
        "reward itself (the estimator's group-of-one rule); use rllm.rollout.n >= 2, or an estimator without groups "
        "(reinforce, prpo)"
    )


def startup_summary(
    trainer: Any, state: Any, resumed: Any, plan: StepPlan, unfinished: Sequence[str] = ()
) -> list[str]:
    """The lines the trainer prints (rank 0) before it trains: run directory, resume state,
    model, task, algorithm, steps, devices. ``unfinished``: the parts of the end of the run
    (after the last step) that a run resumed at its last step still has to do."""
    config, rllm = trainer.config, trainer.rllm_config
    ranks, backend = trainer.ranks, trainer.backend
    if rllm.trainer.val_only:
        weights = f"the weights of {resumed.path} (step {state.global_step})" if resumed else "the initial weights"
        run_state = f"validation only (rllm.trainer.val_only=true) of {weights}"
    elif resumed is None:
        run_state = "new run"
    elif state.global_step >= plan.total_steps and unfinished:
        run_state = (
            f"finishing from {resumed.path} (step {state.global_step} of {plan.total_steps}): "
            f"{' and '.join(unfinished)} still to do"
        )
    elif state.global_step >= plan.total_steps:
        run_state = (
            f"already complete: step {state.global_step} of {plan.total_steps} in {resumed.path}; nothing to train "
            "(raise rllm.trainer.total_epochs or total_batches to train longer)"
        )
    else:
        run_state = (
            f"resuming from {resumed.path} (step {state.global_step} of {plan.total_steps}, epoch {state.epoch})"
        )
    algorithm, algorithm_config = rllm.algorithm, trainer.settings.algorithm_config
    advantage_plan = trainer.settings.plan
    estimator = algorithm.adv_estimator + ("" if algorithm.norm_adv_by_std_in_grpo else " (no std)")
    if algorithm_config.estimator_map:
        estimator += f", by role {_names(algorithm_config.estimator_map)}"
    loss = f"{algorithm_config.loss_fn or 'ppo'}" + (
        f", by role {algorithm_config.loss_fn_map}" if algorithm_config.loss_fn_map else ""
    )
    if rllm.stepwise_advantage.mode != "broadcast":
        estimator += f" {rllm.stepwise_advantage.mode}"  # e.g. "rloo turn_level advantages"
    steps = _steps_text(plan, rllm.trainer.total_batches)
    if rllm.trainer.val_only:
        steps = "none: rllm.trainer.val_only=true validates the model once and trains nothing"
    device = str(getattr(backend, "device", "?"))
    devices = f"{device}, {torch.get_num_threads()} thread(s)"
    if ranks.distributed:
        devices += f"; world size {ranks.world_size} ({torch.distributed.get_backend(ranks.process_group)})"
    changes = trainer.checkpointer.changes if resumed is not None and state.global_step < plan.total_steps else {}
    rows = [
        ("run directory", str(trainer.run_dir)),
        ("state", run_state),
        *([("", f"changed on resume: {describe_changes(changes)}")] if changes else []),
        *(
            [("backend", f"{config.backend.name} ({type(backend).__qualname__})")]
            if config.backend.name != "torch"
            else []
        ),
        ("model", _model_line(config, backend)),
        *(backend.summary_rows() if hasattr(backend, "summary_rows") else []),
        ("task", _task_line(config, trainer.train_dataset, trainer.val_dataset)),
        (
            "algorithm",
            f"{estimator} advantages, {loss} loss ({algorithm.loss_agg_mode}), "
            f"{rllm.rollout.n} rollouts per prompt, {_prompts_per_step(config, trainer.train_dataset)}",
        ),
        *([("extras", extras)] if (extras := _extras_line(config, advantage_plan)) else []),
        *([("async", line)] if (line := _async_line(config)) else []),
        *([("warning", warning)] if (warning := _warnings(config, advantage_plan)) else []),
        ("steps", steps + (f"; {plan.note}" if plan.note else "")),
        ("devices", devices),
    ]
    width = max(len(name) for name, _ in rows)
    return ["rllm_torch run"] + [f"  {name:<{width}}  {value}" for name, value in rows]
