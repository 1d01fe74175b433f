"""The advantage estimators as pure functions of packed tensors (no registry, no config object).

Outcome (group) estimators take a :class:`~rllm_torch.core.packing.GroupedRewards` and return
``(advantages [N], returns [N])``: ``grpo``, ``rloo``, ``reinforce``,
``reinforce_plus_plus_baseline``, ``prpo``, ``opo``, ``pass_at_k``, ``grpo_passk``, ``gpg`` and
``gdpo`` (several rewards per trajectory), ``maxrl``, ``remax`` (with each group's greedy
reward). Token-level estimators take a
:class:`~rllm_torch.core.tokens.TokenRewards` and return ``[B, T]`` tensors:
``reinforce_plus_plus``, ``gae`` and ``optimal_token_baseline``. Multi-turn credit schemes take a
:class:`~rllm_torch.core.turns.GroupedTurns` and a group estimator and return one advantage per
turn: ``turn_level_advantages``, ``per_turn_index_advantages`` (MT-GRPO), ``gigpo_advantages``,
``broadcast_advantages``. The registry that names them, and rLLM's list API, are the
rLLM surface (:mod:`rllm_torch.rllm`).
"""

from rllm_torch.core.estimators.gae import gae
from rllm_torch.core.estimators.gdpo import gdpo
from rllm_torch.core.estimators.gpg import gpg
from rllm_torch.core.estimators.grpo import grpo
from rllm_torch.core.estimators.grpo_passk import grpo_passk
from rllm_torch.core.estimators.maxrl import maxrl
from rllm_torch.core.estimators.opo import opo
from rllm_torch.core.estimators.optimal_token_baseline import optimal_token_baseline
from rllm_torch.core.estimators.pass_at_k import pass_at_k, pass_at_k_rewards
from rllm_torch.core.estimators.prpo import prpo
from rllm_torch.core.estimators.reinforce import reinforce, reinforce_plus_plus, reinforce_plus_plus_baseline
from rllm_torch.core.estimators.remax import remax
from rllm_torch.core.estimators.rloo import rloo
from rllm_torch.core.estimators.turns import (
    broadcast_advantages,
    gigpo_advantages,
    per_turn_index_advantages,
    turn_level_advantages,
)

__all__ = [
    "grpo",
    "rloo",
    "reinforce",
    "reinforce_plus_plus_baseline",
    "prpo",
    "opo",
    "pass_at_k",
    "pass_at_k_rewards",
    "grpo_passk",
    "gpg",
    "gdpo",
    "maxrl",
    "remax",
    "reinforce_plus_plus",
    "gae",
    "optimal_token_baseline",
    "turn_level_advantages",
    "per_turn_index_advantages",
    "gigpo_advantages",
    "broadcast_advantages",
]
