"""Credit to the turn: the schemes that give each turn of a multi-turn trajectory its own
advantage, on :class:`~rllm_torch.core.turns.GroupedTurns`. Each takes any group estimator
``estimator(GroupedRewards) -> (advantages, returns)`` (``rloo``, ``grpo``, a registered one) and
runs it on a regrouping of the turns, so every scheme inherits the estimator's numerics,
singleton rules and cross-rank statistics.

* :func:`turn_level_advantages`: the return-to-go ``G_{i,t} = sum_{k >= t} gamma^(k-t) r_{i,k}``
  of each turn, grouped by (group, turn): the baseline of turn ``t`` is computed over the
  members of the group *still running at turn t*. Unbiased (derivation in its docstring).
* :func:`per_turn_index_advantages`: MT-GRPO's scheme: each turn's *reward* normalised among
  the same turn index, then summed over the trajectory's own remaining turns. Biased when turn
  counts vary; here to be compared against, with its name.
* :func:`gigpo_advantages`: GiGPO's episode advantage plus ``step_advantage_w`` times a step
  advantage of the return among the group's turns with the same observation (anchor state).
* :func:`broadcast_advantages`: the trajectory's advantage on every turn (rLLM's ``broadcast``),
  optionally divided by its number of turns (rLLM's ``normalize_by_steps``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable

import torch
from torch import Tensor

from rllm_torch.core.errors import InvalidRewardsError, InvalidRewardTypeError
from rllm_torch.core.packing import GroupedRewards
from rllm_torch.core.turns import GroupedTurns

__all__ = [
    "TurnEstimator",
    "turn_level_advantages",
    "per_turn_index_advantages",
    "gigpo_advantages",
    "broadcast_advantages",
]

TurnEstimator = Callable[[GroupedRewards], tuple[Tensor, Tensor]]
"""A group estimator: ``estimator(batch) -> (advantages [N], returns [N])`` (e.g. ``rloo``)."""


def _check_estimator(estimator: object) -> None:
    if not callable(estimator):
        raise InvalidRewardTypeError(
            f"estimator must be a callable group estimator, estimator(GroupedRewards) -> (advantages, returns), such as "
            f"rllm_torch.rloo, got {estimator!r}; for a registered name use lambda b: compute_advantages(b, name)."
        )


def _discount(gamma: object) -> float:
    if isinstance(gamma, bool) or not isinstance(gamma, numbers.Real) or not 0 <= gamma <= 1:
        raise InvalidRewardsError(
            f"the turn discount gamma must be a number in [0, 1] (1: no discount), got {gamma!r}; set rllm.stepwise_advantage.gamma."
        )
    return float(gamma)


def turn_level_advantages(
    turns: GroupedTurns, estimator: TurnEstimator, *, gamma: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Turn-level advantages: the estimator on each turn's return-to-go, grouped by (group, turn).

    ``G_{i,t} = sum_{k >= t} gamma^(k-t) r_{i,k}`` over trajectory ``i``'s own turns; the
    estimator's baseline for turn ``t`` is taken over ``S_t``, the members of ``i``'s group that
    reached turn ``t``: ``rloo`` gives ``A_{i,t} = G_{i,t} - mean_{j in S_t, j != i} G_{j,t}``,
    ``grpo`` ``(G_{i,t} - mean_{S_t} G) / (std_{S_t} G + epsilon)``.

    **No bias, however the policy decides when to stop** (``rloo``, or ``reinforce``): the
    policy gradient of ``J = E[G_{i,0}]`` is ``E[sum_t grad log pi(a_{i,t} | h_{i,t}) G_{i,t}]``
    (actions after ``t`` do not change rewards before it), and any baseline ``b_{i,t}`` with
    ``E[grad log pi(a_{i,t} | h_{i,t}) b_{i,t} | h_{i,t}] = 0`` may be subtracted. The
    leave-one-out baseline is a function of the *other* members' episodes and of whether they
    reached ``t``; those are sampled independently of member ``i``, so given ``h_{i,t}`` it is
    independent of ``a_{i,t}`` and the term vanishes: ``E[grad log pi] = 0``. Member ``i``'s own
    stopping turn ``T_i`` enters nowhere but its own return, which is what the gradient should
    see. (A per-turn-index scheme subtracts ``sum_{k=t}^{T_i - 1} b_k``, whose number of terms
    is ``T_i``: the baseline then depends on actions at and after ``t``, and is biased;
    :func:`per_turn_index_advantages`.) With ``grpo`` the mean includes ``G_{i,t}`` itself, so
    without std each turn's gradient is scaled by ``(|S_t| - 1) / |S_t|`` (no stopping penalty),
    and the std, as in GRPO, rescales each (group, turn).

    **A turn no other member reached** (``|S_t| = 1``: late turns, once most of the group has
    stopped) has no one to compare with; a baseline of 0 there (``A = G``) would push up every
    action of a lone survivor that ends well. It takes its trajectory's episode advantage
    instead, the estimator on the group's episode returns (rLLM's ``broadcast``): with ``rloo``
    and ``gamma = 1`` that is ``G_{i,t} - (mean_{j != i} R_j - R_{i,<t})``, a baseline made of
    the other members' returns and ``i``'s own rewards before ``t``, so still unbiased (with
    ``gamma < 1`` it is the undiscounted episode's advantage). A group of one trajectory thus
    gets the estimator's singleton rule on every turn (``rloo``: ``A = R``).
    ``gamma = 0`` gives each turn its own reward's advantage. Split groups across ranks: ``S_t``
    is over every rank.

    Args:
        turns: the packed turns.
        estimator: a group estimator (e.g. :func:`~rllm_torch.core.estimators.rloo`, or
            ``functools.partial(grpo, norm_adv_by_std_in_grpo=False)``).
        gamma: the discount per turn, in ``[0, 1]``.

    Returns:
        ``(advantages [M], returns [M])``, the returns being ``G``; dtype of the estimator's output.

    Raises:
        InvalidRewardsError: ``gamma`` outside ``[0, 1]``; what the estimator raises.

    Source: the return-to-go and baseline of Williams (1992) and Sutton et al. (2000), with the
    leave-one-out baseline of RLOO (Kool et al., 2019) taken per turn among the group's running
    members; the bias of the per-turn-index alternative is the subject of verl RFC #7244.
    """
    _check_estimator(estimator)
    returns_M = turns.returns(_discount(gamma))
    cells = turns.by_turn(returns_M)
    advantages_M, _ = estimator(cells)
    alone = cells.layout.singletons()  # (group, turn) cells of one member, over every rank
    if isinstance(alone, bool) and not alone:
        return advantages_M, returns_M
    episode_N, _ = estimator(turns.by_trajectory(turns.episode_returns()))
    episode_M = episode_N[turns.trajectory_index].to(advantages_M.dtype)
    alone_M = alone if isinstance(alone, bool) else cells.layout.expand(alone.reshape(-1)).reshape(-1)
    return torch.where(alone_M, episode_M, advantages_M), returns_M


