"""Bias measured, not argued: each multi-turn scheme's mean gradient estimate over many sampled
groups against the exact policy gradient of a tabular episode in which the policy decides when
to stop (:mod:`turn_episode`). The table of these numbers in docs/multi-turn.md comes from this test's setup
(``python tests/core/test_turn_bias.py`` prints it)."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from turn_episode import exact_gradient, mean_gradient, sample_groups  # noqa: E402

from rllm_torch.core.estimators import grpo, rloo  # noqa: E402
from rllm_torch.core.estimators.turns import (  # noqa: E402
    broadcast_advantages,
    gigpo_advantages,
    per_turn_index_advantages,
    turn_level_advantages,
)

GROUPS, SIZE = 20000, 4
SCHEMES = {
    "turn_level": turn_level_advantages,
    "per_turn_index (MT-GRPO)": per_turn_index_advantages,
    "broadcast": broadcast_advantages,
    "gigpo (w=1)": gigpo_advantages,
}
ESTIMATORS = {"rloo": rloo, "grpo (no std)": functools.partial(grpo, norm_adv_by_std_in_grpo=False), "grpo": grpo}


@pytest.fixture(scope="module")
def sampled():
    return sample_groups(GROUPS, SIZE, seed=0)


def z_scores(sampled, scheme, estimator, target):
    turns, score_MP = sampled
    advantages_M, _ = scheme(turns, estimator)
    mean, stderr = mean_gradient(turns, advantages_M, score_MP, SIZE)
    return (mean - target) / stderr


def test_turn_counts_follow_the_policys_stopping_probabilities(sampled):
    """The sampled episodes' turn counts (as :class:`GroupedTurns` counts them from the turns'
    trajectory index) against the closed form: 1 turn with probability ``1 - go_0``, 2 with
    ``go_0 (1 - go_1)``, 3 with ``go_0 go_1``; within 4 standard errors of a multinomial count."""
    from turn_episode import THETA

    turns, _ = sampled
    n = GROUPS * SIZE
    go = torch.sigmoid(THETA)
    expected = torch.stack([1 - go[0], go[0] * (1 - go[1]), go[0] * go[1]])
    counts = torch.bincount(turns.turn_counts, minlength=4)
    assert turns.turn_counts.numel() == n and counts[0] == 0 and counts.sum() == n
    stderr = (n * expected * (1 - expected)).sqrt()
    assert ((counts[1:].double() - n * expected).abs() < 4 * stderr).all(), (counts, n * expected)
    assert turns.num_turns == 3 and turns.rewards.numel() == int((counts[1:] * torch.arange(1, 4)).sum())


def test_turn_level_is_unbiased(sampled):
    z = z_scores(sampled, turn_level_advantages, rloo, exact_gradient())
    assert z.abs().max() < 4, z


def test_per_turn_index_scheme_is_biased(sampled):
    z = z_scores(sampled, per_turn_index_advantages, rloo, exact_gradient())
    assert z.abs().max() > 20, z  # about 200-400 standard errors off: outside any interval


def test_broadcast_is_unbiased_and_gigpo_scales_by_one_plus_w(sampled):
    exact = exact_gradient()
    assert z_scores(sampled, broadcast_advantages, rloo, exact).abs().max() < 4
    # the state here is the turn, so GiGPO's step term is the turn-level one: E = (1 + w) grad J
    assert z_scores(sampled, gigpo_advantages, rloo, 2 * exact).abs().max() < 4


def table(groups: int = GROUPS) -> str:
    """The table of docs/multi-turn.md: each scheme's mean estimate over the exact gradient, per logit (1 is
    unbiased; schemes that scale the gradient show their factor), and its distance from the
    exact gradient in standard errors."""
    sampled = sample_groups(groups, SIZE, seed=0)
    exact = exact_gradient()
    lines = [f"exact grad J = {[round(v, 4) for v in exact.tolist()]}; {groups} groups of {SIZE}", ""]
    lines += ["| scheme | estimator | mean / exact (theta_0, theta_1) | z (theta_0, theta_1) |", "|---|---|---|---|"]
    for name, scheme in SCHEMES.items():
        for label, estimator in ESTIMATORS.items():
            turns, score_MP = sampled
            mean, stderr = mean_gradient(turns, scheme(turns, estimator)[0], score_MP, SIZE)
            ratio, z = (mean / exact).tolist(), ((mean - exact) / stderr).tolist()
            lines.append(f"| {name} | {label} | {ratio[0]:.3f}, {ratio[1]:.3f} | {z[0]:+.1f}, {z[1]:+.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
