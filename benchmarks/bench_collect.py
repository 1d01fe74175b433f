"""Benchmark: collect_reward_and_advantage_from_trajectory_groups against a per-group numpy
version of the same computation, written the way rLLM's reference page does it.

65,536 trajectories in groups of 8 (8,192 groups, one role, GRPO), with 1 and with 4 steps per
trajectory. Both collectors run in the same process on the same objects (step advantages are
reset between runs, outside the timing); the best of ``--repeats`` runs is reported, with a
breakdown of our collector into its phases.

Run from the repository root: ``PYTHONPATH=. python benchmarks/bench_collect.py [--repeats 7]``
"""

from __future__ import annotations

import argparse
import gc
import platform
import time
from collections import defaultdict

import numpy as np
import torch
from machine import cpu_name

from rllm_torch import (
    AlgorithmConfig,
    Step,
    Trajectory,
    TrajectoryGroup,
    calculate_grpo_advantages_per_group,
    collect_reward_and_advantage_from_trajectory_groups,
    compute_advantages,
)
from rllm_torch.core.packing import GroupedRewards
from rllm_torch.rllm.collect import role_batch
from rllm_torch.rllm.metrics import difficulty_metrics, summary_metrics

NUM_TRAJECTORIES, GROUP_SIZE = 65_536, 8


def reference_collect(groups: list[TrajectoryGroup], algorithm_config: AlgorithmConfig) -> dict:
    """rLLM's collector as on the reference page: a Python loop over groups, numpy per group."""
    advantages_by_role, rewards_by_role = defaultdict(list), defaultdict(list)
    traj_rewards_by_role, traj_groups_by_role = defaultdict(list), defaultdict(list)
    for group in groups:
        role = group.group_role
        has_pre = any(step.advantage is not None for traj in group.trajectories for step in traj.steps)
        if has_pre and algorithm_config.use_precomputed_advantage:
            raise NotImplementedError
        assert all(traj.reward is not None for traj in group.trajectories)
        traj_rewards = np.array([traj.reward for traj in group.trajectories])
        rewards_by_role[role].extend(traj_rewards)
        traj_groups_by_role[role].append(group)
        traj_rewards_by_role[role].append(traj_rewards)
    for role, traj_groups in traj_groups_by_role.items():
        # calculate_grpo_advantages: one numpy call per group
        advantages_by_group = [
            calculate_grpo_advantages_per_group(r, norm_adv_by_std_in_grpo=algorithm_config.norm_adv_by_std_in_grpo)[0]
            for r in traj_rewards_by_role[role]
        ]
        for traj_group, advantages_by_traj in zip(traj_groups, advantages_by_group, strict=True):
            advantages_by_role[role].extend(np.asarray(advantages_by_traj).tolist())
            for traj, advantage in zip(traj_group.trajectories, advantages_by_traj, strict=True):
                for step in traj.steps:
                    step.advantage = advantage
    metrics = {}
    for role, rewards in rewards_by_role.items():
        metrics |= {
            f"reward/{role}/mean": np.mean(rewards),
            f"reward/{role}/std": np.std(rewards),
            f"reward/{role}/max": np.max(rewards),
            f"reward/{role}/min": np.min(rewards),
        }
    for role, advantages in advantages_by_role.items():
        metrics |= {
            f"advantage/{role}/mean": np.mean(advantages),
            f"advantage/{role}/std": np.std(advantages),
            f"advantage/{role}/max": np.max(advantages),
            f"advantage/{role}/min": np.min(advantages),
        }
        metrics[f"advantage/{role}/fraction_zero"] = np.sum(np.abs(advantages) < 1e-8) / len(advantages)
    return metrics


