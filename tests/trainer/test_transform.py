"""Episodes → trajectory groups: grouping by (task id, name), compact filtering, reward
propagation, metrics, and a custom hook."""

import pytest

from rllm_torch import Episode, Step, TerminationReason, Trajectory, TrajectoryGroup
from rllm_torch.trainer import CompactFilteringConfig, TransformConfig, transform_episodes_to_trajectory_groups


def _episode(task_id, rollout_idx, *trajs, reason=None, correct=False):
    return Episode(
        task_id=task_id,
        rollout_idx=rollout_idx,
        trajectories=list(trajs),
        termination_reason=reason,
        is_correct=correct,
    )


def _traj(name, reward=None, step_rewards=(0.0,)):
    return Trajectory(name=name, reward=reward, steps=[Step(response_ids=[1], reward=r) for r in step_rewards])


def test_four_rollouts_of_one_task_are_one_group_even_though_every_trajectory_has_its_own_uid():
    episodes = [_episode("t1", i, _traj("solver", reward=float(i))) for i in range(4)]
    assert len({e.trajectories[0].uid for e in episodes}) == 4
    groups, metrics = transform_episodes_to_trajectory_groups(episodes, TransformConfig())
    assert len(groups) == 1
    group = groups[0]
    assert (group.task_id, group.group_role, group.group_id) == ("t1", "solver", "t1:solver")
    assert [t.reward for t in group.trajectories] == [0.0, 1.0, 2.0, 3.0]
    assert group.trajectories[2] is episodes[2].trajectories[0]  # references, not copies
    assert [m["rollout_idx"] for m in group.metadata] == [0, 1, 2, 3]
    assert metrics["groups/num_groups"] == 1.0 and metrics["groups/avg_group_size"] == 4.0


def test_grouping_is_by_task_id_and_name_with_unnamed_trajectories_named_by_position():
    # two tasks x two rollouts; each episode has a named solver and an unnamed second trajectory
    episodes = [_episode(task, i, _traj("solver", 1.0), _traj("", 0.0)) for task in ("a", "b") for i in range(2)]
    groups, metrics = transform_episodes_to_trajectory_groups(episodes)
    assert [(g.task_id, g.group_role, len(g.trajectories)) for g in groups] == [
        ("a", "solver", 2),
        ("a", "default_traj_name_1", 2),
        ("b", "solver", 2),
        ("b", "default_traj_name_1", 2),
    ]
    assert episodes[0].trajectories[1].name == "default_traj_name_1"
    assert metrics == {
        "groups/num_trajs_before_filter": 8.0,
        "groups/num_trajs_after_filter": 8.0,
        "groups/num_groups": 4.0,
        "groups/avg_group_size": 2.0,
        "groups/max_group_size": 2.0,
        "groups/min_group_size": 2.0,
    }


def test_a_group_that_compact_filtering_empties_is_not_emitted_and_the_metrics_count_what_was_left_out():
    # task a: 3 rollouts, two timed out; task b: 2 rollouts that both errored (reason given as a string)
    episodes = [
        _episode("a", 0, _traj("s", 1.0)),
        _episode("a", 1, _traj("s", 0.0), reason=TerminationReason.TIMEOUT),
        _episode("a", 2, _traj("s", 0.0), reason="timeout"),
        _episode("b", 0, _traj("s", 1.0), reason="error"),
        _episode("b", 1, _traj("s", 1.0), reason="error"),
    ]
    config = CompactFilteringConfig(enable=True, mask_timeout=True, mask_reasons=["error"])
    groups, metrics = transform_episodes_to_trajectory_groups(episodes, TransformConfig(), config)
    assert [(g.task_id, len(g.trajectories)) for g in groups] == [("a", 1)]
    # before: 5 trajectories; after: 1; one group of size 1
    assert metrics == {
        "groups/num_trajs_before_filter": 5.0,
        "groups/num_trajs_after_filter": 1.0,
        "groups/num_groups": 1.0,
        "groups/avg_group_size": 1.0,
        "groups/max_group_size": 1.0,
        "groups/min_group_size": 1.0,
    }


def test_compact_filtering_is_off_unless_enabled_and_a_missing_reason_counts_as_unknown():
    assert not CompactFilteringConfig(mask_timeout=True).should_mask("timeout")
    assert CompactFilteringConfig(enable=True, mask_unknown=True).should_mask(None)
    with pytest.raises(ValueError, match="not one of"):
        CompactFilteringConfig(enable=True, mask_reasons=["tiemout"])