def per_turn_index_advantages(
    turns: GroupedTurns, estimator: TurnEstimator, *, gamma: float = 1.0
) -> tuple[Tensor, Tensor]:
    """MT-GRPO's per-turn-index scheme (biased when turn counts vary): the estimator on each
    turn's *reward* grouped by (group, turn index), then ``A_{i,t} = sum_{k >= t} gamma^(k-t)
    Â_{i,k}`` over the trajectory's own turns.

    The sum runs to the trajectory's last turn ``T_i - 1``, so the baseline it subtracts,
    ``sum_{k=t}^{T_i - 1} gamma^(k-t) b_k``, has as many terms as turns the policy chose to
    take after ``t``: a hidden reward (or penalty, by the sign of the ``b_k``) on every decision
    to go on. Measured against the exact gradient in ``tests/core/test_turn_bias.py``.

    Returns:
        ``(advantages [M], returns [M])``, the returns being the discounted return-to-go.

    Source: Zeng et al., "Reinforcing Multi-Turn Reasoning in LLM Agents via Turn-Level Credit
    Assignment" (MT-GRPO, arXiv:2505.11821), generalised from two turns; verl RFC #7244.
    """
    _check_estimator(estimator)
    gamma = _discount(gamma)
    turn_advantages_M, _ = estimator(turns.by_turn(turns._working(turns.rewards)))
    return turns.returns(gamma, turn_advantages_M), turns.returns(gamma)


