"""Demo: advantages of every built-in estimator on a generated batch of trajectory groups.

Run with ``rllm-torch-demo`` or ``python -m rllm_torch.cli.demo [--groups G] [--seed S] [--device D]``.
"""

from __future__ import annotations

import argparse

import torch

from rllm_torch.estimators import compute_advantages, registered_estimator_names
from rllm_torch.packing import GroupedRewards

__all__ = ["main"]


def generated_batch(num_groups: int, seed: int, device: str) -> GroupedRewards:
    """``num_groups`` groups of 1-6 binary rewards each (pass/fail of a verifiable task)."""
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 7, (num_groups,), generator=gen).tolist()
    solve_rate = torch.rand(num_groups, generator=gen).tolist()
    groups = [(torch.rand(n, generator=gen) < p).float() for n, p in zip(sizes, solve_rate, strict=True)]
    return GroupedRewards.from_groups(groups, device=device)


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
        _show(name, batch, compute_advantages(batch, name)[0])


def _show(title: str, batch: GroupedRewards, values: torch.Tensor) -> None:
    print(f"\n{title}:")
    for g, group in enumerate(batch.split(values)):
        print(f"  group {g}: " + " ".join(f"{v:+.3f}" for v in group.cpu().tolist()))


if __name__ == "__main__":
    main()
