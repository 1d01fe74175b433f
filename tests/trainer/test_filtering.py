"""Rejection sampling: mode none drops the groups below min_trajs_per_group (rLLM's rule), episode
mode filters and accumulates across batches, the uniform-reward filter, and the batch/* solve metrics."""

import copy
import warnings

import pytest

from rllm_torch import Episode, Step, Trajectory
from rllm_torch.core.errors import InvalidRewardTypeError
from rllm_torch.trainer import (
    RejectionSamplingConfig,
    RejectionSamplingState,
    apply_rejection_sampling_and_filtering,
    transform_episodes_to_trajectory_groups,
)
from rllm_torch.trainer.pipeline.step_warnings import all_dropped_warning


def _batch(task_rewards):
    """Episodes and groups for {task_id: [reward of each rollout]}; a rollout is correct when reward > 0."""
    episodes = [
        Episode(
            task_id=task,
            rollout_idx=i,
            is_correct=r > 0,
            trajectories=[Trajectory(name="s", reward=r, steps=[Step(response_ids=[1])])],
        )
        for task, rewards in task_rewards.items()
        for i, r in enumerate(rewards)
    ]
    groups, _ = transform_episodes_to_trajectory_groups(episodes)
    return episodes, groups


def test_mode_none_drops_the_small_groups_as_rllm_does_but_not_the_uniform_ones():
    # task a partially solved, b all solved, c none solved, d a singleton
    episodes, groups = _batch({"a": [1.0, 0.0], "b": [1.0, 1.0], "c": [0.0, 0.0], "d": [1.0]})
    config = RejectionSamplingConfig(mode="none", min_trajs_per_group=2, filter_uniform_groups=True)
    kept, kept_episodes, metrics = apply_rejection_sampling_and_filtering(
        episodes, groups, config, RejectionSamplingState()
    )
    assert kept == groups[:3]  # d dropped (1 < 2), the uniform b and c kept: rLLM's sync path filters sizes only
    assert [len(e.trajectories) for e in kept_episodes] == [1, 1, 1, 1, 1, 1, 0]  # d's episode stays, emptied
    assert episodes[-1].trajectories == [] and kept_episodes[-1] is episodes[-1]  # the caller's, emptied (rLLM's)
    # 3 tasks with a trajectory left: partial 1/3 (a), all 1/3 (b), none 1/3 (c)
    assert metrics == {
        "batch/num_tasks": 3.0,
        "batch/solve_none": pytest.approx(1 / 3),
        "batch/solve_all": pytest.approx(1 / 3),
        "batch/solve_partial": pytest.approx(1 / 3),
        "batch/groups_before_filter": 4.0,
        "batch/groups_after_filter": 3.0,
        "batch/groups_dropped_insufficient_trajs": 1.0,
        "batch/fraction_groups_dropped_uniform": 0.0,
    }
    # min_trajs_per_group=1 keeps everything
    kept, _, metrics = apply_rejection_sampling_and_filtering(
        episodes, groups, RejectionSamplingConfig(mode="none", min_trajs_per_group=1)
    )
    assert kept == groups and metrics["batch/groups_dropped_insufficient_trajs"] == 0.0


def test_in_async_training_the_uniform_filter_applies_in_mode_none_as_rllms_async_buffer_does():
    # rLLM reads filter_uniform_groups in its async buffer only, whatever the mode (rllm/trainer/buffer.py)
    episodes, groups = _batch({"a": [1.0, 0.0], "b": [1.0, 1.0], "c": [0.0, 0.0], "d": [1.0]})
    config = RejectionSamplingConfig(mode="none", filter_uniform_groups=True, async_training=True)
    kept, _, metrics = apply_rejection_sampling_and_filtering(episodes, groups, config, RejectionSamplingState())
    assert kept == groups[:1]  # b and c uniform, d too small
    assert metrics["batch/fraction_groups_dropped_uniform"] == pytest.approx(2 / 4)


def test_the_uniform_filter_in_a_sync_episode_mode_run_warns_that_rllms_sync_trainer_ignores_it():
    from rllm_torch.trainer.rllm_sections import RejectionSampleSection

    section = RejectionSampleSection(enable=True, filter_uniform_groups=True, refill_filtered_uniform_groups=False)
    with pytest.warns(UserWarning, match=r"filter_uniform_groups=true drops .* rLLM reads it only in async training"):
        config = RejectionSamplingConfig.from_config(section)
    assert config.filter_uniform_groups and not config.async_training
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # rLLM's async trainer applies it: nothing to say
        assert RejectionSamplingConfig.from_config(section, async_training=True).async_training
        section.enable = False  # sync mode none: ignored, as rLLM's sync trainer
        RejectionSamplingConfig.from_config(section)


