"""A tabular multi-turn episode whose policy gradient is known in closed form: the policy decides
when to stop.

At turn ``t < K - 1`` the policy continues with probability ``sigmoid(theta_t)`` (reward
``-cost[t]``) or stops (reward ``payoff[t]``); at turn ``K - 1`` it stops. The exact
``J(theta) = E[sum of rewards]`` sums over the ``K`` stopping turns, so ``grad J`` comes from
autograd in float64. :func:`sample_groups` draws ``B`` groups of ``n`` episodes (vectorised) and
:func:`mean_gradient` turns a scheme's per-turn advantages into the mean and standard error of
the per-group gradient estimate ``(1/n) sum_i sum_t A_{i,t} grad log pi(a_{i,t})``.
"""

from __future__ import annotations

import torch

from rllm_torch.core.turns import GroupedTurns

THETA = torch.tensor([0.4, -0.3], dtype=torch.float64)  # logits of "continue" at turns 0 and 1
COST = torch.tensor([0.25, 0.25], dtype=torch.float64)  # reward of continuing at turn t
PAYOFF = torch.tensor([0.0, 0.6, 1.2], dtype=torch.float64)  # reward of stopping at turn t


def exact_gradient(theta: torch.Tensor = THETA) -> torch.Tensor:
    """``grad J`` at ``theta``, exact (float64 autograd over the stopping turns)."""
    theta = theta.clone().requires_grad_(True)
    go = torch.sigmoid(theta)
    objective, reach, spent = 0.0, 1.0, 0.0
    for t in range(len(PAYOFF)):
        stop = 1 - go[t] if t < len(go) else 1.0
        objective = objective + reach * stop * (spent + PAYOFF[t])
        if t < len(go):
            reach, spent = reach * go[t], spent - COST[t]
    (grad,) = torch.autograd.grad(objective, theta)
    return grad


def sample_groups(num_groups: int, group_size: int, seed: int) -> tuple[GroupedTurns, torch.Tensor]:
    """``(turns, score_MP)``: the sampled episodes' turns and ``grad log pi`` of each turn's
    action with respect to each logit ``[M, P]`` (0 at the forced last turn)."""
    gen = torch.Generator().manual_seed(seed)
    num_episodes, max_turns = num_groups * group_size, len(PAYOFF)
    go = torch.sigmoid(THETA)
    cont_NT = torch.rand(num_episodes, max_turns - 1, generator=gen, dtype=torch.float64) < go
    # the episode stops at its first "stop" (or at the last turn): it has stop + 1 turns
    stop_N = torch.where(~cont_NT, torch.arange(max_turns - 1), max_turns - 1).amin(-1)
    turn_NT = torch.arange(max_turns).expand(num_episodes, max_turns)
    alive_NT = turn_NT <= stop_N[:, None]
    last_NT = turn_NT == stop_N[:, None]
    reward_NT = torch.where(last_NT, PAYOFF, -torch.cat([COST, COST.new_zeros(1)]))
    score_NTP = torch.zeros(num_episodes, max_turns, len(THETA), dtype=torch.float64)
    for t in range(max_turns - 1):  # d/dtheta_t log pi(a_t): 1 - p if continued, -p if stopped
        score_NTP[:, t, t] = torch.where(last_NT[:, t], -go[t], 1 - go[t])
    traj_NT = torch.arange(num_episodes)[:, None].expand(-1, max_turns)
    turns = GroupedTurns.from_flat(
        reward_NT[alive_NT],
        traj_NT[alive_NT],
        torch.arange(num_episodes) // group_size,
        num_groups=num_groups,
        observation_index=turn_NT[alive_NT],  # the state is the turn: every running member sees it
    )
    return turns, score_NTP[alive_NT]


def mean_gradient(turns: GroupedTurns, advantages_M: torch.Tensor, score_MP: torch.Tensor, group_size: int):
    """``(mean [P], standard error [P])`` of the per-group gradient estimates."""
    per_turn_MP = advantages_M.double()[:, None] * score_MP
    group_M = turns.group_index[turns.trajectory_index]
    per_group_GP = torch.zeros(turns.num_groups, score_MP.shape[1], dtype=torch.float64).index_add_(
        0, group_M, per_turn_MP
    )
    per_group_GP /= group_size
    return per_group_GP.mean(0), per_group_GP.std(0) / turns.num_groups**0.5
