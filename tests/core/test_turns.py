"""Turn-level schemes (:mod:`rllm_torch.core.turns`): a hand-computed case, a plain per-group
loop reference on random ragged batches (every scheme, rloo and grpo, several discounts), the
edge cases the docstrings define, bad input, and 2 gloo ranks (split groups) against one process."""

from __future__ import annotations

import functools
import math
import random

import pytest
import rank_tasks
import torch
from rank_pool import RankPool

from rllm_torch.core.errors import InvalidGroupIndexError, InvalidRewardsError
from rllm_torch.core.estimators import grpo, rloo
from rllm_torch.core.estimators.turns import (
    broadcast_advantages,
    gigpo_advantages,
    per_turn_index_advantages,
    turn_level_advantages,
)
from rllm_torch.core.turns import GroupedTurns

SCHEMES = {
    "turn_level": turn_level_advantages,
    "mt_grpo": per_turn_index_advantages,
    "gigpo": gigpo_advantages,
    "broadcast": broadcast_advantages,
}


def pack(episodes: list[list[list[float]]], observations=None, **kwargs) -> GroupedTurns:
    """Groups of trajectories of turn rewards -> GroupedTurns (turns listed trajectory-major)."""
    rewards, traj, group = [], [], []
    for g, members in enumerate(episodes):
        for turn_rewards in members:
            rewards += turn_rewards
            traj += [len(group)] * len(turn_rewards)
            group.append(g)
    obs = None if observations is None else torch.tensor(observations)
    return GroupedTurns.from_flat(
        torch.tensor(rewards, dtype=torch.float64),
        torch.tensor(traj),
        torch.tensor(group),
        num_groups=len(episodes),
        observation_index=obs,
        **kwargs,
    )


# --- a plain reference: loops over groups, trajectories and turns, in Python floats -------------
def ref_rloo(values):
    n = len(values)
    return [v - (sum(values) - v) / (n - 1) if n > 1 else v for v in values]


def ref_grpo(values, std=True, eps=1e-6):
    n = len(values)
    mean = sum(values) / n if n > 1 else 0.0
    sd = math.sqrt(sum((v - sum(values) / n) ** 2 for v in values) / n) if n > 1 else 1.0
    return [(v - mean) / (sd + eps) if std else v - mean for v in values]


def ref_groupwise(values, keys, fn):
    out = [None] * len(values)
    for key in dict.fromkeys(keys):
        idx = [i for i, k in enumerate(keys) if k == key]
        for i, a in zip(idx, fn([values[i] for i in idx]), strict=True):
            out[i] = a
    return out


def reference(episodes, observations, scheme, fn, gamma, w=1.0):
    """Per-turn advantages in trajectory-major turn order."""
    flat, keys_turn, keys_obs, traj_of, episode = [], [], [], [], []
    t_id = 0
    for g, members in enumerate(episodes):
        for rewards in members:
            returns = [sum(gamma ** (k - t) * rewards[k] for k in range(t, len(rewards))) for t in range(len(rewards))]
            flat += [(r, G) for r, G in zip(rewards, returns, strict=True)]
            keys_turn += [(g, t) for t in range(len(rewards))]
            traj_of += [t_id] * len(rewards)
            episode.append((g, sum(rewards)))
            t_id += 1
    keys_obs = [(keys_turn[i][0], observations[i]) for i in range(len(flat))] if observations else None
    G = [f[1] for f in flat]
    ep_adv = ref_groupwise([e[1] for e in episode], [e[0] for e in episode], fn)
    if scheme == "turn_level":  # a turn no other member of its group reached: the episode's advantage
        cell = ref_groupwise(G, keys_turn, fn)
        return [ep_adv[traj_of[i]] if keys_turn.count(keys_turn[i]) == 1 else cell[i] for i in range(len(flat))]
    if scheme == "broadcast":
        return [ep_adv[traj_of[i]] for i in range(len(flat))]
    if scheme == "gigpo":
        step = ref_groupwise(G, keys_obs, fn)
        return [ep_adv[traj_of[i]] + w * step[i] for i in range(len(flat))]
    per_index = ref_groupwise([f[0] for f in flat], keys_turn, fn)  # mt_grpo: then sums to go
    out = []
    for i in range(len(flat)):
        same = [j for j in range(i, len(flat)) if traj_of[j] == traj_of[i]]
        out.append(sum(gamma ** (j - i) * per_index[j] for j in same))
    return out


def random_episodes(seed):
    rng = random.Random(seed)
    episodes, observations = [], []
    for _ in range(rng.randint(1, 6)):
        members = []
        for _ in range(rng.randint(1, 5)):
            turns = rng.randint(1, 5)
            members.append([rng.choice([0.0, 1.0, -0.25, rng.uniform(-2, 2)]) for _ in range(turns)])
            observations += [rng.randint(0, 3) for _ in range(turns)]  # repeated states, across turn indices
        episodes.append(members)
    return episodes, observations


