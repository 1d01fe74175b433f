"""Demo: advantages of every registered estimator on a generated batch of trajectory groups.

Outcome estimators see the groups' binary rewards (``opo`` with random response lengths as
weights, ``pass_at_k`` with ``k`` the smallest group's size, ``gdpo`` with two rewards per
trajectory: the binary one and brevity, 1 for a response of at most 4 tokens); token-level ones see each
trajectory as a 3-token response with its reward on the last token (``gae`` with zero values,
``optimal_token_baseline`` with an old policy that gave each token probability 1/2 out of two
equally likely ones; ``remax`` as if each group's greedy rollout scored as its first member), and
the demo prints each trajectory's advantage at its first token.

Run with ``rllm-torch-demo`` or ``python -m rllm_torch.cli.demo [--groups G] [--seed S] [--device D]``.
"""

from __future__ import annotations

import argparse
import math

import torch

from rllm_torch.core.packing import GroupedRewards
from rllm_torch.core.tokens import TokenRewards
from rllm_torch.rllm.dispatch import compute_advantages
from rllm_torch.rllm.registry import estimator_options, is_token_level, registered_estimator_names, registration

__all__ = ["main"]


def generated_batch(num_groups: int, seed: int, device: str) -> GroupedRewards:
    """``num_groups`` groups of 1-6 binary rewards each (pass/fail of a verifiable task), with
    response lengths of 1-8 tokens as weights, and ``[correct, brief]`` as reward components."""
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 7, (num_groups,), generator=gen).tolist()
    solve_rate = torch.rand(num_groups, generator=gen).tolist()
    rewards = torch.cat([(torch.rand(n, generator=gen) < p).float() for n, p in zip(sizes, solve_rate, strict=True)])
    lengths = torch.randint(1, 9, rewards.shape, generator=gen).float()
    index = torch.repeat_interleave(torch.arange(num_groups), torch.tensor(sizes))
    components = torch.stack([rewards, (lengths <= 4).float()], dim=1)
    return GroupedRewards.from_flat(
        rewards.to(device), index.to(device), weights=lengths.to(device), reward_components=components.to(device)
    )


def advantages(batch: GroupedRewards, name: str) -> torch.Tensor:
    """``[N]`` advantages of estimator ``name`` on ``batch`` (see the module docstring)."""
    if is_token_level(name):
        rewards_N3 = torch.nn.functional.pad(batch.rewards.float()[:, None], (2, 0))
        mask = torch.ones_like(rewards_N3)
        tokens = TokenRewards(
            rewards_N3,
            mask,
            values=torch.zeros_like(mask),
            old_log_probs=torch.full_like(mask, math.log(0.5)),
            sum_pi_squared=torch.full_like(mask, 0.5),
            group_index=batch.group_index,
        )
        adv_N3, _ = compute_advantages(tokens, name)
        return adv_N3[:, 0]
    return compute_advantages(batch, name, **_demo_options(batch, name))[0]


def _demo_options(batch: GroupedRewards, name: str) -> dict:
    """What the demo gives ``name`` besides the rewards: a ``k`` option (at most the smallest group),
    and greedy baselines for one that needs them (as if each group's greedy rollout had scored as
    its first member)."""
    options = {"k": int(batch.layout.counts.min())} if "k" in (estimator_options(name) or ()) else {}
    if "baselines" in registration(name).needs:
        options["baselines"] = batch.padded_rewards.float()[:, 0]
    return options


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=4, help="number of trajectory groups (prompts)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    batch = generated_batch(args.groups, args.seed, args.device)
    print(f"{batch.num_groups} groups, {batch.num_trajectories} trajectories on {batch.device}")
    _show("rewards", batch, batch.rewards)
    for name in registered_estimator_names():
        k = _demo_options(batch, name).get("k") if not is_token_level(name) else None
        title = f"{name} (k={k}, the smallest group)" if k is not None else name
        _show(title, batch, advantages(batch, name))


def _show(title: str, batch: GroupedRewards, values: torch.Tensor) -> None:
    print(f"\n{title}:")
    for g, group in enumerate(batch.split(values)):
        print(f"  group {g}: " + " ".join(f"{v:+.3f}" for v in group.cpu().tolist()))


if __name__ == "__main__":
    main()
