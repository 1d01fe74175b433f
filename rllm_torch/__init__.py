"""rllm_torch: PyTorch-native, tensorized advantage estimation with rLLM's API.

Shape letters, used in docstrings and as suffixes of tensor names inside function bodies:

* ``N`` trajectories (flat order), ``G`` groups, ``K`` slots of the padded ``[G, K]`` layout
  (the largest group size), ``T`` tokens.

So ``rewards_GK`` is a padded ``[G, K]`` tensor, ``mean_G`` holds one value per group and
``adv_N`` one value per trajectory.

Quick start::

    import torch
    from rllm_torch import GroupedRewards, grpo

    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0]])  # 2 prompts x 4 rollouts
    advantages, returns = grpo(GroupedRewards.from_padded(rewards))       # [8], flat order
"""

from rllm_torch.core import *  # noqa: F403 - re-exported public surface
from rllm_torch.core import __all__ as _core_all
from rllm_torch.rllm import *  # noqa: F403 - re-exported public surface
from rllm_torch.rllm import __all__ as _rllm_all

__all__ = [*_core_all, *_rllm_all]

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``UnifiedTrainer``, rLLM's trainer (``rllm.experimental.unified_trainer``), importable from
    here as in rLLM, and ``register_backend`` (:mod:`rllm_torch.trainer.backend_registry`), beside
    ``register_adv_estimator`` and ``register_loss``; both are the training framework's
    (:mod:`rllm_torch.trainer`), whose libraries (OmegaConf, tqdm, rich, ...) load on first use,
    never on ``import rllm_torch``."""
    if name == "UnifiedTrainer":
        from rllm_torch.trainer.unified_trainer import UnifiedTrainer

        return UnifiedTrainer
    if name == "register_backend":
        from rllm_torch.trainer.backend_registry import register_backend

        return register_backend
    raise AttributeError(f"module 'rllm_torch' has no attribute {name!r}")
