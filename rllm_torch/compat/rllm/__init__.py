"""rLLM's module paths over rllm_torch: a port of rLLM code is an import-prefix change,
``from rllm.X import Y`` → ``from rllm_torch.compat.rllm.X import Y``, for rLLM's paths of today
(``rllm.trainer.algorithms.*``, ``rllm.types``, ``rllm.workflows.*``, ``rllm.engine.rollout``,
``rllm.trainer.unified_trainer``, ``rllm.trainer.backend_protocol``, ``rllm.trainer.AgentTrainer``,
``rllm.data``) and of before 2026-06 (``rllm.experimental.common.*``,
``rllm.experimental.unified_trainer``). Every name is re-exported from its one implementation;
nothing here is a second copy of a rule.

Where rllm_torch differs from rLLM on purpose, ``AlgorithmConfig(compat="rllm")``
(``rllm.algorithm.compat=rllm``) gives rLLM's numbers; docs/porting.md lists each difference.
Its top level holds rLLM's data types, as ``import rllm`` does, and (loaded on first use, as rLLM
loads them) ``BaseAgent`` and the ``terminal-rl`` branch's ``register_loss``, ``LossContext`` and
``register_adv_estimator``. rLLM's ``rollout``, ``evaluator`` and ``Task`` (its AgentFlow / eval
surface, run through rLLM's gateway) raise an ``ImportError`` that says what to use here, and so
does importing one of rLLM's modules that need its verl, tinker or fireworks backends
(:data:`BACKEND_MODULES`, e.g. ``rllm.trainer.verl.dataclass``) or that are its own internals
(:data:`NOT_MIRRORED_MODULES`: its console tables, its async trainer's buffer)."""

import sys

from rllm_torch.rllm.types import Action, Episode, Step, Trajectory, TrajectoryGroup

__all__ = [
    "Action",
    "Episode",
    "Step",
    "Trajectory",
    "TrajectoryGroup",
    "BaseAgent",
    "register_loss",
    "LossContext",
    "register_adv_estimator",
]

#: rLLM's top-level names that are not mirrored, and what to use here instead.
NOT_MIRRORED = {
    "rollout": "rllm.eval's @rollout (an AgentFlow run through rLLM's gateway): write the agent as a Workflow "
    "(rllm_torch.compat.rllm.workflows.workflow.Workflow) and pass workflow_class= to AgentTrainer",
    "evaluator": "rllm.eval's @evaluator (a score of an AgentFlow's episode): give the Workflow a reward_function "
    "(task_info, action) returning a RewardOutput, a float or a bool",
    "Task": "rllm.types.Task (an eval task with a dataset directory): rows here are dicts in rLLM's format "
    "(question, ground_truth, data_source, ...), e.g. from rllm_torch.compat.rllm.data.DatasetRegistry",
}

#: rLLM's modules (under ``rllm.``) that run on one of its backends, and the backend.
BACKEND_MODULES = {
    "trainer.verl": "verl",
    "trainer.tinker": "tinker",
    "trainer.fireworks": "fireworks",
    "trainer.deprecated": "verl",
    "trainer.distill": "tinker",
}

#: rLLM's other modules (under ``rllm.``) that rLLM's tests import and are not mirrored, and what
#: does the same here.
NOT_MIRRORED_MODULES = {
    "trainer.algorithms.visualization": "it prints rLLM's console tables of metrics, trajectories and the config; "
    "here the start-up summary prints the run's settings and rllm.trainer.logger chooses where metrics go",
    **dict.fromkeys(
        ("trainer.buffer", "trainer.sync_coordinator", "trainer.metrics_aggregator"),
        "it is a part of rLLM's fully-async trainer (its group buffer, dispatch quotas and metric reducer); here "
        "async training is rllm.async_training.enable=true (rllm_torch.trainer.pipeline.async_rollouts), whose "
        "steps log their metrics as every step does",
    ),
}


class _BackendModuleFinder:
    """Last on ``sys.meta_path``: an import of one of :data:`BACKEND_MODULES` (anything under it)
    that no module here answers raises an ``ImportError`` naming the backend and what to use; one
    of :data:`NOT_MIRRORED_MODULES`, one saying what does the same here."""

    @staticmethod
    def find_spec(fullname: str, path: object = None, target: object = None) -> None:
        rest = fullname.removeprefix(f"{__name__}.")
        if rest != fullname and rest in NOT_MIRRORED_MODULES:
            raise ImportError(
                f"rLLM's rllm.{rest} is not mirrored in rllm_torch: {NOT_MIRRORED_MODULES[rest]}.", name=fullname
            )
        for module, backend in BACKEND_MODULES.items():
            if rest != fullname and (rest == module or rest.startswith(f"{module}.")):
                raise ImportError(
                    f"rLLM's rllm.{rest} runs on rLLM's {backend} backend, which rllm_torch does not have: train with "
                    "AgentTrainer(..., backend='torch') (rllm_torch.compat.rllm.trainer) or "
                    "rllm_torch.compat.rllm.trainer.unified_trainer.UnifiedTrainer.",
                    name=fullname,
                )


if not any(isinstance(finder, _BackendModuleFinder) for finder in sys.meta_path):
    sys.meta_path.append(_BackendModuleFinder())


def __getattr__(name: str) -> object:
    """``BaseAgent``, ``register_loss``, ``LossContext`` and ``register_adv_estimator`` on first use
    (rLLM's ``rllm/__init__.py`` of branch ``terminal-rl`` loads them lazily, too).

    Raises:
        ImportError: one of rLLM's names that is not mirrored (:data:`NOT_MIRRORED`), saying what
            to use here.
        AttributeError: any other unknown name.
    """
    if name == "BaseAgent":
        from rllm_torch.trainer.workflow import BaseAgent

        return BaseAgent
    if name in ("register_loss", "LossContext"):
        from rllm_torch.core.losses import LossContext, register_loss

        return register_loss if name == "register_loss" else LossContext
    if name == "register_adv_estimator":
        from rllm_torch.rllm.registry import register_adv_estimator

        return register_adv_estimator
    if name in NOT_MIRRORED:
        raise ImportError(f"rLLM's {name} is not mirrored in rllm_torch: it is {NOT_MIRRORED[name]}.")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