def test_a_step_whose_every_group_is_too_small_warns_that_nothing_trains_and_one_kept_group_is_silent():
    episodes, groups = _batch({"a": [1.0], "b": [0.0], "c": [1.0]})  # 3 groups of one
    config = RejectionSamplingConfig(mode="none", min_trajs_per_group=2)
    kept, _, metrics = apply_rejection_sampling_and_filtering(episodes, groups, config, RejectionSamplingState())
    assert kept == [] and metrics["batch/groups_dropped_insufficient_trajs"] == metrics["batch/groups_before_filter"]
    assert all_dropped_warning(metrics, 2, step=7) == (
        "step 7: every group (3) has fewer than rllm.rejection_sample.min_trajs_per_group=2 trajectories and was "
        "dropped (rLLM's rule): nothing trains. Raise rllm.rollout.n, or set rllm.rejection_sample.min_trajs_per_group=1 "
        "for an estimator that learns from one rollout a prompt."
    )
    episodes, groups = _batch({"a": [1.0], "b": [0.0, 1.0]})  # b's group of two is kept
    kept, _, metrics = apply_rejection_sampling_and_filtering(episodes, groups, config, RejectionSamplingState())
    assert len(kept) == 1 and all_dropped_warning(metrics, 2, step=7) == ""
    assert all_dropped_warning({}, 2, step=7) == ""  # no group at all: nothing was dropped


def test_episode_mode_accumulates_across_batches_until_enough_tasks_are_partially_solved():
    config = RejectionSamplingConfig(mode="episode", min_trajs_per_group=2, min_partial_solve_tasks=2)
    state = RejectionSamplingState()
    # batch 1: one partial task (a) -> held back
    episodes1, groups1 = _batch({"a": [1.0, 0.0], "b": [0.0, 0.0]})
    kept, kept_eps, metrics = apply_rejection_sampling_and_filtering(episodes1, groups1, config, state)
    assert kept == [] and kept_eps == [] and metrics["batch/solve_partial"] == 0.5
    assert state.accumulated_groups == groups1
    # batch 2: one more partial task (c) and a singleton (d), which is dropped -> released
    episodes2, groups2 = _batch({"c": [0.5, 0.0], "d": [1.0]})
    kept, kept_eps, metrics = apply_rejection_sampling_and_filtering(episodes2, groups2, config, state)
    assert kept == groups1 + groups2[:1]
    # tasks a, b, c (d's episode lost its only trajectory): partial 2/3, none 1/3
    assert metrics["batch/num_tasks"] == 3.0 and metrics["batch/solve_partial"] == pytest.approx(2 / 3)
    assert metrics["batch/groups_before_filter"] == 4.0 and metrics["batch/groups_after_filter"] == 3.0
    assert metrics["batch/groups_dropped_insufficient_trajs"] == 1.0
    assert [e.task_id for e in kept_eps] == ["a", "a", "b", "b", "c", "c", "d"] and kept_eps[-1].trajectories == []
    assert kept_eps[-1] is episodes2[-1]  # the caller's episode itself, its trajectory removed (rLLM's)
    assert state.accumulated_groups == [] and state.counts.solve_partial == 0  # state emptied on release


def _two_roles(name, reward):
    return Trajectory(name=name, reward=reward, steps=[Step(reward=reward)])


