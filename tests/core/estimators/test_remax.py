"""ReMax (``remax``): a hand table, a float64 per-group loop on ragged and equal groups, compiled,
bad baselines; through the per-role rule (the collector) with ``TrajectoryGroup.reward_baseline``;
and a real training run whose greedy baseline episodes are logged and subtracted."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_runs import TINY_STEPS
from trainer_fakes import make_config

from rllm_torch import (
    AlgorithmConfig,
    GroupedRewards,
    Step,
    Trajectory,
    TrajectoryGroup,
    collect_reward_and_advantage_from_trajectory_groups,
    compute_advantages,
)
from rllm_torch.cli.train_command import run
from rllm_torch.core.errors import ConfigError, InvalidRewardsError, InvalidRewardTypeError
from rllm_torch.core.estimators import remax
from rllm_torch.rllm.plan import AdvantagePlan
from rllm_torch.trainer.config_checks import check_run_config


def reference(groups, baselines):
    return [r - b for g, b in zip(groups, baselines, strict=True) for r in g]


def test_hand_table():
    # group 0 beats its greedy 0.5 once; group 1 all equal to its greedy reward; group 2 equal
    # rewards below theirs: -1 each (no group centring); a group of one: r - b
    groups, baselines = [[1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0], [0.25]], [0.5, 1.0, 1.0, 1.0]
    adv, ret = remax(GroupedRewards.from_groups(groups), baselines=torch.tensor(baselines, dtype=torch.float64))
    assert adv.tolist() == [0.5, -0.5, 0.0, 0.0, 0.0, -1.0, -1.0, -0.75]
    assert ret.tolist() == [1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.25]


@pytest.mark.parametrize("seed", range(4))
def test_matches_a_float64_loop_on_ragged_and_equal_groups(seed):
    gen = torch.Generator().manual_seed(seed)
    groups = [torch.rand(int(n), generator=gen).tolist() for n in torch.randint(1, 7, (10,), generator=gen)]
    baselines = torch.rand(10, generator=gen, dtype=torch.float64)
    got, _ = compute_advantages(GroupedRewards.from_groups(groups), "remax", baselines=baselines)
    torch.testing.assert_close(got, torch.tensor(reference(groups, baselines.tolist()), dtype=torch.float64))
    equal = torch.rand(6, 4, generator=gen)  # float32 rewards: float32 advantages, the baselines cast
    got, _ = remax(GroupedRewards.from_padded(equal), baselines=baselines[:6])
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, (equal - baselines[:6, None].float()).reshape(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layout", ["padded", "flat", "groups"])
def test_the_returns_are_a_tensor_of_their_own_writing_into_them_changes_neither_the_rewards_nor_the_advantages(
    dtype, layout
):
    """The docstring's "new, detached tensors": the returns hold the rewards' values but not their
    storage, even where no cast or reshape copies them (float32 and float64 stay in their dtype,
    a flat or padded batch is already [N])."""
    rewards = torch.tensor([[1.0, 0.0, 0.5], [0.25, 0.75, 1.0]], dtype=dtype)
    batch = {
        "padded": lambda: GroupedRewards.from_padded(rewards),
        "flat": lambda: GroupedRewards.from_flat(rewards.reshape(-1), torch.tensor([0, 0, 0, 1, 1, 1])),
        "groups": lambda: GroupedRewards.from_groups(list(rewards)),
    }[layout]()
    baselines = torch.tensor([0.5, 1.0], dtype=dtype)
    adv, ret = remax(batch, baselines=baselines)
    assert ret.untyped_storage().data_ptr() not in (
        batch.rewards.untyped_storage().data_ptr(),
        rewards.untyped_storage().data_ptr(),
        adv.untyped_storage().data_ptr(),
    )
    ret.add_(100.0)  # a caller scaling or shifting its returns in place
    ret[0] = -7.0
    # the rewards as given, and r - b: [1 - .5, 0 - .5, .5 - .5, .25 - 1, .75 - 1, 1 - 1]
    assert batch.rewards.reshape(-1).tolist() == [1.0, 0.0, 0.5, 0.25, 0.75, 1.0]
    assert rewards.reshape(-1).tolist() == [1.0, 0.0, 0.5, 0.25, 0.75, 1.0]
    assert adv.tolist() == [0.5, -0.5, 0.0, -0.75, -0.25, 0.0]
    # and the other way: writing into the rewards afterwards does not change the returns
    batch.rewards.zero_()
    assert ret.tolist() == [-7.0, 100.0, 100.5, 100.25, 100.75, 101.0]


def test_compiled_with_fullgraph_it_gives_the_eager_numbers():
    rewards, baselines = (torch.rand(6, 4) > 0.5).float(), torch.rand(6)
    compiled = torch.compile(
        lambda r, b: remax(GroupedRewards.from_padded(r, validate=False), baselines=b)[0], fullgraph=True
    )
    torch.testing.assert_close(
        compiled(rewards, baselines), remax(GroupedRewards.from_padded(rewards), baselines=baselines)[0]
    )


@pytest.mark.parametrize(
    "baselines, message",
    [
        (None, "remax needs baselines="),
        (torch.zeros(3), r"\[G\] = \[2\] floating-point tensor"),
        (torch.zeros(2, dtype=torch.int64), r"got torch.int64"),
        ([0.0, 0.0], r"got list"),
    ],
)
def test_missing_or_ill_shaped_baselines_are_refused(baselines, message):
    with pytest.raises(InvalidRewardsError, match=message):
        remax(GroupedRewards.from_groups([[1.0, 0.0], [1.0]]), baselines=baselines)


def _group(rewards, baseline, task_id):
    trajs = [Trajectory(name="solver", reward=r, steps=[Step(response_ids=[7])]) for r in rewards]
    group = TrajectoryGroup(trajs, group_id=f"{task_id}:solver", task_id=task_id)
    group.reward_baseline = baseline
    return group


def test_the_collector_subtracts_each_groups_reward_baseline_and_refuses_a_group_without_one():
    groups = [_group([1.0, 0.0, 1.0], 1.0, "a"), _group([0.0, 1.0], 0.0, "b")]
    collect_reward_and_advantage_from_trajectory_groups(groups, AlgorithmConfig(estimator="remax"))
    assert [t.steps[0].advantage for g in groups for t in g.trajectories] == [0.0, -1.0, 0.0, 0.0, 1.0]
    groups[1].reward_baseline = None
    with pytest.raises(ConfigError, match=r"role 'solver': remax's baseline .* 1 of the role's 2 group\(s\) have none"):
        collect_reward_and_advantage_from_trajectory_groups(groups, AlgorithmConfig(estimator="remax"))


TINY = (
    *TINY_STEPS,
    "rllm.algorithm.adv_estimator=remax",
    "rllm.episode_logging.log_episodes=true",
)


def train_on_file(tmp_path, monkeypatch, reward_source: str, *overrides: str) -> list[dict]:
    """A tiny remax run on 8 prompts ``"a+b="`` of a file, scored by ``reward(task, response)``
    written in ``reward_source``; its ``metrics.jsonl`` rows."""
    module = "reward_" + "".join(c if c.isalnum() else "_" for c in tmp_path.name)  # one module per test
    (tmp_path / f"{module}.py").write_text(reward_source)
    monkeypatch.syspath_prepend(str(tmp_path))
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(2)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = ("task.name=file", f"task.train_path={tmp_path / 'train.jsonl'}", f"task.reward_fn={module}:reward")
    run(make_config(tmp_path, *[o for o in TINY if not o.startswith("task.train_size")], *data, *overrides))
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def test_a_training_run_samples_one_greedy_episode_per_prompt_and_subtracts_its_reward(tmp_path, monkeypatch):
    # a reward the random tiny model earns in part (its share of '=', whose greedy answer is "=="),
    # scaled by the prompt's answer, so the greedy rewards differ from 0 and from prompt to prompt
    rows = train_on_file(
        tmp_path,
        monkeypatch,
        "def reward(task, response):\n"
        "    return response.count('=') / max(len(response), 1) * (1 + int(task['answer']))\n",
    )
    train = {r["step"]: r for r in rows if "actor/loss" in r}
    assert sorted(train) == [1, 2]
    for step, row in train.items():
        greedy = [json.loads(line) for line in (tmp_path / "episodes" / f"baseline_step_{step}.jsonl").open()]
        sampled = [json.loads(line) for line in (tmp_path / "episodes" / f"train_step_{step}.jsonl").open()]
        assert len(greedy) == 8 and {e["rollout_idx"] for e in greedy} == {4}  # one per prompt, after the 4 sampled
        baseline = {e["task_id"]: e["trajectories"][0]["reward"] for e in greedy}
        assert 0 < sum(baseline.values()) and len(set(baseline.values())) > 1
        assert row["batch/remax_greedy_reward"] == pytest.approx(sum(baseline.values()) / len(baseline))
        want = [e["trajectories"][0]["reward"] - baseline[e["task_id"]] for e in sampled]
        assert row["advantage/solver/mean"] == pytest.approx(sum(want) / len(want), abs=1e-9)
        assert (row["advantage/solver/min"], row["advantage/solver/max"]) == pytest.approx((min(want), max(want)))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (("rllm.algorithm.filter_groups.enable=true",), "remax samples one greedy rollout of each prompt"),
        (("rllm.stepwise_advantage.mode=turn_level",), "its baseline is one greedy episode's reward per prompt"),
    ],
)
def test_settings_remax_cannot_honour_stop_the_run_at_start_up(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        check_run_config(make_config(tmp_path, *TINY, *overrides))


class _SamplingEngine:
    """A workflow engine that samples each task once through the backend's rollout engine."""

    def __init__(self, rollout_engine):
        self.rollout_engine = rollout_engine

    async def execute_tasks(self, tasks, task_ids, rollout_indices):
        outputs = [await self.rollout_engine.generate(task["prompt"]) for task in tasks]
        return [(i, k, out.response_ids) for i, k, out in zip(task_ids, rollout_indices, outputs, strict=True)]


