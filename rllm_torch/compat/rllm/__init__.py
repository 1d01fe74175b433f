"""rLLM's module paths over rllm_torch: a port of rLLM code is an import-prefix change,
``from rllm.X import Y`` → ``from rllm_torch.compat.rllm.X import Y``, for rLLM's paths of today
(``rllm.trainer.algorithms.*``, ``rllm.types``, ``rllm.workflows.*``, ``rllm.engine.rollout``,
``rllm.trainer.unified_trainer``, ``rllm.trainer.backend_protocol``, ``rllm.trainer.AgentTrainer``)
and of before 2026-06 (``rllm.experimental.common.*``, ``rllm.experimental.unified_trainer``).
Every name is re-exported from its one implementation; nothing here is a second copy of a rule.

Where rllm_torch differs from rLLM on purpose, ``AlgorithmConfig(compat="rllm")``
(``rllm.algorithm.compat=rllm``) gives rLLM's numbers; docs/porting.md lists each difference.
Its top level holds rLLM's data types, as ``import rllm`` does."""

from rllm_torch.rllm.types import Action, Episode, Step, Trajectory, TrajectoryGroup

__all__ = ["Action", "Episode", "Step", "Trajectory", "TrajectoryGroup"]