@pytest.mark.parametrize("mode", ["none", "episode"])
def test_the_dropped_groups_trajectories_leave_the_callers_episodes_as_rllms_filter_episodes_removes_them(mode):
    # rLLM main 9beb6e0f, rllm/trainer/algorithms/rejection_sampling.py: filter_episodes (lines 138-157) sets each
    # episode's trajectories to those whose uid is in no dropped group and returns the same Episode objects. Its
    # apply_rejection_sampling_and_filtering, run on this batch (rLLM's types and transform), gave: kept groups
    # a:solver, a:judge, c:solver; the caller's episodes [solver, judge] x 2, [], [solver], [solver]; each
    # returned episode `is` the caller's; num_tasks 2 (b's episode has no trajectory left), solve_partial 1/2 (a),
    # solve_none 1/2 (c), groups 6 before, 3 after, 3 dropped (b:solver, b:judge, c:judge: one trajectory each).
    episodes = [
        Episode(id="a:0", is_correct=True, trajectories=[_two_roles("solver", 1.0), _two_roles("judge", 1.0)]),
        Episode(id="a:1", is_correct=False, trajectories=[_two_roles("solver", 0.0), _two_roles("judge", 0.0)]),
        Episode(id="b:0", is_correct=True, trajectories=[_two_roles("solver", 1.0), _two_roles("judge", 1.0)]),
        Episode(id="c:0", is_correct=False, trajectories=[_two_roles("solver", 0.0), _two_roles("judge", 1.0)]),
        Episode(id="c:1", is_correct=False, trajectories=[_two_roles("solver", 0.0)]),
    ]
    judge_c0 = episodes[3].trajectories[1]
    groups, _ = transform_episodes_to_trajectory_groups(episodes)
    config = RejectionSamplingConfig(mode=mode, min_trajs_per_group=2, min_partial_solve_tasks=1)
    kept, kept_eps, metrics = apply_rejection_sampling_and_filtering(episodes, groups, config, RejectionSamplingState())
    assert [g.group_id for g in kept] == ["a:solver", "a:judge", "c:solver"]
    names = [["solver", "judge"], ["solver", "judge"], [], ["solver"], ["solver"]]
    assert [[t.name for t in e.trajectories] for e in episodes] == names
    assert all(mine is theirs for mine, theirs in zip(kept_eps, episodes, strict=True))
    assert judge_c0 not in episodes[3].trajectories
    assert {k: metrics[k] for k in metrics if k != "batch/fraction_groups_dropped_uniform"} == {
        "batch/num_tasks": 2.0,
        "batch/solve_none": 0.5,
        "batch/solve_all": 0.0,
        "batch/solve_partial": 0.5,
        "batch/groups_before_filter": 6.0,
        "batch/groups_after_filter": 3.0,
        "batch/groups_dropped_insufficient_trajs": 3.0,
    }


def test_a_trajectory_is_removed_by_its_uid_as_in_rllm_even_when_the_group_holds_a_copy():
    episodes, groups = _batch({"a": [1.0, 0.0], "d": [1.0]})
    groups[1].trajectories = [copy.deepcopy(t) for t in groups[1].trajectories]  # a grouping hook's copy, same uid
    config = RejectionSamplingConfig(mode="none", min_trajs_per_group=2)
    apply_rejection_sampling_and_filtering(episodes, groups, config, RejectionSamplingState())
    assert [len(e.trajectories) for e in episodes] == [1, 1, 0]  # d's group of one dropped, by uid


def test_the_uniform_filter_drops_groups_of_equal_raw_rewards_within_the_tolerance_and_reports_a_fraction():
    config = RejectionSamplingConfig(
        mode="episode",
        min_trajs_per_group=1,
        min_partial_solve_tasks=0,
        filter_uniform_groups=True,
        uniform_reward_tolerance=1e-3,
    )
    # a: spread 1 (kept); b: spread 5e-4 <= 1e-3 (dropped); c: all 0 (dropped); d: singleton (kept, not a uniform *group*)
    episodes, groups = _batch({"a": [1.0, 0.0], "b": [0.3, 0.3005], "c": [0.0, 0.0, 0.0], "d": [2.0]})
    kept, _, metrics = apply_rejection_sampling_and_filtering(episodes, groups, config, RejectionSamplingState())
    assert [g.task_id for g in kept] == ["a", "d"]
    assert metrics["batch/fraction_groups_dropped_uniform"] == 0.5  # 2 of 4 groups


def test_at_tolerance_zero_the_uniform_filter_drops_exactly_equal_rewards_only():
    config = RejectionSamplingConfig(
        mode="episode",
        min_trajs_per_group=1,
        min_partial_solve_tasks=0,
        filter_uniform_groups=True,
        uniform_reward_tolerance=0.0,
    )
    episodes, groups = _batch({"same": [0.3, 0.3, 0.3], "close": [0.3, 0.30000001], "bools": [True, True]})
    kept, _, metrics = apply_rejection_sampling_and_filtering(episodes, groups, config, RejectionSamplingState())
    assert [g.task_id for g in kept] == ["close"]  # a spread of 1e-8 > 0 is not uniform
    assert metrics["batch/fraction_groups_dropped_uniform"] == pytest.approx(2 / 3)


