"""collect_reward_and_advantage_from_trajectory_groups: hand-computed batches, per-step
broadcast, precomputed advantages, validation mode, bad input."""

import math
import random
import warnings

import numpy as np
import pytest

from rllm_torch import (
    AlgorithmConfig,
    Episode,
    Step,
    Trajectory,
    TrajectoryGroup,
    calculate_grpo_advantages_per_group,
    collect_reward_and_advantage_from_trajectory_groups,
)
from rllm_torch.trainer import CompactFilteringConfig, transform_episodes_to_trajectory_groups

EPS = 1e-6


def _group(role, rewards, task_id="t", tokens=1):
    trajs = [Trajectory(name=role, reward=r, steps=[Step(response_ids=[7] * tokens)]) for r in rewards]
    return TrajectoryGroup(trajs, group_id=f"{task_id}:{role}", group_role=role, task_id=task_id)


def _advantages(group):
    return [t.steps[0].advantage for t in group.trajectories]


def test_empty_input_returns_an_empty_dict():
    assert collect_reward_and_advantage_from_trajectory_groups([], AlgorithmConfig()) == {}
    assert collect_reward_and_advantage_from_trajectory_groups([], AlgorithmConfig(), collect_advantage=False) == {}


def test_two_roles_with_different_estimators_each_get_their_own_estimator_and_metrics():
    solver = _group("solver", [1.0, 0.0, 0.0, 1.0])
    judge = _group("judge", [1.0, 0.0, 0.0])
    config = AlgorithmConfig(estimator="grpo", estimator_map={"judge": "rloo"})
    metrics = collect_reward_and_advantage_from_trajectory_groups([solver, judge], config)
    # solver, GRPO: mean 0.5, population std 0.5 -> (r - 0.5) / (0.5 + 1e-6) = +-0.999998
    a = 0.5 / (0.5 + EPS)
    assert _advantages(solver) == pytest.approx([a, -a, -a, a], abs=1e-12)
    # judge, RLOO: n = 3, mean 1/3 -> 3/2 * (r - 1/3) = [1, -0.5, -0.5]
    assert _advantages(judge) == pytest.approx([1.0, -0.5, -0.5], abs=1e-12)
    # judge rewards: mean 1/3, std sqrt(((2/3)^2 + 2 (1/3)^2) / 3) = sqrt(2/9)
    assert metrics["reward/judge/mean"] == pytest.approx(1 / 3)
    assert metrics["reward/judge/std"] == pytest.approx(math.sqrt(2 / 9))
    assert (metrics["reward/judge/max"], metrics["reward/judge/min"]) == (1.0, 0.0)
    # judge advantages [1, -.5, -.5]: mean 0, std sqrt((1 + .25 + .25) / 3) = sqrt(.5), none zero
    assert metrics["advantage/judge/mean"] == pytest.approx(0.0, abs=1e-12)
    assert metrics["advantage/judge/std"] == pytest.approx(math.sqrt(0.5))
    assert metrics["advantage/judge/fraction_zero"] == 0.0
    assert metrics["advantage/solver/max"] == pytest.approx(a) and metrics["advantage/solver/min"] == pytest.approx(-a)
    assert all(type(v) is float for v in metrics.values())


def test_a_mixed_batch_keeps_precomputed_token_advantages_for_one_role_and_computes_rl_for_the_other():
    student = TrajectoryGroup(
        [
            Trajectory(
                name="student",
                reward=None,
                steps=[
                    Step(response_ids=[1, 2], advantage=[0.1, -0.2]),  # kept as is
                    Step(response_ids=[3, 4, 5], response_mask=[1, 0, 1], advantage=0.5),  # scalar x own mask
                    Step(response_ids=[6], advantage=None),  # missing -> zeros, warned
                ],
            )
        ],
        group_id="t:student",
        group_role="student",
        task_id="t",
    )
    solver = _group("solver", [2.0, 0.0])
    config = AlgorithmConfig(use_precomputed_advantage=True)
    with pytest.warns(UserWarning, match="1 step\\(s\\).*task 't', trajectory 'student'.*step 2"):
        metrics = collect_reward_and_advantage_from_trajectory_groups([student, solver], config)
    steps = student.trajectories[0].steps
    assert [s.advantage for s in steps] == [[0.1, -0.2], [0.5, 0.0, 0.5], [0.0]]
    # tokens [.1, -.2, .5, 0, .5, 0]: mean .9 / 6 = .15, max .5, min -.2, zeros 2 / 6
    assert metrics["advantage/student/mean"] == pytest.approx(0.15)
    assert (metrics["advantage/student/max"], metrics["advantage/student/min"]) == (0.5, -0.2)
    assert metrics["advantage/student/fraction_zero"] == pytest.approx(1 / 3)
    assert "reward/student/mean" not in metrics  # rewards are reported for RL groups only, as rLLM
    # solver, GRPO: mean 1, std 1 -> +-1 / (1 + 1e-6)
    assert _advantages(solver) == pytest.approx([1 / (1 + EPS), -1 / (1 + EPS)], abs=1e-12)
    assert metrics["reward/solver/mean"] == 1.0


