"""Settings whose default depends on what is loaded: a model built from scratch (the tiny default)
or a pretrained checkpoint (``model.path``). An explicit setting always wins; a setting left at
``null`` takes the value below, and the start-up summary names it and where it came from.

==================================  ============  ==============================================
setting                             from scratch  pretrained ``model.path``
==================================  ============  ==============================================
``backend.lr``                      1e-3          1e-5
``backend.critic.lr``               1e-3          1e-5
``backend.num_threads``             1             the process's cores / processes per machine
``backend.share_prompts``           false         true
``backend.gradient_checkpointing``  false         true
==================================  ============  ==============================================

Why these (measured on SmolLM2-135M-Instruct, 2 CPU cores; docs/pretrained.md "Training a pretrained
checkpoint"): 1e-3 is the rate a 0.1M-parameter random model learns at on a panel of four small
tasks (benchmarks/RESULTS_lr_panel.md): 2e-3 learns GRPO's default job faster (pass@1 0.865
against 0.695, two seeds) but collapsed the ``rloo`` experiment on it (0.215, stuck from step 64;
0.629 at 1e-3 in RESULTS_default_runs.md) and did not help a next-letter file task, so the default
stays the rate every shipped experiment learns at (docs/tasks.md says when to raise it). It
collapses a pretrained checkpoint within three steps (validation pass@1 0.039 -> 0.000, entropy
2.04 -> 0.79); 1e-5 raises pass@1 steadily on the same checkpoint. TRL's ``GRPOConfig`` and
verl's actor default to 1e-6, tuned for checkpoints of billions of parameters trained for
thousands of steps; a 135M model on a CPU budget of minutes learns too slowly there. A tiny model
gains nothing from threads (its matmuls are too small to split); a real one is matmul-bound and
gains from every core. A prompt shared by a step's rollouts is most of a pretrained recipe's tokens
(SmolLM2's chat template: 46 of ~71 a row) and is computed once (``backend.share_prompts``); the tiny
model's 4-token prompts save little, and its recorded numbers stay those of separate rows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "FROM_SCRATCH",
    "PRETRAINED",
    "DEFAULTED_KEYS",
    "ModelDefaults",
    "apply_model_defaults",
    "default_sources",
    "learning_rates",
]

#: The settings :func:`apply_model_defaults` fills where they are ``null``.
DEFAULTED_KEYS = (
    "backend.lr",
    "backend.critic.lr",
    "backend.num_threads",
    "backend.share_prompts",
    "backend.gradient_checkpointing",
)


@dataclass(frozen=True)
class ModelDefaults:
    """The values a ``null`` setting takes, for one kind of model."""

    source: str  # said in the start-up summary
    lr: float
    critic_lr: float
    num_threads: int | None  # None: the cores this process may use, shared by the processes of the machine
    share_prompts: bool
    gradient_checkpointing: bool


FROM_SCRATCH = ModelDefaults(
    "a model built from scratch",
    lr=1e-3,
    critic_lr=1e-3,
    num_threads=1,
    share_prompts=False,
    gradient_checkpointing=False,
)
PRETRAINED = ModelDefaults(
    "a pretrained model.path",
    lr=1e-5,
    critic_lr=1e-5,
    num_threads=None,
    share_prompts=True,
    gradient_checkpointing=True,
)


def learning_rates(config: Any) -> dict[str, float]:
    """``{"backend.lr": ..., "backend.critic.lr": ...}`` of ``config`` with ``null`` replaced by
    the default of what it loads (what a checkpoint records, so a resumed run compares rates)."""
    defaults = PRETRAINED if config.model.path is not None else FROM_SCRATCH
    backend = config.backend
    return {
        "backend.lr": defaults.lr if backend.lr is None else backend.lr,
        "backend.critic.lr": defaults.critic_lr if backend.critic.lr is None else backend.critic.lr,
    }


def default_sources(config: Any) -> dict[str, str]:
    """``{key: where its value comes from}`` for each key of :data:`DEFAULTED_KEYS` that is
    ``null`` in ``config`` (before :func:`apply_model_defaults` fills it): what the run directory's
    ``config.yaml`` says beside the value the run used."""
    defaults = PRETRAINED if config.model.path is not None else FROM_SCRATCH
    sources = {}
    for key in DEFAULTED_KEYS:
        node = config
        for part in key.split("."):
            node = getattr(node, part)
        if node is None:
            sources[key] = f"null: the default for {defaults.source}"
    if "backend.num_threads" in sources and defaults.num_threads is None:
        sources["backend.num_threads"] = f"null: the cores this process may use ({defaults.source})"
    return sources


def apply_model_defaults(config: Any, *, processes_per_machine: int = 1) -> str | None:
    """Fill ``backend.lr``, ``backend.critic.lr``, ``backend.num_threads``, ``backend.share_prompts``
    and ``backend.gradient_checkpointing`` of ``config`` where they are ``null``, from :data:`PRETRAINED` when ``model.path`` is set and
    :data:`FROM_SCRATCH` otherwise, and set torch's thread count to ``backend.num_threads``.

    Args:
        config: the typed run config (a backend's own copy); changed in place.
        processes_per_machine: torchrun's ``LOCAL_WORLD_SIZE``: the cores this process may use
            (``os.sched_getaffinity``) are shared among them, so ranks do not oversubscribe.

    Returns:
        The start-up summary's text for the filled settings (``"backend.lr=1e-05,
        backend.num_threads=2 (defaults for a pretrained model.path)"``), or None when every one
        was given.
    """
    backend = config.backend
    defaults = PRETRAINED if config.model.path is not None else FROM_SCRATCH
    filled = []
    if backend.lr is None:
        backend.lr = defaults.lr
        filled.append(f"backend.lr={defaults.lr:g}")
    if backend.critic.lr is None:
        backend.critic.lr = defaults.critic_lr
        if backend.critic.enable:
            filled.append(f"backend.critic.lr={defaults.critic_lr:g}")
    if backend.num_threads is None:
        cores = max(1, len(os.sched_getaffinity(0)) // max(1, processes_per_machine))
        backend.num_threads = defaults.num_threads or cores
        filled.append(f"backend.num_threads={backend.num_threads}")
    if backend.share_prompts is None:
        backend.share_prompts = defaults.share_prompts
        if defaults.share_prompts:  # said where it changes what runs (from scratch: rows as they always were)
            filled.append("backend.share_prompts=true")
    if backend.gradient_checkpointing is None:
        backend.gradient_checkpointing = defaults.gradient_checkpointing
        if defaults.gradient_checkpointing:
            filled.append("backend.gradient_checkpointing=true")
    torch.set_num_threads(backend.num_threads)
    return f"{', '.join(filled)} (defaults for {defaults.source})" if filled else None
