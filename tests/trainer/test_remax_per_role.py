"""ReMax as one role's estimator (issue 50): whether a group needs a greedy baseline is its role's
estimator's business (``estimator_map``), not the run's default ``estimator``, both ways round:
a ``remax`` role under a ``grpo`` run drops its groups without a baseline and subtracts the
greedy reward from the others, a ``grpo`` role under a ``remax`` run keeps its groups and centres
them. Expected advantages are worked by hand."""

from __future__ import annotations

import pytest

from rllm_torch import AlgorithmConfig, Step, Trajectory, TrajectoryGroup
from rllm_torch.rllm.collect import collect_reward_and_advantage_from_trajectory_groups
from rllm_torch.rllm.plan import AdvantagePlan
from rllm_torch.rllm.types import Episode
from rllm_torch.trainer.pipeline.baselines import attach_reward_baselines
from rllm_torch.trainer.pipeline.transform import TransformConfig

REWARDS = {"solver": (1.0, 0.0), "judge": (1.0, 0.5)}
GREEDY = {("a", "solver"): 0.25, ("b", "solver"): 0.75, ("a", "judge"): 0.5}  # no greedy rollout of task c


def groups() -> list[TrajectoryGroup]:
    return [
        TrajectoryGroup(
            [Trajectory(name=role, reward=r, steps=[Step(response_ids=[1])]) for r in REWARDS[role]],
            group_id=f"{task}:{role}",
        )
        for task in ("a", "b", "c")
        for role in ("solver", "judge")
    ]


def greedy_episodes() -> list[Episode]:
    by_task: dict[str, list[Trajectory]] = {}
    for (task, role), reward in GREEDY.items():
        by_task.setdefault(task, []).append(Trajectory(name=role, reward=reward, steps=[Step(response_ids=[1])]))
    return [Episode(task_id=task, trajectories=trajs) for task, trajs in by_task.items()]


def advantages(kept: list[TrajectoryGroup]) -> dict[str, list[float]]:
    return {g.group_id: [t.steps[0].advantage for t in g.trajectories] for g in kept}


# grpo (population std, epsilon 1e-6) of (1, 0): mean 0.5, std 0.5: +-0.5 / (0.5 + 1e-6);
# of (1, 0.5): mean 0.75, std 0.25: +-0.25 / (0.25 + 1e-6)
GRPO_SOLVER = 0.5 / (0.5 + 1e-6)
GRPO_JUDGE = 0.25 / (0.25 + 1e-6)


@pytest.mark.parametrize(
    "config",
    [
        AlgorithmConfig(estimator="grpo", estimator_map={"solver": "remax"}),
        AlgorithmConfig(estimator="remax", estimator_map={"judge": "grpo"}),
    ],
    ids=["remax-role-in-a-grpo-run", "grpo-role-in-a-remax-run"],
)
def test_a_remax_role_needs_baselines_and_a_grpo_role_does_not_whatever_the_run_default(config):
    assert "baselines" in AdvantagePlan(config).needs  # the greedy rollouts are sampled
    kept, metrics = attach_reward_baselines(groups(), greedy_episodes(), AdvantagePlan(config), TransformConfig())
    # c:solver (remax) has no greedy reward: left out and counted; c:judge (grpo) needs none: kept
    assert [g.group_id for g in kept] == ["a:solver", "a:judge", "b:solver", "b:judge", "c:judge"]
    assert metrics["batch/remax_groups_without_baseline"] == 1.0
    assert metrics["batch/remax_greedy_reward"] == pytest.approx((0.25 + 0.5 + 0.75) / 3)
    collect_reward_and_advantage_from_trajectory_groups(kept, config)
    got = advantages(kept)
    assert got["a:solver"] == pytest.approx([1.0 - 0.25, 0.0 - 0.25])  # reward - the greedy reward
    assert got["b:solver"] == pytest.approx([1.0 - 0.75, 0.0 - 0.75])
    for judge in ("a:judge", "b:judge", "c:judge"):  # centred in its group, its greedy reward unused
        assert got[judge] == pytest.approx([GRPO_JUDGE, -GRPO_JUDGE], rel=1e-6)


def test_a_grpo_role_in_a_remax_run_keeps_its_groups_and_the_remax_role_drops_its():
    config = AlgorithmConfig(estimator="remax", estimator_map={"solver": "grpo"})
    kept, metrics = attach_reward_baselines(groups(), greedy_episodes(), AdvantagePlan(config), TransformConfig())
    # now the solver is grpo (c:solver kept) and the judge remax (b:judge and c:judge have no greedy reward)
    assert [g.group_id for g in kept] == ["a:solver", "a:judge", "b:solver", "c:solver"]
    assert metrics["batch/remax_groups_without_baseline"] == 2.0
    collect_reward_and_advantage_from_trajectory_groups(kept, config)
    got = advantages(kept)
    assert got["a:judge"] == pytest.approx([1.0 - 0.5, 0.5 - 0.5])
    for solver in ("a:solver", "b:solver", "c:solver"):
        assert got[solver] == pytest.approx([GRPO_SOLVER, -GRPO_SOLVER], rel=1e-6)


def test_a_run_without_a_remax_role_needs_no_baselines_and_keeps_every_group():
    config = AlgorithmConfig(estimator="grpo", estimator_map={"judge": "rloo"})
    assert "baselines" not in AdvantagePlan(config).needs
    kept, _ = attach_reward_baselines(groups(), [], AdvantagePlan(config), TransformConfig())
    assert len(kept) == 6