def test_singleton_groups_follow_each_estimator_rule_and_are_left_out_of_the_difficulty_diagnostics():
    single, pair = _group("s", [2.0], "a"), _group("s", [0.5, 1.5], "b")
    metrics = collect_reward_and_advantage_from_trajectory_groups([single, pair], AlgorithmConfig())
    # GRPO, group of one: mean 0, std 1 -> 2 / (1 + 1e-6); the pair: mean 1, std .5 -> +-.5 / (.5 + 1e-6)
    assert _advantages(single) == pytest.approx([2 / (1 + EPS)], abs=1e-12)
    assert _advantages(pair) == pytest.approx([-0.5 / (0.5 + EPS), 0.5 / (0.5 + EPS)], abs=1e-12)
    # rLLM's diagnostics (batch/{role}/*) see only the pair: std .5 (informative), mean 1
    assert metrics["batch/s/total"] == 1.0 and metrics["batch/s/informative"] == 1.0
    assert metrics["batch/s/fractions/effective"] == 1.0
    assert (metrics["batch/s/fractions/too_easy"], metrics["batch/s/fractions/too_hard"]) == (0.0, 0.0)
    assert metrics["batch/s/group_reward_mean/p50"] == 1.0 and metrics["batch/s/group_reward_std/p90"] == 0.5
    # RLOO, group of one: a = r
    single2 = _group("s", [2.0])
    collect_reward_and_advantage_from_trajectory_groups([single2], AlgorithmConfig(estimator="rloo"))
    assert _advantages(single2) == [2.0]


def test_only_singletons_give_no_difficulty_keys_as_in_rllm():
    metrics = collect_reward_and_advantage_from_trajectory_groups(
        [_group("s", [1.0], "a"), _group("s", [0.0], "b")], AlgorithmConfig()
    )
    assert not any(k.startswith("batch/s/") for k in metrics)  # rLLM: `if n_total == 0: continue`


def test_difficulty_fractions_over_several_groups():
    # groups: [1,1] too easy; [0,0] too hard; [1,0] informative; [0,0] too hard; [.5,.5] flat, neither
    rewards = [[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0], [0.5, 0.5]]
    groups = [_group("s", r, f"t{i}") for i, r in enumerate(rewards)]
    metrics = collect_reward_and_advantage_from_trajectory_groups(groups, AlgorithmConfig())
    assert (metrics["batch/s/total"], metrics["batch/s/informative"]) == (5.0, 1.0)
    assert metrics["batch/s/fractions/effective"] == 0.2
    assert metrics["batch/s/fractions/too_easy"] == 0.2 and metrics["batch/s/fractions/too_hard"] == 0.4
    # group means [1, 0, .5, 0, .5]: sorted [0, 0, .5, .5, 1], median .5; p10 = 0, p90 = .5 + .6 * .5 = .8
    assert metrics["batch/s/group_reward_mean/p50"] == 0.5
    assert metrics["batch/s/group_reward_mean/p90"] == pytest.approx(0.8)
    # stds sorted [0, 0, 0, 0, .5]: p90 at position .9 * 4 = 3.6, 0 + .6 * (.5 - 0) = .3 (np.percentile's linear)
    assert metrics["batch/s/group_reward_std/p90"] == pytest.approx(0.3)
    # constant groups get exactly 0 advantage: 8 of 10 trajectories
    assert metrics["advantage/s/fraction_zero"] == 0.8


def test_a_multi_step_trajectory_gets_its_advantage_at_each_step_own_response_tokens():
    steps = [
        Step(response_ids=[1, 2], response_mask=[1, 1]),
        Step(response_ids=[3, 4, 5, 6], response_mask=[1, 0, 0, 1]),
        Step(response_ids=[7, 8, 9]),  # no mask: every token
    ]
    long = Trajectory(name="agent", reward=1.0, steps=steps)
    short = Trajectory(name="agent", reward=0.0, steps=[Step(response_ids=[1])])
    group = TrajectoryGroup([long, short], group_id="t:agent", task_id="t")
    collect_reward_and_advantage_from_trajectory_groups([group], AlgorithmConfig(norm_adv_by_std_in_grpo=False))
    # Dr. GRPO: mean .5 -> long +.5, short -.5; a Python float on every step
    assert [s.advantage for s in steps] == [0.5, 0.5, 0.5] and all(type(s.advantage) is float for s in steps)
    assert [s.token_advantages().tolist() for s in steps] == [[0.5, 0.5], [0.5, 0.0, 0.0, 0.5], [0.5, 0.5, 0.5]]
    assert short.steps[0].token_advantages().tolist() == [-0.5]