def test_everything_filtered_gives_no_groups_and_zero_size_metrics():
    episodes = [_episode("a", 0, _traj("s", 1.0), reason="error")]
    groups, metrics = transform_episodes_to_trajectory_groups(
        episodes, None, CompactFilteringConfig(enable=True, mask_error=True)
    )
    assert groups == []
    assert (
        metrics["groups/num_trajs_before_filter"] == 1.0
        and metrics["groups/avg_group_size"] == 0.0
        and metrics["groups/max_group_size"] == 0.0
    )


def test_in_broadcast_mode_a_trajectory_without_a_reward_takes_its_last_step_reward():
    episodes = [_episode("a", i, _traj("s", None, step_rewards=(0.25, 0.5 + i))) for i in range(2)]
    groups, _ = transform_episodes_to_trajectory_groups(episodes)
    assert [t.reward for t in groups[0].trajectories] == [0.5, 1.5]


def test_a_group_mixing_rewarded_and_unrewarded_trajectories_is_an_error_naming_the_task():
    episodes = [_episode("task-9", 0, _traj("s", 1.0)), _episode("task-9", 1, _traj("s", None))]
    with pytest.raises(ValueError, match="task 'task-9'.*has no reward"):
        transform_episodes_to_trajectory_groups(episodes)


def test_an_episode_without_a_task_id_is_grouped_by_the_task_id_of_its_id_as_in_rllm():
    episodes = [Episode(id=f"t:{i}", trajectories=[_traj("s", float(i))]) for i in range(2)]
    episodes.append(Episode(id="u:0", trajectories=[_traj("s", 1.0)]))
    groups, _ = transform_episodes_to_trajectory_groups(episodes)
    assert [(g.group_id, g.group_role, len(g.trajectories)) for g in groups] == [("t:s", "s", 2), ("u:s", "s", 1)]
    assert [m["rollout_idx"] for m in groups[0].metadata] == [0, 1]


def test_a_custom_grouping_hook_replaces_the_default_grouping():
    def one_group_per_rollout(episodes, transform_config, cf_config):
        return [TrajectoryGroup(e.trajectories, group_id=e.id, group_role="all", task_id=e.task_id) for e in episodes]

    episodes = [_episode("a", i, _traj("s", 1.0), _traj("t", 0.0)) for i in range(3)]
    groups, metrics = transform_episodes_to_trajectory_groups(episodes, traj_grouping_hook=one_group_per_rollout)
    assert [g.group_id for g in groups] == ["a:0", "a:1", "a:2"]
    assert metrics["groups/num_groups"] == 3.0 and metrics["groups/avg_group_size"] == 2.0
    with pytest.raises(TypeError, match="list of TrajectoryGroup"):
        transform_episodes_to_trajectory_groups(episodes, traj_grouping_hook=lambda *a: {"not": "a list"})


def test_per_step_mode_needs_equal_step_counts_within_a_group():
    episodes = [_episode("a", 0, _traj("s", 1.0, (0.0,))), _episode("a", 1, _traj("s", 1.0, (0.0, 1.0)))]
    with pytest.raises(ValueError, match="same number"):
        transform_episodes_to_trajectory_groups(episodes, TransformConfig(broadcast=False))


def test_compact_filtering_switched_on_masks_what_rllms_run_config_masks_and_its_dataclass_none(tmp_path):
    from trainer_fakes import make_config

    from rllm_torch.trainer.config_checks import check_run_config

    # rLLM main 9beb6e0f, rllm/trainer/config/rllm/base.yaml lines 112-120 (its run config)
    rllm_base_yaml = {
        "max_prompt_length_exceeded": True,
        "max_response_length_exceeded": True,
        "env_done": False,
        "max_turns_exceeded": True,
        "timeout": True,
        "unknown": False,
        "error": True,
    }
    cf = check_run_config(make_config(tmp_path, "rllm.compact_filtering.enable=true")).cf_config
    assert {reason: cf.should_mask(reason) for reason in rllm_base_yaml} == rllm_base_yaml
    # rLLM's dataclass (rllm/trainer/algorithms/config.py:111) masks nothing by default, switched on or not
    plain = CompactFilteringConfig(enable=True)
    assert not any(plain.should_mask(reason) for reason in rllm_base_yaml)