def test_the_backends_baseline_episodes_are_the_policys_argmax_and_its_sampling_is_not_left_greedy():
    import asyncio

    from trainer_rank_tasks import ALPHABET, backend_config

    from rllm_torch.backends.torch_backend.backend import TorchBackend
    from rllm_torch.backends.torch_backend.tokenizer import encode_prompts

    backend = TorchBackend(backend_config("rllm.rollout.n=3", "rllm.rollout.max_new_tokens=1"), alphabet=ALPHABET)
    backend.init_rollout_engine()
    engine = _SamplingEngine(backend.rollout_engine)
    batch = [(f"t{a}", {"prompt": f"{a}+1="}) for a in range(6)]
    greedy = asyncio.run(backend.generate_baseline_episodes(batch, engine))
    assert [(i, k) for i, k, _ in greedy] == [(f"t{a}", 3) for a in range(6)]  # one per task, index n
    ids = encode_prompts(backend.tokenizer, [task["prompt"] for _, task in batch], apply_chat_template=False)
    with torch.no_grad():
        argmax = [int(backend.actor.model(torch.tensor([p])).logits[0, -1].argmax()) for p in ids]
    assert [r for _, _, r in greedy] == [[t] for t in argmax]
    assert backend.rollout_engine.params.temperature == 1.0  # training's sampling again


