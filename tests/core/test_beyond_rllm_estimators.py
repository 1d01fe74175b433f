"""OPO, pass@k (PKPO), token-level REINFORCE++ and GAE: hand-computed tables, property tests
against plain float64 loops (per group, per row), a brute-force enumeration of k-subsets, the
registry's option handling, compiled graphs and bad input."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rllm_torch import (
    GroupedRewards,
    TokenRewards,
    compute_advantages,
    gae,
    opo,
    pass_at_k,
    pass_at_k_rewards,
    reinforce_plus_plus,
)
from rllm_torch.core.errors import ConfigError, InvalidRewardsError, InvalidRewardTypeError
from rllm_torch.core.tokens import discounted_returns

settings.register_profile("estimators", max_examples=60, deadline=None)

# ---- plain float64 references ----------------------------------------------------------------


def opo_reference(groups, weights):
    out = []
    for r, w in zip(groups, weights, strict=True):
        r, w = np.asarray(r, np.float64), np.asarray(w, np.float64)
        if len(r) <= 1:
            out.append(r.copy())
            continue
        baseline = (w * r).sum() / w.sum() if w.sum() > 0 else r.mean()
        out.append(r - baseline)
    return out


def pass_at_k_brute_force(group, k):
    """``r~_i``: the mean over every k-subset containing ``i`` of whether the subset passes."""
    n = len(group)
    out = []
    for i in range(n):
        others = [j for j in range(n) if j != i]
        passes = [max([group[i], *(group[j] for j in rest)]) for rest in itertools.combinations(others, k - 1)]
        out.append(sum(passes) / len(passes))
    return np.array(out, np.float64)


def row_returns_reference(rewards, mask, gamma):
    """Per row, from the end: ``G = r + gamma G`` at trained tokens; untrained tokens carry G."""
    out = np.zeros_like(rewards, dtype=np.float64)
    for b in range(rewards.shape[0]):
        running = 0.0
        for t in reversed(range(rewards.shape[1])):
            if mask[b, t]:
                running = rewards[b, t] + gamma * running
                out[b, t] = running
    return out


def row_gae_reference(rewards, values, mask, gamma, lam):
    adv = np.zeros_like(rewards, dtype=np.float64)
    for b in range(rewards.shape[0]):
        next_value, running = 0.0, 0.0
        for t in reversed(range(rewards.shape[1])):
            if mask[b, t]:
                delta = rewards[b, t] + gamma * next_value - values[b, t]
                running = delta + gamma * lam * running
                adv[b, t], next_value = running, values[b, t]
    return adv, (adv + values) * mask


def whiten_reference(x, mask, epsilon=1e-6):
    trained = x[mask > 0]
    if trained.size == 0:
        return np.zeros_like(x)
    return (x - trained.mean()) / (trained.std() + epsilon) * mask


# ---- OPO --------------------------------------------------------------------------------------


def test_opo_hand_table():
    rewards = GroupedRewards.from_groups(
        [[1.0, 0.0], [2.0], [0.5, 0.5, 0.5], [1.0, 0.0]], weights=[[3, 1], [7], [1, 5, 2], [0, 0]]
    )
    adv, ret = opo(rewards)
    # b = (3 * 1 + 1 * 0) / 4; a group of one: baseline 0; constant: 0; weights summing to 0: plain mean
    torch.testing.assert_close(adv, torch.tensor([0.25, -0.75, 2.0, 0.0, 0.0, 0.0, 0.5, -0.5], dtype=torch.float64))
    assert torch.equal(adv, ret) and torch.equal(adv[3:6], torch.zeros(3, dtype=torch.float64))
    empty, _ = opo(GroupedRewards.from_flat(torch.zeros(0), torch.zeros(0, dtype=torch.long), weights=torch.zeros(0)))
    assert empty.shape == (0,)


def test_opo_with_equal_lengths_is_the_plain_group_mean_baseline():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 2.0]])
    adv, _ = opo(GroupedRewards.from_padded(rewards, weights=torch.full((2, 4), 5.0)))
    dr_grpo, _ = compute_advantages(GroupedRewards.from_padded(rewards), "grpo", norm_adv_by_std_in_grpo=False)
    torch.testing.assert_close(adv, dr_grpo)


@st.composite
def weighted_groups(draw):
    groups = draw(st.lists(st.lists(st.floats(-100, 100), min_size=1, max_size=7), min_size=1, max_size=6))
    weights = [draw(st.lists(st.integers(1, 64), min_size=len(g), max_size=len(g))) for g in groups]
    return groups, weights


@settings(settings.get_profile("estimators"))
@given(data=weighted_groups(), kind=st.sampled_from(["groups", "flat"]))
def test_opo_matches_a_float64_loop(data, kind):
    groups, weights = data
    want = np.concatenate(opo_reference(groups, weights))
    if kind == "groups":
        batch, order = GroupedRewards.from_groups(groups, weights=weights), np.arange(len(want))
    else:  # shuffled flat order
        index = [g for g, group in enumerate(groups) for _ in group]
        order = np.random.default_rng(len(index)).permutation(len(index))
        rewards = torch.tensor([r for group in groups for r in group], dtype=torch.float64)[order]
        lengths = torch.tensor([w for ws in weights for w in ws], dtype=torch.float64)[order]
        batch = GroupedRewards.from_flat(rewards, torch.tensor(index)[order], weights=lengths)
    adv, _ = compute_advantages(batch, "opo")
    np.testing.assert_allclose(adv.numpy(), want[order], rtol=1e-9, atol=1e-9)


def test_opo_float32_keeps_precision_under_a_large_offset_and_constant_groups_are_exactly_zero():
    rewards = torch.tensor([[1e4, 1e4 + 0.01, 1e4 + 0.02], [1e4 + 0.5] * 3], dtype=torch.float32)
    weights = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    adv, _ = opo(GroupedRewards.from_padded(rewards, weights=weights))
    want = opo_reference(rewards.double().tolist(), weights.tolist())
    np.testing.assert_allclose(adv[:3].double().numpy(), want[0], atol=1e-3)  # a float32 ulp at 1e4
    assert torch.equal(adv[3:], torch.zeros(3))


def test_opo_without_weights_says_how_to_give_them():
    with pytest.raises(InvalidRewardsError, match="weights=lengths"):
        opo(GroupedRewards.from_groups([[1.0, 0.0]]))


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: GroupedRewards.from_groups([[1.0, 0.0]], weights=[[1.0]]), "weights"),
        (lambda: GroupedRewards.from_padded(torch.ones(2, 2), weights=torch.ones(2, 3)), "weights"),
        (lambda: GroupedRewards.from_padded(torch.ones(2, 2), weights=-torch.ones(2, 2)), "weights"),
        (
            lambda: GroupedRewards.from_flat(
                torch.ones(2), torch.zeros(2, dtype=torch.long), weights=torch.tensor([1.0, float("nan")])
            ),
            "weights",
        ),
    ],
)
def test_bad_weights_are_typed_errors(build, message):
    with pytest.raises((InvalidRewardsError, InvalidRewardTypeError), match=message):
        build()


# ---- pass@k -----------------------------------------------------------------------------------


def test_pass_at_k_hand_table():
    adv, _ = pass_at_k(GroupedRewards.from_groups([[1, 0, 0, 0], [1, 1, 1], [0, 0], [1]]), k=1)
    torch.testing.assert_close(adv, torch.tensor([0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0, 0, 1.0]))
    adv, _ = pass_at_k(GroupedRewards.from_groups([[1, 0, 0, 0], [1, 1, 1], [0, 0]]), k=2)
    # r~ = [1, 1/3, 1/3, 1/3]: a wrong attempt's pair passes when its partner is the right one
    torch.testing.assert_close(adv, torch.tensor([0.5, -1 / 6, -1 / 6, -1 / 6, 0, 0, 0, 0, 0]))
    transformed = pass_at_k_rewards(GroupedRewards.from_groups([[True, False, False, False, False]]), k=5)
    torch.testing.assert_close(transformed, torch.ones(5))  # every 5-subset holds the right one


@pytest.mark.parametrize("n", range(1, 8))
def test_pass_at_k_equals_a_brute_force_enumeration_of_k_subsets(n):
    rng = np.random.default_rng(n)
    groups = [rng.integers(0, 2, size=n).tolist() for _ in range(6)] + [[1] + [0] * (n - 1)]
    batch = GroupedRewards.from_groups([[float(v) for v in g] for g in groups])
    for k in range(1, n + 1):
        got = pass_at_k_rewards(batch, k=k)
        want = np.concatenate([pass_at_k_brute_force(g, k) for g in groups])
        np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-6, atol=1e-7)
        adv, _ = compute_advantages(batch, "pass_at_k", k=k)
        centred = np.concatenate(
            [w - w.mean() if n > 1 else w for w in np.split(want, len(groups))]
        )  # singleton: baseline 0
        np.testing.assert_allclose(adv.double().numpy(), centred, atol=1e-6)


def test_pass_at_k_with_k_1_is_the_plain_group_mean_baseline():
    batch = GroupedRewards.from_groups([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0, 1.0]])
    adv, _ = compute_advantages(batch, "pass_at_k", k=1)
    dr_grpo, _ = compute_advantages(batch, "grpo", norm_adv_by_std_in_grpo=False)
    assert torch.equal(adv, dr_grpo)


def test_pass_at_k_on_large_groups_stays_finite_and_in_range():
    batch = GroupedRewards.from_padded(torch.tensor([[1.0] + [0.0] * 511]), validate=True)
    transformed = pass_at_k_rewards(batch, k=256)
    assert transformed[0] == 1.0 and 0 < transformed[1] < 1 and torch.isfinite(transformed).all()
    np.testing.assert_allclose(transformed[1].item(), 255 / 511, rtol=1e-6)  # C(510,255)/C(511,255) = 256/511


@pytest.mark.parametrize(
    "rewards, k, message",
    [
        ([[1.0, 0.0]], None, "k >= 1"),
        ([[1.0, 0.0]], 0, "k >= 1"),
        ([[1.0, 0.0]], True, "k >= 1"),
        ([[1.0, 0.0]], 2.0, "k >= 1"),
        ([[1.0, 0.0, 1.0], [1.0, 0.0]], 3, "group 1 has 2"),
        ([[1.0, 0.5]], 1, "binary"),
        ([[1.0, float("nan")]], 1, "binary"),
    ],
)
def test_pass_at_k_bad_input_names_the_problem(rewards, k, message):
    with pytest.raises(InvalidRewardsError, match=message):
        compute_advantages(GroupedRewards.from_groups(rewards), "pass_at_k", k=k)


# ---- token level: REINFORCE++ and GAE -----------------------------------------------------------


def test_reinforce_plus_plus_hand_table_with_padding_and_gamma_one_and_below():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 9.0], [0.0, 2.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])  # row 0: one padding token (its reward ignored)
    _, returns = reinforce_plus_plus(TokenRewards(rewards, mask), gamma=1.0)
    torch.testing.assert_close(returns, torch.tensor([[1.0, 1.0, 1.0, 0.0], [2.0, 2.0, 0.0, 0.0]]))
    adv, returns = reinforce_plus_plus(TokenRewards(rewards, mask), gamma=0.5)
    torch.testing.assert_close(returns, torch.tensor([[0.25, 0.5, 1.0, 0.0], [1.0, 2.0, 0.0, 0.0]]))
    trained = returns[mask > 0]
    want = (returns - trained.mean()) / (trained.std(correction=0) + 1e-6) * mask
    torch.testing.assert_close(adv, want)
    assert torch.equal(adv[mask == 0], torch.zeros(3))


def test_reinforce_plus_plus_edge_cases():
    empty_adv, empty_ret = reinforce_plus_plus(TokenRewards(torch.zeros(0, 5), torch.zeros(0, 5)), gamma=0.9)
    assert empty_adv.shape == empty_ret.shape == (0, 5)
    none_trained, _ = reinforce_plus_plus(TokenRewards(torch.ones(2, 3), torch.zeros(2, 3)))
    assert torch.equal(none_trained, torch.zeros(2, 3))
    equal_returns = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    constant, _ = reinforce_plus_plus(TokenRewards(equal_returns, torch.ones(2, 3)), gamma=1.0)
    assert torch.equal(constant, torch.zeros(2, 3))  # every return is 1: exactly 0, not 0/eps noise
    row_of_one, _ = reinforce_plus_plus(TokenRewards(torch.tensor([[3.0]]), torch.ones(1, 1)))
    assert torch.equal(row_of_one, torch.zeros(1, 1))


def verl_reinforce_plus_plus_reference(rewards, mask, gamma):
    """verl 0.9.1's ``compute_reinforce_plus_plus_outcome_advantage`` recurrence as a float64 loop
    over time: ``new = r_t + gamma * running``; the return is ``new`` on a trained token; an
    untrained token carries ``running`` through unchanged (its own reward is dropped); then
    ``masked_whiten``: sample variance, ``(x - mean) * rsqrt(var + 1e-8)``."""
    returns = np.zeros_like(rewards, dtype=np.float64)
    running = np.zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        new = rewards[:, t] + gamma * running
        returns[:, t] = new * mask[:, t]
        running = new * mask[:, t] + running * (1 - mask[:, t])
    trained = returns[mask > 0]
    adv = (returns - trained.mean()) / np.sqrt(trained.var(ddof=1) + 1e-8) * mask
    return adv, returns


def test_reinforce_plus_plus_carries_the_return_through_untrained_tokens_as_verl_does():
    """A multi-turn row with a tool output (untrained tokens) inside the response: the return
    passes through it undiscounted, in ours and in verl 0.9.1 alike (1e-6, with verl's sample
    variance and no epsilon)."""
    gen = torch.Generator().manual_seed(3)
    rewards = torch.randn(6, 12, generator=gen, dtype=torch.float64)
    mask = torch.ones(6, 12, dtype=torch.float64)
    mask[:, 4:7] = 0  # a tool's output in every row
    mask[2, 9:] = 0  # and padding
    for gamma in (1.0, 0.9):
        adv, returns = reinforce_plus_plus(TokenRewards(rewards, mask), gamma=gamma, epsilon=0.0, std_correction=1)
        want_adv, want_returns = verl_reinforce_plus_plus_reference(rewards.numpy(), mask.numpy(), gamma)
        np.testing.assert_allclose(returns.numpy(), want_returns, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(adv.numpy(), want_adv, rtol=1e-6, atol=1e-6)
        assert returns[0, 3] == pytest.approx(rewards[0, 3].item() + gamma * returns[0, 7].item())  # across the tool


@st.composite
def token_batches(draw):
    rows, width = draw(st.integers(0, 6)), draw(st.integers(1, 9))
    rewards = np.array(draw(st.lists(st.floats(-5, 5), min_size=rows * width, max_size=rows * width))).reshape(
        rows, width
    )
    mask = np.array(draw(st.lists(st.booleans(), min_size=rows * width, max_size=rows * width))).reshape(rows, width)
    values = np.array(draw(st.lists(st.floats(-3, 3), min_size=rows * width, max_size=rows * width))).reshape(
        rows, width
    )
    gamma = draw(st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0]))
    lam = draw(st.sampled_from([0.0, 0.8, 0.95, 1.0]))
    return rewards, mask.astype(np.float64), values, gamma, lam


@settings(settings.get_profile("estimators"))
@given(data=token_batches())
def test_token_level_estimators_match_a_per_row_float64_loop(data):
    rewards, mask, values, gamma, lam = data
    as_t = torch.from_numpy
    adv, returns = reinforce_plus_plus(TokenRewards(as_t(rewards), as_t(mask)), gamma=gamma)
    want_returns = row_returns_reference(rewards, mask, gamma)
    np.testing.assert_allclose(returns.numpy(), want_returns, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(adv.numpy(), whiten_reference(want_returns, mask), rtol=1e-6, atol=1e-6)
    batch = TokenRewards(as_t(rewards), as_t(mask), values=as_t(values))
    adv, returns = gae(batch, gamma=gamma, lam=lam, whiten=False)
    want_adv, want_ret = row_gae_reference(rewards, values, mask, gamma, lam)
    np.testing.assert_allclose(adv.numpy(), want_adv, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(returns.numpy(), want_ret, rtol=1e-9, atol=1e-9)
    whitened, _ = gae(batch, gamma=gamma, lam=lam)
    np.testing.assert_allclose(whitened.numpy(), whiten_reference(want_adv, mask), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("width", [63, 64, 65, 200, 1000])
def test_discounted_returns_over_many_blocks_match_the_loop_in_float64(width):
    gen = torch.Generator().manual_seed(width)
    rewards = torch.randn(5, width, generator=gen, dtype=torch.float64)
    mask = (torch.rand(5, width, generator=gen) > 0.3).double()
    mask[0, 10:150] = 0  # a long untrained stretch across block boundaries
    mask[1] = 0  # a row with no trained token
    for gamma in (0.001, 0.01, 0.3, 0.9, 0.999):
        got = discounted_returns(rewards * mask, mask, gamma)
        want = row_returns_reference(rewards.numpy(), mask.numpy(), gamma)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)


def test_discounted_returns_in_float32_match_float64_on_long_rows():
    gen = torch.Generator().manual_seed(0)
    rewards, mask = torch.randn(16, 1024, generator=gen), (torch.rand(16, 1024, generator=gen) > 0.1).float()
    for gamma in (0.0, 0.01, 0.5, 0.99, 1.0):
        got = discounted_returns(rewards * mask, mask, gamma)
        want = row_returns_reference(rewards.double().numpy(), mask.numpy(), gamma)
        np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-4, atol=2e-3)


def test_gae_hand_table():
    rewards, values = torch.tensor([[0.0, 1.0, 0.0]]), torch.tensor([[0.5, 0.25, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the last token is padding: its value is ignored
    adv, returns = gae(TokenRewards(rewards, mask, values=values), gamma=1.0, lam=1.0, whiten=False)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.75, 0.0]]))  # Monte-Carlo return 1 minus V
    torch.testing.assert_close(returns, torch.tensor([[1.0, 1.0, 0.0]]))
    adv, _ = gae(TokenRewards(rewards, mask, values=values), gamma=0.5, lam=0.0, whiten=False)
    torch.testing.assert_close(adv, torch.tensor([[0.0 + 0.5 * 0.25 - 0.5, 1.0 - 0.25, 0.0]]))  # one-step TD errors
    adv, _ = gae(TokenRewards(rewards, mask, values=values), gamma=0.5, lam=0.5, whiten=False)
    torch.testing.assert_close(adv, torch.tensor([[-0.375 + 0.25 * 0.75, 0.75, 0.0]]))


def test_gae_without_values_says_to_configure_a_critic():
    with pytest.raises(InvalidRewardsError, match="backend.critic.enable"):
        gae(TokenRewards(torch.zeros(1, 2), torch.ones(1, 2)))


@pytest.mark.parametrize(
    "key, value", [("gamma", 1.5), ("gamma", -0.1), ("lam", 2.0), ("gamma", float("nan")), ("lam", "0.9")]
)
def test_gamma_and_lam_outside_0_1_are_refused(key, value):
    batch = TokenRewards(torch.zeros(1, 2), torch.ones(1, 2), values=torch.zeros(1, 2))
    with pytest.raises((InvalidRewardsError, InvalidRewardTypeError), match=key):
        compute_advantages(batch, "gae", **{key: value})


@pytest.mark.parametrize(
    "args, error, message",
    [
        ((torch.zeros(2, 3), torch.ones(2, 4)), InvalidRewardsError, "shape"),
        ((torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2, 2)), InvalidRewardsError, "shape"),
        ((torch.zeros(3), torch.ones(3)), InvalidRewardsError, r"\[B, T\]"),
        (([[0.0, 1.0]], torch.ones(1, 2)), InvalidRewardTypeError, "tensor"),
        ((torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2)), InvalidRewardTypeError, "float"),
    ],
)
def test_bad_token_batches_are_typed_errors(args, error, message):
    rewards, mask, *values = args
    with pytest.raises(error, match=message):
        TokenRewards(rewards, mask, values=values[0] if values else None)


# ---- the registry: options by name, the two kinds of batch -------------------------------------


def test_options_pass_through_compute_advantages_by_name_and_unknown_ones_are_refused():
    batch = GroupedRewards.from_groups([[1.0, 0.0, 0.0, 0.0]])
    adv, _ = compute_advantages(batch, "pass_at_k", k=2, epsilon=1e-6, gamma=1.0)  # run-wide options are filtered
    torch.testing.assert_close(adv, torch.tensor([0.5, -1 / 6, -1 / 6, -1 / 6], dtype=torch.float64))
    with pytest.raises(ConfigError, match="no option 'kk'; it takes: k"):
        compute_advantages(batch, "pass_at_k", kk=2)
    with pytest.raises(ConfigError, match="whiten"):
        compute_advantages(batch, "grpo", whiten=False)


def test_token_level_and_outcome_estimators_refuse_the_other_kind_of_batch():
    with pytest.raises(InvalidRewardTypeError, match="TokenRewards"):
        compute_advantages(GroupedRewards.from_groups([[1.0, 0.0]]), "reinforce_plus_plus")
    with pytest.raises(InvalidRewardTypeError, match="GroupedRewards"):
        compute_advantages(TokenRewards(torch.zeros(1, 2), torch.ones(1, 2)), "grpo")


def test_the_collector_refuses_token_level_estimators_and_fills_opo_lengths():
    from rllm_torch import AlgorithmConfig, collect_reward_and_advantage_from_trajectory_groups
    from rllm_torch.rllm.types import Step, Trajectory, TrajectoryGroup

    def traj(reward, tokens, mask=None):
        return Trajectory(steps=[Step(response_ids=list(range(tokens)), response_mask=mask)], reward=reward)

    groups = [TrajectoryGroup([traj(1.0, 3), traj(0.0, 2, [1, 0])], group_id="g0")]  # lengths 3 and 1
    collect_reward_and_advantage_from_trajectory_groups(groups, AlgorithmConfig(estimator="opo"))
    assert [t.steps[0].advantage for t in groups[0].trajectories] == pytest.approx([0.25, -0.75])
    with pytest.raises(ConfigError, match="token-level"):
        collect_reward_and_advantage_from_trajectory_groups(groups, AlgorithmConfig(estimator="gae"))


# ---- compiled ---------------------------------------------------------------------------------


def test_the_new_estimators_compile_with_fullgraph():
    rewards_GK, weights_GK = torch.rand(6, 4), torch.randint(1, 9, (6, 4)).float()
    compiled = torch.compile(
        lambda r, w: opo(GroupedRewards.from_padded(r, weights=w, validate=False))[0], fullgraph=True
    )
    torch.testing.assert_close(
        compiled(rewards_GK, weights_GK), opo(GroupedRewards.from_padded(rewards_GK, weights=weights_GK))[0]
    )
    rewards, mask, values = torch.randn(5, 7), (torch.rand(5, 7) > 0.3).float(), torch.randn(5, 7)
    for fn, kwargs in ((reinforce_plus_plus, dict(gamma=0.9)), (gae, dict(gamma=0.9, lam=0.95))):
        eager = fn(TokenRewards(rewards, mask, values=values), **kwargs)
        graph = torch.compile(lambda r, m, v, fn=fn, kw=kwargs: fn(TokenRewards(r, m, values=v), **kw), fullgraph=True)
        for got, want in zip(graph(rewards, mask, values), eager, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert math.isfinite(float(compiled(rewards_GK, weights_GK).sum()))
