"""The trajectory data model: explicit fields, termination reasons as strings, per-step token advantages."""

import pytest
import torch

from rllm_torch import Episode, Step, TerminationReason, Trajectory, TrajectoryGroup
from rllm_torch.core.errors import InvalidTrajectoryError
from rllm_torch.trainer import build_token_batch


def test_episode_id_is_built_from_task_id_and_rollout_index_and_never_parsed():
    episode = Episode(task_id="math-7", rollout_idx=3)
    assert episode.id == "math-7:3"
    # an id with colons in it does not change the explicit fields
    explicit = Episode(id="a:b:c", task_id="t", rollout_idx=1)
    assert (explicit.id, explicit.task_id, explicit.rollout_idx) == ("a:b:c", "t", 1)


def test_termination_reason_given_as_a_string_becomes_the_enum_member():
    assert Episode(task_id="t", termination_reason="timeout").termination_reason is TerminationReason.TIMEOUT
    with pytest.raises(ValueError, match="not one of"):
        Episode(task_id="t", termination_reason="ran_out_of_coffee")


def test_group_role_comes_from_the_group_id_as_rllm_reads_it_unless_given():
    # rLLM's TrajectoryGroup.group_role: group_id.split(":")[1] if ":" in group_id[:-1] else "all_groups"
    judges = [Trajectory(name="judge_0"), Trajectory(name="judge_1")]
    assert TrajectoryGroup(judges, group_id="t0:judge").group_role == "judge"
    assert TrajectoryGroup(judges, group_id="t0:judge").task_id == "t0"
    assert TrajectoryGroup([Trajectory(name="solver")], group_id="x:y:z").group_role == "y"
    assert TrajectoryGroup([Trajectory(name="a"), Trajectory(name="b")]).group_role == "all_groups"
    assert TrajectoryGroup([Trajectory(name="a")], group_id="t0:").group_role == "all_groups"
    assert TrajectoryGroup([Trajectory(name="a")], group_id="t0:x", group_role="judge").group_role == "judge"


def test_an_episode_without_a_task_id_takes_it_from_its_id_as_rllm_does():
    episode = Episode(id="t0:3")
    assert (episode.task_id, episode.rollout_idx) == ("t0", 3)
    assert Episode(id="t0:3", task_id="other").task_id == "other"  # given: it wins
    assert Episode(task_id="t1", rollout_idx=2).id == "t1:2"
    assert Episode(id="no-colon").task_id == "no-colon"  # rLLM: id.split(":")[0]


@pytest.mark.parametrize(
    "episode_id, task_id, rollout_idx",
    [
        ("t0:2:7", "t0", 2),  # rLLM: rollout_idx = id.split(":")[1], the second part, not the last
        ("t0:2:x", "t0", 2),  # a last part that is no number changes nothing
        ("t0:x:7", "t0", 0),  # a second part that is no number: nothing to read, whatever follows
        ("t0:12:3:4", "t0", 12),
    ],
)
def test_the_rollout_index_is_read_from_the_ids_second_part_even_when_more_parts_follow(
    episode_id, task_id, rollout_idx
):
    episode = Episode(id=episode_id)
    assert (episode.id, episode.task_id, episode.rollout_idx) == (episode_id, task_id, rollout_idx)


def test_a_scalar_step_advantage_covers_exactly_the_step_own_response_mask():
    step = Step(response_ids=[1, 2, 3, 4], response_mask=[0, 1, 1, 0], advantage=2.0)
    assert step.token_advantages().tolist() == [0.0, 2.0, 2.0, 0.0]
    # no mask: every response token
    assert Step(response_ids=[1, 2], advantage=-1.5).token_advantages().tolist() == [-1.5, -1.5]
    # no advantage: zeros
    assert Step(response_ids=[1, 2, 3]).token_advantages().tolist() == [0.0, 0.0, 0.0]


def test_token_advantages_reject_a_wrong_length_list_a_wrong_length_mask_and_other_types():
    with pytest.raises(ValueError, match="3 response tokens"):
        Step(response_ids=[1, 2, 3], advantage=[0.1, 0.2]).token_advantages()
    with pytest.raises(ValueError, match="response_mask has 1"):
        Step(response_ids=[1, 2], response_mask=torch.tensor([1]), advantage=1.0).token_advantages()
    with pytest.raises(TypeError, match="dict"):
        Step(response_ids=[1], advantage={"a": 1}).token_advantages()


def test_trajectories_get_distinct_uids():
    assert Trajectory().uid != Trajectory().uid


@pytest.mark.parametrize(
    ("mask", "shown"),
    [([1, 2, 0], "2 at token 1"), (torch.tensor([1.0, 0.5]), "0.5 at token 1"), ([-1, 1], "-1 at token 0")],
)
def test_a_response_mask_with_a_value_other_than_zero_or_one_is_refused_instead_of_scaling_the_advantage(mask, shown):
    step = Step(response_ids=[5, 6, 7][: len(mask)], response_mask=mask, advantage=1.0)
    with pytest.raises(
        InvalidTrajectoryError,
        match=f"response_mask holds {shown}; it must hold only 0 \\(not trained\\) and 1 \\(trained\\)",
    ):
        step.token_advantages()


def test_a_bad_response_mask_in_a_token_batch_is_reported_with_its_task_group_trajectory_and_step():
    good = Step(prompt_ids=[1], response_ids=[5, 6, 7], logprobs=[0.0] * 3)
    bad = Step(prompt_ids=[1], response_ids=[5, 6, 7], logprobs=[0.0] * 3, response_mask=[1, 2, 0])
    group = TrajectoryGroup(
        [Trajectory(name="solver", reward=1.0, steps=[good, bad])], group_id="t:solver", task_id="t"
    )
    with pytest.raises(
        InvalidTrajectoryError,
        match=r"task 't', group 't:solver', trajectory 'solver', step 1: response_mask holds 2 at token 1",
    ):
        build_token_batch([group], pad_token_id=0)