def test_with_raise_on_error_false_a_group_whose_greedy_episode_failed_is_left_out_and_counted(tmp_path, monkeypatch):
    # the reward fails on the untrained model's greedy answer "==" (and on any sample that equals it)
    rows = train_on_file(
        tmp_path,
        monkeypatch,
        "def reward(task, response):\n"
        "    if response == '==':\n"
        "        raise ValueError('no score for ==')\n"
        "    return float(response.strip() == task['answer'])\n",
        "rllm.workflow.raise_on_error=false",
    )
    counted = [r for r in rows if "batch/remax_groups_without_baseline" in r]
    assert len(counted) == 2  # both steps ran
    for row in counted:
        greedy = [json.loads(line) for line in (tmp_path / "episodes" / f"baseline_step_{row['step']}.jsonl").open()]
        failed = sum(e["termination_reason"] == "error" for e in greedy)
        assert failed > 0 and row["batch/remax_groups_without_baseline"] == failed


@pytest.mark.parametrize(
    "baseline, error, message",
    [
        ("0.5", InvalidRewardTypeError, r"group 'b:solver': reward_baseline: reward '0.5' of type str"),
        ([0.5], InvalidRewardTypeError, r"reward_baseline: reward \[0.5\] of type list"),
        (float("inf"), InvalidRewardsError, r"group 'b:solver': reward_baseline inf is not finite"),
        (float("nan"), InvalidRewardsError, r"reward_baseline nan is not finite"),
    ],
)
def test_a_reward_baseline_that_is_not_a_finite_number_is_refused_naming_the_group(baseline, error, message):
    groups = [_group([1.0, 0.0], 0.5, "a"), _group([0.0, 1.0], baseline, "b")]
    with pytest.raises(error, match=message):
        collect_reward_and_advantage_from_trajectory_groups(groups, AlgorithmConfig(estimator="remax"))