ESTIMATORS = {
    "rloo": (rloo, ref_rloo),
    "grpo": (grpo, ref_grpo),
    "grpo_no_std": (functools.partial(grpo, norm_adv_by_std_in_grpo=False), functools.partial(ref_grpo, std=False)),
}


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("gamma", [1.0, 0.7, 0.0])
def test_every_scheme_matches_a_per_group_loop(scheme, estimator, gamma):
    fn, ref_fn = ESTIMATORS[estimator]
    options = {} if scheme == "broadcast" else {"gamma": gamma}
    if scheme == "broadcast" and gamma != 1.0:
        pytest.skip("broadcast has no discount")
    for seed in range(25):
        episodes, observations = random_episodes(seed)
        got, _ = SCHEMES[scheme](pack(episodes, observations), fn, **options)
        want = reference(episodes, observations, scheme, ref_fn, gamma)
        torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-9, atol=1e-9)


def test_hand_computed_case():
    # group of 3: turn rewards (0.5, 0.5) / (0.0) / (0.5, 0.5, 0.5); returns (1, .5) / (0) / (1.5, 1, .5)
    turns = pack([[[0.5, 0.5], [0.0], [0.5, 0.5, 0.5]]], observations=[0, 1, 1, 0, 0, 2])
    adv, returns = turn_level_advantages(turns, rloo)
    # turn 0: all three; turn 1: two; turn 2: member 3 alone, so its episode advantage (rloo of
    # the returns 1, 0, 1.5): 1.5 - 0.5 = 1.0 = G - (mean of the others' returns - its own past 1.0)
    assert adv.tolist() == [0.25, -0.5, -1.25, 1.0, 0.5, 1.0]
    assert returns.tolist() == [1.0, 0.5, 0.0, 1.5, 1.0, 0.5]
    adv, _ = per_turn_index_advantages(turns, rloo)  # per index: (.25, -.5, .25), (0, 0), (.5); then sums to go
    assert adv.tolist() == [0.25, 0.0, -0.5, 0.75, 0.5, 0.5]
    adv, _ = turn_level_advantages(turns, rloo, gamma=0.5)  # returns (.75, .5) / (0) / (.875, .75, .5)
    torch.testing.assert_close(adv, torch.tensor([0.3125, -0.25, -0.8125, 0.5, 0.25, 1.0], dtype=torch.float64))
    # gigpo: state 0 = member 1's turn 0 and member 3's turns 0 and 1 (G = 1, 1.5, 1); state 1 =
    # member 1's turn 1 and member 2's turn 0 (G = .5, 0); state 2 = member 3's last turn alone
    adv, _ = gigpo_advantages(turns, rloo, step_advantage_w=0.5)
    episode = [0.25, 0.25, -1.25, 1.0, 1.0, 1.0]  # rloo of (1, 0, 1.5), on every turn
    step = [-0.25, 0.5, -0.5, 0.5, -0.25, 0.5]
    torch.testing.assert_close(
        adv, torch.tensor([e + 0.5 * s for e, s in zip(episode, step, strict=True)], dtype=torch.float64)
    )
    adv, _ = broadcast_advantages(turns, rloo, normalize_by_steps=True)
    torch.testing.assert_close(adv, torch.tensor([0.125, 0.125, -1.25, 1 / 3, 1 / 3, 1 / 3], dtype=torch.float64))


def test_turns_listed_in_any_trajectory_order():
    # the same batch with the trajectories' turns interleaved: turn order within each is kept
    turns = GroupedTurns.from_flat(
        torch.tensor([0.5, 0.5, 0.0, 0.5, 0.5, 0.5], dtype=torch.float64),
        torch.tensor([0, 2, 1, 0, 2, 2]),
        torch.tensor([0, 0, 0]),
        num_groups=1,
    )
    assert turns.turn_index.tolist() == [0, 0, 0, 1, 1, 2]
    adv, _ = turn_level_advantages(turns, rloo)
    assert adv.tolist() == [0.25, 1.0, -1.25, -0.5, 0.5, 1.0]


def test_groups_of_one_and_constant_turns():
    turns = pack([[[1.0, 2.0]], [[1.0], [1.0]]])
    adv, _ = turn_level_advantages(turns, rloo)
    assert adv.tolist() == [3.0, 3.0, 0.0, 0.0]  # a group of one: its episode's advantage, R; equal returns: 0
    adv, _ = turn_level_advantages(turns, grpo)
    torch.testing.assert_close(adv, torch.tensor([3.0, 3.0, 0.0, 0.0], dtype=torch.float64) / (1 + 1e-6))


@pytest.mark.parametrize("gamma", [-0.1, 1.5, float("nan"), True, "1"])
def test_a_discount_outside_0_1_names_the_setting(gamma):
    with pytest.raises(InvalidRewardsError, match=r"rllm\.stepwise_advantage\.gamma"):
        turn_level_advantages(pack([[[1.0]]]), rloo, gamma=gamma)


