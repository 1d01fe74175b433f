"""Several rewards per trajectory, from the task to GDPO: the default task's two reward functions,
the workflow that scores them, the token batch and the collector that pack them, and the
start-up checks of a run that asks for ``gdpo``."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_module
from reference import gdpo_reference

from rllm_torch import AlgorithmConfig, Trajectory, TrajectoryGroup, collect_reward_and_advantage_from_trajectory_groups
from rllm_torch.cli.command_line import register_configs
from rllm_torch.cli.train_command import check_reward_components
from rllm_torch.core.errors import ConfigError, InvalidRewardsError
from rllm_torch.rllm.types import Step
from rllm_torch.rollouts import build_task
from rllm_torch.rollouts.arithmetic import one_digit_format_reward
from rllm_torch.rollouts.single_turn import SingleTurnWorkflow
from rllm_torch.trainer import compute_token_advantages
from rllm_torch.trainer.config_checks import check_run_config
from rllm_torch.trainer.pipeline.token_batch import build_token_batch

COMPONENTS = [[[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]], [[1.0, 1.0], [1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [0.0, 1.0]]]


def compose_train(*overrides: str):
    register_configs()
    with initialize_config_module(config_module="rllm_torch.configs", version_base=None):
        return compose(config_name="train", overrides=list(overrides))


def _groups(components, mask_last: bool = False) -> list[TrajectoryGroup]:
    groups = []
    for g, rows in enumerate(components):
        trajs = [
            Trajectory(
                name="solver",
                reward=row[0],
                reward_components=list(row),
                steps=[Step(prompt_ids=[1, 2], response_ids=[3, 4], response_mask=[1, 1])],
            )
            for row in rows
        ]
        groups.append(TrajectoryGroup(trajs, group_id=f"task-{g}", task_id=f"task-{g}"))
    if mask_last:  # an untrained trajectory: out of the statistics, advantage 0
        groups[0].trajectories[-1].steps[0].response_mask = [0, 0]
    return groups


def test_the_default_task_scores_correctness_and_format_and_the_workflow_records_both():
    assert [one_digit_format_reward({}, r) for r in ("7", " 7 ", "77", "", "+")] == [1.0, 1.0, 0.0, 0.0, 0.0]
    task = build_task(compose_train().task)
    assert list(task.reward_components) == ["correct", "format"]

    class Engine:
        async def generate(self, prompt):
            from rllm_torch.trainer.workflow import ModelOutput

            return ModelOutput(text="8", prompt_ids=[1], completion_ids=[5], logprobs=[-0.1], finish_reason="stop")

    workflow = SingleTurnWorkflow(Engine(), task.reward_fn, reward_components=task.reward_components)
    episode = asyncio.run(workflow.run({"prompt": "3+4=", "answer": "7"}, "t:0"))
    assert episode.trajectories[0].reward == 0.0 and episode.trajectories[0].reward_components == [0.0, 1.0]
    assert episode.metrics["reward/correct"] == 0.0 and episode.metrics["reward/format"] == 1.0


def test_the_trainers_token_batch_gives_gdpo_its_components_and_leaves_untrained_ones_out():
    batch = build_token_batch(_groups(COMPONENTS, mask_last=True), pad_token_id=0)
    assert batch.reward_components.shape == (8, 2) and batch.reward_components.dtype == torch.float64
    compute_token_advantages(
        batch, AlgorithmConfig(estimator="gdpo", estimator_options={"gdpo": {"reward_weights": [1.0, 0.5]}})
    )
    got = batch.advantages[:, -1].double().numpy()  # the last response token of each row
    trained = [COMPONENTS[0][:2], COMPONENTS[1], COMPONENTS[2]]
    want = np.concatenate(gdpo_reference(trained, [1.0, 0.5]))
    np.testing.assert_allclose(np.delete(got, 2), want, rtol=1e-6, atol=1e-6)  # float32 tokens
    assert got[2] == 0.0


def test_a_batch_without_trajectories_or_components_has_none():
    assert build_token_batch([], pad_token_id=0).reward_components is None  # a rank with nothing to train
    groups = _groups(COMPONENTS)
    for g in groups:
        for t in g.trajectories:
            t.reward_components = None
    assert build_token_batch(groups, pad_token_id=0).reward_components is None


def test_the_collector_gives_gdpo_its_components():
    groups = _groups(COMPONENTS)
    collect_reward_and_advantage_from_trajectory_groups(groups, AlgorithmConfig(estimator="gdpo"))
    got = np.array([t.steps[0].advantage for g in groups for t in g.trajectories])
    np.testing.assert_allclose(got, np.concatenate(gdpo_reference(COMPONENTS)), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("pack", ["token batch", "collector"])
def test_components_on_some_trajectories_only_are_refused_naming_one(pack):
    groups = _groups(COMPONENTS)
    groups[1].trajectories[2].reward_components = [1.0]
    with pytest.raises(InvalidRewardsError, match=r"task 'task-1'.*reward_components \[1.0\]"):
        if pack == "token batch":
            build_token_batch(groups, pad_token_id=0)
        else:
            collect_reward_and_advantage_from_trajectory_groups(groups, AlgorithmConfig(estimator="gdpo"))


def test_a_run_asking_for_gdpo_stops_at_start_up_without_two_reward_functions():
    config = compose_train("rllm.algorithm.adv_estimator=gdpo")
    check_reward_components(build_task(config.task), check_run_config(config).plan)  # the default task has two
    reverse = compose_train("task=reverse", "rllm.algorithm.adv_estimator=gdpo")
    with pytest.raises(ConfigError, match="task.name='reverse' scores 0 reward function"):
        check_reward_components(build_task(reverse.task), check_run_config(reverse).plan)
    one_weight = compose_train(
        "rllm.algorithm.adv_estimator=gdpo", "rllm.algorithm.estimator_options.gdpo.reward_weights=[1.0]"
    )
    with pytest.raises(ConfigError, match="estimator 'gdpo'.*one reward function"):
        check_run_config(one_weight)
    bad = compose_train(
        "rllm.algorithm.adv_estimator=grpo", "rllm.algorithm.estimator_options.grpo.scale_rewards=batches"
    )
    with pytest.raises(ConfigError, match="scale_rewards must be 'group'"):
        check_run_config(bad)