def test_baselines_are_no_config_option():
    with pytest.raises(ConfigError, match=r"estimator_options.remax.baselines is not an option"):
        AlgorithmConfig(estimator="remax", estimator_options={"remax": {"baselines": [0.5]}})
    with pytest.raises(ConfigError, match=r"estimator 'remax' takes no option 'bogus'; it takes: no option"):
        compute_advantages(GroupedRewards.from_groups([[1.0]]), "remax", bogus=1)


def test_rejection_sampling_that_would_drop_every_single_rollout_group_stops_the_run_at_start_up(tmp_path):
    overrides = [o for o in TINY if "episode_logging" not in o]
    with pytest.raises(ConfigError, match="cannot train anything") as raised:
        run(make_config(tmp_path, *overrides, "rllm.rollout.n=1", "rllm.rejection_sample.enable=true"))
    assert str(raised.value).endswith(
        "Set rllm.rejection_sample.min_trajs_per_group=1 AND rllm.rejection_sample.enable=false, or rllm.rollout.n>=2."
    )


def test_a_group_that_already_carries_a_baseline_keeps_it_when_the_greedy_ones_are_attached():
    from rllm_torch.rllm.types import Episode, Step, Trajectory
    from rllm_torch.trainer.pipeline.baselines import attach_reward_baselines
    from rllm_torch.trainer.pipeline.transform import TransformConfig

    def group(task, baseline=None):
        trajectories = [Trajectory(name="solver", reward=r, steps=[Step(response_ids=[1])]) for r in (1.0, 0.0)]
        return TrajectoryGroup(trajectories, group_id=f"{task}:solver", reward_baseline=baseline)

    greedy = [
        Episode(task_id=task, trajectories=[Trajectory(name="solver", reward=r, steps=[Step(response_ids=[1])])])
        for task, r in (("a", 0.25), ("b", 0.75))
    ]
    groups = [group("a", baseline=0.5), group("b"), group("c")]  # a: rejection sampling's, from an earlier step
    kept, metrics = attach_reward_baselines(
        groups, greedy, AdvantagePlan(AlgorithmConfig(estimator="remax")), TransformConfig()
    )
    assert [(g.group_id, g.reward_baseline) for g in kept] == [("a:solver", 0.5), ("b:solver", 0.75)]
    # c has no greedy episode: left out and counted; the mean baseline is over the kept groups' (.5 + .75) / 2
    assert metrics == {"batch/remax_groups_without_baseline": 1.0, "batch/remax_greedy_reward": 0.625}
    # a role whose estimator does not need baselines keeps its groups without one
    kept, _ = attach_reward_baselines(
        [group("c")], greedy, AdvantagePlan(AlgorithmConfig(estimator="grpo")), TransformConfig()
    )
    assert [g.group_id for g in kept] == ["c:solver"]