def test_bad_input_is_refused():
    with pytest.raises(InvalidGroupIndexError, match="observation_index"):
        gigpo_advantages(pack([[[1.0], [0.0]]]), rloo)
    with pytest.raises(InvalidRewardsError, match="step_advantage_w"):
        gigpo_advantages(pack([[[1.0], [0.0]]], observations=[0, 0]), rloo, step_advantage_w=float("inf"))
    r = torch.tensor([1.0, 0.0])
    with pytest.raises(InvalidGroupIndexError, match=r"trajectory_index holds 2"):
        GroupedTurns.from_flat(r, torch.tensor([0, 2]), torch.tensor([0, 0]), num_groups=1)
    with pytest.raises(InvalidGroupIndexError, match=r"shape \(2,\)"):
        GroupedTurns.from_flat(r, torch.tensor([0]), torch.tensor([0]), num_groups=1)
    with pytest.raises(InvalidGroupIndexError, match=r"group_index holds 1"):
        GroupedTurns.from_flat(r, torch.tensor([0, 0]), torch.tensor([1]), num_groups=1)
    with pytest.raises(InvalidRewardsError, match="finite and >= 0"):
        GroupedTurns.from_flat(r, torch.tensor([0, 0]), torch.tensor([0]), num_groups=1, weights=-r)


@pytest.fixture(scope="module")
def pool():
    ranks = RankPool(2)
    yield ranks
    ranks.close()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_split_groups_on_two_ranks_equal_one_process(pool, scheme):
    episodes, observations = random_episodes(7)
    want, _ = SCHEMES[scheme](pack(episodes, observations), rloo)
    # trajectories alternate between the ranks, so groups and turn indices are split
    rewards, traj, group, obs, owner, per_rank_traj = [], [], [], [], [], [0, 0]
    position = 0
    for g, members in enumerate(episodes):
        for m, turn_rewards in enumerate(members):
            rank = (g + m) % 2
            rewards += turn_rewards
            traj += [per_rank_traj[rank]] * len(turn_rewards)
            obs += observations[position : position + len(turn_rewards)]
            owner += [rank] * len(turn_rewards)
            group.append((rank, g))
            per_rank_traj[rank] += 1
            position += len(turn_rewards)
    specs = []
    for r in range(2):
        mine = [i for i, o in enumerate(owner) if o == r]
        specs.append(
            dict(
                rewards=[rewards[i] for i in mine],
                traj=[traj[i] for i in mine],
                group=[g for rank, g in group if rank == r],
                obs=[obs[i] for i in mine],
                num_groups=len(episodes),
            )
        )
    got = pool.run_ok(rank_tasks.turn_scheme, [(s, scheme) for s in specs])
    for r in range(2):
        mine = [i for i, o in enumerate(owner) if o == r]
        torch.testing.assert_close(torch.tensor(got[r], dtype=torch.float64), want[mine], rtol=1e-9, atol=1e-9)


def test_an_input_error_on_one_rank_is_raised_on_every_rank(pool):
    good = dict(rewards=[1.0], traj=[0], group=[0], obs=[0], num_groups=1)
    bad = dict(good, traj=[3])
    results = pool.run(rank_tasks.turn_scheme, [(good, "turn_level"), (bad, "turn_level")])
    assert [r.type_name for r in results] == ["InvalidGroupIndexError"] * 2
    assert "rank 1 of 2" in results[0].message


def test_the_readme_example():
    rewards = torch.tensor([0.0, 1.0, 0.0, -0.1, -0.1, 1.0])  # the turns of 3 trajectories, in order
    turns = GroupedTurns.from_flat(rewards, torch.tensor([0, 0, 1, 2, 2, 2]), torch.tensor([0, 0, 0]), num_groups=1)
    advantages, returns = turn_level_advantages(turns, rloo, gamma=1.0)
    torch.testing.assert_close(returns, torch.tensor([1.0, 1.0, 0.0, 0.8, 0.9, 1.0]))
    torch.testing.assert_close(advantages, torch.tensor([0.6, 0.1, -0.9, 0.3, -0.1, 0.3]))  # turn 2 alone: 0.8 - 0.5


def test_core_arguments_of_the_wrong_kind():
    from rllm_torch.core.errors import InvalidRewardTypeError

    turns = pack([[[1.0], [0.0]]], observations=[0, 0])
    with pytest.raises(InvalidRewardTypeError, match="callable group estimator"):
        turn_level_advantages(turns, "rloo")
    with pytest.raises(InvalidRewardTypeError, match="normalize_by_steps must be a bool"):
        broadcast_advantages(turns, rloo, normalize_by_steps="no")
    with pytest.raises(InvalidRewardsError, match="finite"):
        pack([[[1.0], [0.0]]], weights=torch.tensor([1.0, float("inf")], dtype=torch.float64))
    import numpy as np

    adv, _ = turn_level_advantages(turns, rloo, gamma=np.float32(0.5))  # any real number
    assert adv.tolist() == [1.0, -1.0]


def test_sparse_observation_ids_cost_no_memory_on_one_process():
    turns = pack([[[1.0], [0.0]]], observations=[10**12, 10**12])
    adv, _ = gigpo_advantages(turns, rloo)
    assert adv.tolist() == [2.0, -2.0]