def test_a_group_that_compact_filtering_empties_contributes_nothing():
    episodes = [
        Episode(
            task_id=task,
            rollout_idx=i,
            termination_reason=reason,
            trajectories=[Trajectory(name="s", reward=r, steps=[Step(response_ids=[1])])],
        )
        for task, reason, rewards in [("a", None, [1.0, 0.0]), ("b", "timeout", [5.0, 5.0])]
        for i, r in enumerate(rewards)
    ]
    groups, _ = transform_episodes_to_trajectory_groups(
        episodes, None, CompactFilteringConfig(enable=True, mask_timeout=True)
    )
    metrics = collect_reward_and_advantage_from_trajectory_groups(groups, AlgorithmConfig())
    # only task a: rewards [1, 0] -> mean .5, max 1; task b's steps are untouched
    assert metrics["reward/s/mean"] == 0.5 and metrics["reward/s/max"] == 1.0
    assert [e.trajectories[0].steps[0].advantage for e in episodes[2:]] == [None, None]


def test_validation_mode_reports_rewards_only_and_leaves_steps_untouched():
    group = _group("s", [1.0, 0.0])
    metrics = collect_reward_and_advantage_from_trajectory_groups(
        [group], AlgorithmConfig(estimator_map={"s": "not_registered"}), collect_advantage=False
    )
    assert sorted(metrics) == ["reward/s/max", "reward/s/mean", "reward/s/min", "reward/s/std"]
    assert _advantages(group) == [None, None]


def test_rl_advantages_match_the_per_group_numpy_reference_on_ragged_random_groups():
    rng = random.Random(0)
    groups = [_group("s", [float(rng.randint(0, 3)) for _ in range(rng.randint(1, 6))], f"t{g}") for g in range(50)]
    collect_reward_and_advantage_from_trajectory_groups(groups, AlgorithmConfig())
    for group in groups:
        expected, _ = calculate_grpo_advantages_per_group(np.array([t.reward for t in group.trajectories]))
        assert _advantages(group) == pytest.approx(expected.tolist(), abs=1e-12)


@pytest.mark.parametrize(
    ("mutate", "error", "pattern"),
    [
        (
            lambda g: setattr(g.trajectories[1], "reward", None),
            ValueError,
            "task 'task-3', trajectory 'solver'.*reward is None",
        ),
        (
            lambda g: setattr(g.trajectories[0], "reward", "1.0"),
            TypeError,
            "task 'task-3', trajectory 'solver'.*not a real number",
        ),
    ],
)
def test_a_bad_rl_reward_is_refused_naming_task_and_trajectory_and_no_step_changes(mutate, error, pattern):
    group, other = _group("solver", [1.0, 0.0], "task-3"), _group("other", [1.0, 0.0], "task-4")
    mutate(group)
    with pytest.raises(error, match=pattern):
        collect_reward_and_advantage_from_trajectory_groups([other, group], AlgorithmConfig())
    assert _advantages(other) == [None, None]


def test_precomputed_advantages_of_the_wrong_length_or_type_are_refused_naming_the_step():
    def group_with(adv):
        steps = [Step(response_ids=[1, 2], advantage=[0.0, 0.0]), Step(response_ids=[1, 2, 3], advantage=adv)]
        return TrajectoryGroup([Trajectory(name="student", steps=steps)], group_id="g", task_id="task-5")

    config = AlgorithmConfig(use_precomputed_advantage=True)
    with pytest.raises(ValueError, match="task 'task-5', trajectory 'student'.*step 1.*2 entries.*3 response tokens"):
        collect_reward_and_advantage_from_trajectory_groups([group_with([0.1, 0.2])], config)
    with pytest.raises(TypeError, match="task 'task-5', trajectory 'student'.*step 1.*dict"):
        collect_reward_and_advantage_from_trajectory_groups([group_with({"a": 1.0})], config)


def test_an_unregistered_estimator_in_estimator_map_is_refused_naming_the_role():
    with pytest.raises(ValueError, match="role 'judge'.*estimator_map\\['judge'\\].*'no_such_estimator'.*registered"):
        collect_reward_and_advantage_from_trajectory_groups(
            [_group("solver", [1.0, 0.0])], AlgorithmConfig(estimator_map={"judge": "no_such_estimator"})
        )


def test_rl_mode_overwrites_advantages_left_by_an_earlier_call():
    group = _group("s", [1.0, 0.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        collect_reward_and_advantage_from_trajectory_groups([group], AlgorithmConfig(estimator="reinforce"))
        collect_reward_and_advantage_from_trajectory_groups([group], AlgorithmConfig(estimator="reinforce"))
    assert _advantages(group) == [1.0, 0.0]


def test_each_roles_difficulty_diagnostics_are_of_its_own_groups():
    # judge: one group all solved (too easy); solver: two groups, one all failed (too hard), one mixed
    judge = _group("judge", [1.0, 1.0])
    solver = [_group("solver", [0.0, 0.0], task_id="a"), _group("solver", [1.0, 0.0], task_id="b")]
    metrics = collect_reward_and_advantage_from_trajectory_groups([judge, *solver], AlgorithmConfig())
    assert (metrics["batch/judge/total"], metrics["batch/judge/fractions/too_easy"]) == (1.0, 1.0)
    assert metrics["batch/judge/fractions/too_hard"] == 0.0
    assert (metrics["batch/solver/total"], metrics["batch/solver/informative"]) == (2.0, 1.0)
    assert (metrics["batch/solver/fractions/too_easy"], metrics["batch/solver/fractions/too_hard"]) == (0.0, 0.5)