def test_episode_mode_needs_a_state_and_bad_configs_are_refused():
    episodes, groups = _batch({"a": [1.0, 0.0]})
    with pytest.raises(ValueError, match="RejectionSamplingState"):
        apply_rejection_sampling_and_filtering(episodes, groups, RejectionSamplingConfig(mode="episode"), None)
    with pytest.raises(ValueError, match="'none' or 'episode'"):
        RejectionSamplingConfig(mode="group")
    with pytest.raises(ValueError, match="non-negative"):
        RejectionSamplingConfig(min_trajs_per_group=-1)


def test_the_uniform_filter_names_the_task_and_trajectory_of_a_reward_that_is_not_a_number():
    episodes, groups = _batch({"a": [1.0, 0.0]})
    groups[0].trajectories[1].reward = "zero"
    config = RejectionSamplingConfig(mode="episode", filter_uniform_groups=True)
    with pytest.raises(InvalidRewardTypeError, match="task 'a', trajectory 's' \\(position 1"):
        apply_rejection_sampling_and_filtering(episodes, groups, config, RejectionSamplingState())


def test_the_correctness_filter_drops_groups_all_right_or_all_wrong_whatever_their_shaped_rewards():
    """DAPO's dynamic sampling: a group whose rollouts are all correct has no signal even when a
    length penalty makes its rewards differ; one with mixed correctness keeps it even when the
    rewards tie."""
    config = RejectionSamplingConfig(
        mode="episode",
        min_trajs_per_group=1,
        min_partial_solve_tasks=0,
        filter_uniform_groups=True,
        uniform_filter_metric="is_correct",
    )
    episodes, groups = _batch(
        {"all right": [0.9, 0.7, 0.8], "all wrong": [-0.1, -0.3], "mixed": [0.5, 0.0], "one": [1.0]}
    )
    for group, correct in zip(groups[:2], ([True] * 3, [False] * 2), strict=True):
        assert [m["is_correct"] for m in group.metadata] == correct
    groups[2].metadata[1]["is_correct"] = True  # "mixed": rewards 0.5 and 0.0, both correct -> uniform
    episodes2, groups2 = _batch({"tie": [1.0, 1.0]})
    groups2[0].metadata[0]["is_correct"] = False  # equal rewards, mixed correctness -> kept
    kept, _, metrics = apply_rejection_sampling_and_filtering(
        episodes + episodes2, groups + groups2, config, RejectionSamplingState()
    )
    assert [g.task_id for g in kept] == ["one", "tie"]
    assert metrics["batch/fraction_groups_dropped_uniform"] == pytest.approx(3 / 5)
    by_reward = RejectionSamplingConfig(**{**vars(config), "uniform_filter_metric": "reward"})
    kept, _, _ = apply_rejection_sampling_and_filtering(
        episodes + episodes2, groups + groups2, by_reward, RejectionSamplingState()
    )
    assert [g.task_id for g in kept] == ["all right", "all wrong", "mixed", "one"]  # today's rule: the tie goes


def test_the_correctness_filter_names_a_group_without_is_correct():
    config = RejectionSamplingConfig(mode="episode", filter_uniform_groups=True, uniform_filter_metric="is_correct")
    episodes, groups = _batch({"a": [1.0, 0.0]})
    groups[0].metadata = [{}, {}]  # a custom grouping hook that fills no metadata
    with pytest.raises(ValueError, match="task 'a', group 'a:s': trajectory at position 0 has no is_correct"):
        apply_rejection_sampling_and_filtering(episodes, groups, config, RejectionSamplingState())
    with pytest.raises(ValueError, match="'reward' or 'is_correct'"):
        RejectionSamplingConfig(uniform_filter_metric="acc")


@pytest.mark.parametrize(("n", "refused"), [(1, True), (2, False), (3, False)])
def test_a_group_of_exactly_min_trajs_per_group_can_train_and_one_fewer_cannot(tmp_path, n, refused):
    # rejection sampling keeps a group of min_trajs_per_group (2) trajectories: only n < 2 drops every group
    from trainer_fakes import make_config

    from rllm_torch.core.errors import ConfigError
    from rllm_torch.trainer.config_checks import check_run_config
    from rllm_torch.trainer.pipeline.trainable_groups import check_groups_can_train

    config = make_config(tmp_path, f"rllm.rollout.n={n}", "rllm.rejection_sample.min_trajs_per_group=2")
    plan = check_run_config(config).plan
    if refused:
        with pytest.raises(ConfigError, match="min_trajs_per_group=2"):
            check_groups_can_train(config, plan, one_trajectory_per_episode=True)
    else:
        check_groups_can_train(config, plan, one_trajectory_per_episode=True)