def make_groups(steps_per_traj: int, seed: int = 0) -> list[TrajectoryGroup]:
    rng = np.random.default_rng(seed)
    rewards = rng.integers(0, 2, NUM_TRAJECTORIES).astype(float).tolist()
    groups = []
    for g in range(NUM_TRAJECTORIES // GROUP_SIZE):
        trajs = [
            Trajectory(
                name="solver",
                reward=rewards[g * GROUP_SIZE + k],
                steps=[Step(response_ids=[1, 2, 3]) for _ in range(steps_per_traj)],
            )
            for k in range(GROUP_SIZE)
        ]
        groups.append(TrajectoryGroup(trajs, group_id=f"task-{g}:solver", group_role="solver", task_id=f"task-{g}"))
    return groups


def reset(groups: list[TrajectoryGroup]) -> None:
    """Clear step advantages and collect garbage, so no run pays for an earlier run's garbage."""
    for group in groups:
        for traj in group.trajectories:
            for step in traj.steps:
                step.advantage = None
    gc.collect()


def best_of(fn, groups, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        reset(groups)
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def phases(groups: list[TrajectoryGroup], config: AlgorithmConfig, repeats: int) -> dict[str, float]:
    """Our collector's phases, timed one by one (best of ``repeats``)."""
    described, steps = role_batch(groups, [False] * len(groups), "broadcast")
    sizes = described.group_sizes
    batch = GroupedRewards.from_padded(described.scores.view(len(sizes), sizes[0]), validate=False)
    adv_N, _ = compute_advantages(batch, "grpo", **config.estimator_kwargs)
    adv_list = adv_N[described.step_trajectory].tolist()

    def write():
        for step, adv in zip(steps, adv_list, strict=True):
            step.advantage = adv

    timed = {
        "describe the groups as tensors (Python attribute reads + a few tensors)": lambda: role_batch(
            groups, [False] * len(groups), "broadcast"
        ),
        "estimator call (tensor GRPO)": lambda: compute_advantages(batch, "grpo", **config.estimator_kwargs),
        "advantages to Python (one tolist)": lambda: adv_N.tolist(),
        "metrics (summary + difficulty)": lambda: (
            summary_metrics(batch.rewards, "r"),
            summary_metrics(adv_N, "a", fraction_zero=True),
            difficulty_metrics(batch, "d"),
        ),
        "write step.advantage (Python loop over steps)": write,
    }
    return {name: best_of(fn, groups, repeats) for name, fn in timed.items()}


def machine() -> str:
    return f"{cpu_name()}; {torch.get_num_threads()} torch threads, {len(__import__('os').sched_getaffinity(0))} cores available; torch {torch.__version__}; numpy {np.__version__}; Python {platform.python_version()}"


def main() -> None:
    torch.set_num_threads(1)  # ops here are small: one thread avoids OpenMP hand-off and contention on a shared machine
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    config = AlgorithmConfig()
    print(f"machine: {machine()}")
    warm = make_groups(1)[:64]  # first calls of torch ops (quantile, scatter_reduce) pay one-time setup
    collect_reward_and_advantage_from_trajectory_groups(warm, config)
    for steps in (1, 4):
        groups = make_groups(steps)
        ours = best_of(
            lambda: collect_reward_and_advantage_from_trajectory_groups(groups, config), groups, args.repeats
        )
        ours_adv = [t.steps[-1].advantage for g in groups for t in g.trajectories]
        ref = best_of(lambda: reference_collect(groups, config), groups, args.repeats)
        ref_adv = [t.steps[-1].advantage for g in groups for t in g.trajectories]
        err = float(np.max(np.abs(np.asarray(ours_adv) - np.asarray(ref_adv, dtype=np.float64))))
        print(
            f"\n{NUM_TRAJECTORIES} trajectories x {steps} step(s), groups of {GROUP_SIZE}: ours {ours * 1e3:.1f} ms, per-group numpy {ref * 1e3:.1f} ms, ratio {ref / ours:.1f}x (max |diff| {err:.1e})"
        )
        for name, seconds in phases(groups, config, args.repeats).items():
            print(f"  {name:48s} {seconds * 1e3:7.2f} ms  ({seconds / ours:5.1%} of ours)")


if __name__ == "__main__":
    main()