def gigpo_advantages(
    turns: GroupedTurns,
    estimator: TurnEstimator,
    *,
    gamma: float = 1.0,
    step_advantage_w: float = 1.0,
    episode_scores: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """GiGPO: ``A_{i,t} = A^E_i + step_advantage_w * A^S_{i,t}``.

    ``A^E`` is the estimator on the episode scores (``episode_scores [N]``, default each
    trajectory's summed turn rewards) grouped by group; ``A^S`` the estimator on the turn's
    return-to-go ``G_{i,t}`` grouped by (group, observation): the group's turns, at any turn
    index, that saw the same state. A state seen once is a group of one (``grpo``: ``A^S = G``,
    as verl-agent).

    Raises:
        InvalidGroupIndexError: the turns have no ``observation_index``.
        InvalidRewardsError: ``gamma`` outside ``[0, 1]``, ``step_advantage_w`` not a finite number.

    Source: Feng et al., "Group-in-Group Policy Optimization for LLM Agent Training"
    (arXiv:2505.10978); verl-agent ``algorithm.gigpo.step_advantage_w`` and ``mode``
    (``mean_norm``: ``grpo`` without std; ``mean_std_norm``: with); ROLL ``gigpo``.
    """
    _check_estimator(estimator)
    gamma = _discount(gamma)
    if (
        isinstance(step_advantage_w, bool)
        or not isinstance(step_advantage_w, numbers.Real)
        or not math.isfinite(step_advantage_w)
    ):
        raise InvalidRewardsError(
            f"step_advantage_w must be a finite number, got {step_advantage_w!r}; set rllm.stepwise_advantage.step_advantage_w."
        )
    step_groups = turns.by_observation(turns.returns(gamma))  # before the episode call: its error first
    scores_N = turns.episode_returns() if episode_scores is None else episode_scores
    episode_N, _ = estimator(turns.by_trajectory(scores_N))
    step_M, _ = estimator(step_groups)
    advantages_M = episode_N[turns.trajectory_index].to(step_M.dtype) + step_advantage_w * step_M
    return advantages_M, step_groups.rewards


def broadcast_advantages(
    turns: GroupedTurns,
    estimator: TurnEstimator,
    *,
    normalize_by_steps: bool = False,
    episode_scores: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """rLLM's ``broadcast``: the estimator on the episode scores (default: the summed turn
    rewards), each trajectory's advantage on every one of its turns; with ``normalize_by_steps``
    divided by its number of turns (rLLM's ``rllm.stepwise_advantage.normalize_by_steps``).

    Returns:
        ``(advantages [M], returns [M])``, the returns being the trajectory's score on each turn.

    Source: rLLM ``rllm/experimental/common/advantage.py`` (broadcast) and its
    ``normalize_by_steps`` in the workflow trainer.
    """
    _check_estimator(estimator)
    if not isinstance(normalize_by_steps, bool):
        raise InvalidRewardTypeError(f"normalize_by_steps must be a bool, got {normalize_by_steps!r}.")
    scores_N = turns.episode_returns() if episode_scores is None else episode_scores
    advantages_N, _ = estimator(turns.by_trajectory(scores_N))
    advantages_M = advantages_N[turns.trajectory_index]
    if normalize_by_steps:
        advantages_M = advantages_M / turns.turn_counts[turns.trajectory_index].to(advantages_M.dtype)
    return advantages_M, scores_N[turns.trajectory_index]
