"""A new user's first day (issue 49): an exception in their own code says where it was raised, once,
and a run whose every episode fails stops; settings that cannot train anything stop at start-up;
the run directory's ``config.yaml`` records the values the run used; a slip in Hydra's syntax is
one line and exit status 2; warnings are one line each."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from tiny_runs import TINY_STEPS
from trainer_fakes import make_config

from rllm_torch.backends.torch_backend.task_defaults import LengthLimitWatch
from rllm_torch.cli.run_directory import check_run_directory
from rllm_torch.cli.train_command import run
from rllm_torch.cli.warning_lines import PACKAGE_DIR, format_warning
from rllm_torch.core.errors import ConfigError, WorkflowError
from rllm_torch.rllm.config import AlgorithmConfig
from rllm_torch.rllm.plan import AdvantagePlan
from rllm_torch.rllm.types import Episode, TerminationReason, Trajectory
from rllm_torch.trainer.config_checks import check_run_config
from rllm_torch.trainer.pipeline.trainable_groups import check_groups_can_train, zero_on_groups_of_one

REWARDS = """def raises(task, response):
    return ratio(1, 0)


def ratio(a, b):
    return a / b


def raises_on_odd(task, response):
    if int(task["answer"]) % 2:
        raise ValueError(f"odd answer {task['answer']}")
    return response.strip() == task["answer"]
"""

ESTIMATOR = """from rllm_torch import register_rllm_adv_estimator


@register_rllm_adv_estimator("raises_in_step", form="tensors")
def raises_in_step(batch):
    if batch.rewards.numel() > 8:  # the start-up check's synthetic group passes
        raise KeyError("no such column")
    return batch.rewards.float(), batch.rewards.float()
"""


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m rllm_torch.train *args`` in ``tmp_path`` (with it on the Python path)."""
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"} | {"PYTHONPATH": path}
    return subprocess.run(
        [sys.executable, "-m", "rllm_torch.train", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )


def user_files(tmp_path: Path, task: str = "task=file") -> list[str]:
    """The sums file task (a+b for a, b in 0..4: 12 of the 25 answers odd) and the user's modules;
    the file task's overrides (``task="task.name=file"`` for :func:`make_config`)."""
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(5) for b in range(5)]
    (tmp_path / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "first_day_rewards.py").write_text(REWARDS)
    (tmp_path / "first_day_estimators.py").write_text(ESTIMATOR)
    return [task, f"task.train_path={tmp_path / 'sums.jsonl'}"]


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip() and "HYDRA_FULL_ERROR" not in line]


# 1. errors in the user's code


def test_a_reward_that_raises_is_said_once_with_the_users_file_line_and_exception(tmp_path):
    done = cli(tmp_path, *user_files(tmp_path), "task.reward_fn=first_day_rewards:raises", *TINY_STEPS[:3])
    assert done.returncode == 2, done.stderr[-2000:]
    lines = error_lines(done.stderr)
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    where = f"ZeroDivisionError: division by zero ({tmp_path / 'first_day_rewards.py'}:6 in ratio: return a / b)"
    assert lines[0].startswith("rllm-torch-train: WorkflowError: episode ") and where in lines[0]


def test_an_estimator_of_the_user_that_raises_mid_run_is_one_block_naming_its_line(tmp_path):
    user_files(tmp_path)
    done = cli(tmp_path, "imports=[first_day_estimators]", "rllm.algorithm.adv_estimator=raises_in_step", *TINY_STEPS)
    assert done.returncode == 1, done.stderr[-2000:]
    assert error_lines(done.stderr) == [
        f"rllm-torch-train: error in your code: KeyError: 'no such column' ({tmp_path / 'first_day_estimators.py'}:7 in "
        'raises_in_step: raise KeyError("no such column"))'
    ]


def test_a_run_whose_every_episode_fails_stops_after_three_steps_even_with_raise_on_error_false(tmp_path, monkeypatch):
    task = user_files(tmp_path, "task.name=file")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = make_config(
        tmp_path / "run",
        *task,
        "task.reward_fn=first_day_rewards:raises",
        "rllm.workflow.raise_on_error=false",
        *TINY_STEPS[:3],
        "data.train_batch_size=5",
        "rllm.rollout.n=2",
        "rllm.trainer.total_batches=5",
    )
    with warnings.catch_warnings(record=True) as caught, pytest.raises(WorkflowError) as stopped:
        warnings.simplefilter("always")
        run(config)
    assert str(stopped.value).startswith("steps 1-3: every episode failed (10 in the last), so nothing trains")
    assert "ZeroDivisionError: division by zero (" in str(
        stopped.value
    ) and "first_day_rewards.py:6 in ratio: return a / b)" in str(
        stopped.value
    )  # the innermost line of the user's code, not the reward's own
    said = [str(w.message) for w in caught if "episodes failed" in str(w.message)]
    assert len(said) == 1 and said[0].startswith("step 1: all 10 episodes failed"), said  # once, not every step
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["batch/termination_reason/error"] for r in rows if "batch/termination_reason/error" in r] == [1.0, 1.0]


def test_a_run_where_some_episodes_fail_goes_on_and_counts_them(tmp_path, monkeypatch):
    task = user_files(tmp_path, "task.name=file")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = make_config(
        tmp_path / "run",
        *task,
        "task.reward_fn=first_day_rewards:raises_on_odd",
        "rllm.workflow.raise_on_error=false",
        *TINY_STEPS[:3],
        "data.train_batch_size=25",
        "rllm.rollout.n=2",
        "rllm.trainer.total_batches=4",
    )
    run(config)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    errors = [r["batch/termination_reason/error"] for r in rows if "batch/termination_reason/error" in r]
    # the whole set every step: 12 of the 25 sums a+b (a, b in 0..4) are odd
    assert errors == [12 / 25] * 4


# 3. settings that cannot train anything


def settings_of(*overrides: str):
    settings = check_run_config(make_config("unused", *overrides))
    return settings.config, settings.plan


@pytest.mark.parametrize(
    ("overrides", "fix"),
    [
        (["rllm.rollout.n=1"], "Set rllm.rejection_sample.min_trajs_per_group=1, or rllm.rollout.n>=2."),
        (
            ["rllm.rollout.n=2", "rllm.rejection_sample.min_trajs_per_group=3"],
            "Set rllm.rejection_sample.min_trajs_per_group=2, or rllm.rollout.n>=3.",
        ),
        (
            ["rllm.rollout.n=1", "rllm.algorithm.adv_estimator=maxrl"],
            "Set rllm.rejection_sample.min_trajs_per_group=1 AND rllm.algorithm.adv_estimator=reinforce, "
            "or rllm.rollout.n>=2.",
        ),
        (
            [
                "rllm.rollout.n=1",
                "rllm.rejection_sample.min_trajs_per_group=1",
                "rllm.algorithm.filter_groups.enable=true",
            ],
            "Set rllm.algorithm.filter_groups.enable=false, or rllm.rollout.n>=2.",
        ),
        (
            ["rllm.rollout.n=1", "rllm.rejection_sample.min_trajs_per_group=1", "rllm.rejection_sample.enable=true"],
            "Set rllm.rejection_sample.enable=false, or rllm.rollout.n>=2.",
        ),
    ],
)
def test_settings_under_which_every_group_is_dropped_name_every_setting_to_change(overrides, fix):
    config, plan = settings_of(*overrides)
    with pytest.raises(ConfigError, match="cannot train anything") as refused:
        check_groups_can_train(config, plan, one_trajectory_per_episode=True)
    assert str(refused.value).endswith(fix)
    check_groups_can_train(config, plan, one_trajectory_per_episode=False)  # a workflow may fill a group itself


@pytest.mark.parametrize(
    "overrides",
    [
        [
            "rllm.rollout.n=1",
            "rllm.rejection_sample.min_trajs_per_group=1",
        ],  # grpo: a singleton's advantage is r/(1+eps)
        ["rllm.rollout.n=1", "rllm.rejection_sample.min_trajs_per_group=1", "rllm.algorithm.adv_estimator=reinforce"],
        ["rllm.rollout.n=2"],
        ["rllm.rollout.n=2", "rllm.algorithm.filter_groups.enable=true"],
    ],
)
def test_settings_that_can_train_pass(overrides):
    config, plan = settings_of(*overrides)
    check_groups_can_train(config, plan, one_trajectory_per_episode=True)


def test_which_estimators_give_a_group_of_one_nothing_is_asked_of_the_estimator():
    # maxrl: (r - mean) / mean = 0 for a group of one; grpo: (r - 0) / (1 + eps) (rLLM's rule); reinforce: r
    assert zero_on_groups_of_one("maxrl", AlgorithmConfig(estimator="maxrl"))
    assert not zero_on_groups_of_one("grpo", AlgorithmConfig(estimator="grpo"))
    assert not zero_on_groups_of_one("reinforce", AlgorithmConfig(estimator="reinforce"))
    assert set(AdvantagePlan(AlgorithmConfig(estimator="maxrl")).estimators) == {"maxrl"}


def test_rollout_n_of_one_stops_at_start_up_with_exit_2_and_one_line(tmp_path):
    done = cli(tmp_path, "rllm.rollout.n=1", "rllm.trainer.total_batches=2", "hydra.run.dir=run")
    assert done.returncode == 2, done.stderr[-2000:]
    assert error_lines(done.stderr) == [
        "rllm-torch-train: ConfigError: rllm.rollout.n=1 cannot train anything: each prompt's group is its 1 rollout, "
        "and rejection sampling drops every group of fewer than rllm.rejection_sample.min_trajs_per_group=2 "
        "trajectories. Set rllm.rejection_sample.min_trajs_per_group=1, or rllm.rollout.n>=2."
    ]
    assert not (tmp_path / "run").exists()  # a failed start leaves no run directory


def test_the_advised_settings_train(tmp_path):
    run(make_config(tmp_path, *TINY_STEPS, "rllm.rollout.n=1", "rllm.rejection_sample.min_trajs_per_group=1"))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    kept = [r["batch/groups_after_filter"] for r in rows if "batch/groups_after_filter" in r]
    assert kept == [8.0, 8.0]  # every prompt's group of one trains


# 4. config.yaml holds what the run used


def metric_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/") and "per_s" not in k} for r in rows]


def test_config_yaml_records_the_derived_values_with_their_sources_and_reruns_the_same_run(tmp_path):
    first = tmp_path / "first"
    run(make_config(first, *TINY_STEPS))
    text = (first / "config.yaml").read_text()
    assert "  lr: 0.001  # null: the default for a model built from scratch\n" in text
    # the default task's answers are one digit: twice one token
    assert re.search(r"\n    max_new_tokens: 2  # null: twice the longest answer's tokens \('\d': 1\)\n", text)
    recorded = OmegaConf.load(first / "config.yaml")
    assert recorded.backend.lr == 1e-3 and recorded.rllm.rollout.max_new_tokens == 2
    assert recorded.backend.num_threads == 1 and recorded.backend.share_prompts is False
    again = tmp_path / "again"
    recorded.rllm.trainer.default_local_dir = str(again)
    run(recorded)
    assert metric_rows(again) == metric_rows(first)
    assert "# null" not in (again / "config.yaml").read_text()  # nothing left to derive


def test_a_resumed_run_changes_only_what_it_was_given_to_change(tmp_path):
    run(make_config(tmp_path, *TINY_STEPS))
    run(make_config(tmp_path, *TINY_STEPS[:-1], "rllm.trainer.total_batches=3"))
    resumes = [json.loads(line) for line in (tmp_path / "resumes.jsonl").read_text().splitlines()]
    assert resumes == [
        {"step": 2, "checkpoint": resumes[0]["checkpoint"], "changed": {"rllm.trainer.total_batches": [2, 3]}}
    ]
    assert "  lr: 0.001  # null: the default for a model built from scratch\n" in (tmp_path / "config.yaml").read_text()


# 5. Hydra's own errors


@pytest.mark.parametrize(
    ("args", "start"),
    [
        (
            ["rllm.rollout.n=", "4"],
            "rllm-torch-train: ConfigError: cannot read the override `4` (a space after `rllm.rollout.n=` made `4` an "
            "argument of its own: write `rllm.rollout.n=4`)",
        ),
        (
            ["rllm.rollout.n=1,2"],
            "rllm-torch-train: ConfigError: Hydra cannot compose the config with rllm.rollout.n=1,2",
        ),
    ],
)
def test_a_hydra_syntax_slip_is_one_line_and_exit_2(tmp_path, args, start):
    done = cli(tmp_path, *args)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = error_lines(done.stderr)
    assert len(lines) == 1 and lines[0].startswith(start), done.stderr[-2000:]


# 7. warnings


def test_our_warnings_are_one_line_without_the_source_and_others_keep_where_they_came_from():
    ours = format_warning("step 3: nothing trains", UserWarning, str(PACKAGE_DIR / "trainer" / "step.py"), 170, "x")
    assert ours == "rllm-torch-train: warning: step 3: nothing trains\n"
    theirs = format_warning("old\nname", DeprecationWarning, "/home/me/train.py", 12, "call()")
    assert theirs == "/home/me/train.py:12: DeprecationWarning: old name\n"


def test_a_warning_of_a_run_prints_as_one_line(tmp_path):
    done = cli(
        tmp_path,
        *user_files(tmp_path),
        "task.reward_fn=first_day_rewards:raises",
        "rllm.workflow.raise_on_error=false",
        *TINY_STEPS[:3],
        "rllm.trainer.total_batches=1",
        "hydra.run.dir=run",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    said = [line for line in done.stderr.splitlines() if "episodes failed" in line]
    assert len(said) == 1 and said[0].startswith("rllm-torch-train: warning: step 1: all "), done.stderr[-2000:]
    assert "UserWarning" not in done.stderr and "warnings.warn" not in done.stderr


def _cut_episodes(count: int) -> list[Episode]:
    cut = TerminationReason("max_response_length_exceeded")
    return [Episode(termination_reason=cut, trajectories=[Trajectory(reward=0.0)]) for _ in range(count)]


def test_the_length_warning_needs_an_answer_longer_than_the_limit():
    fits = LengthLimitWatch(2, ("b", 1), steps=1)  # one-character answers: 2 tokens are enough
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        said = fits.observe(_cut_episodes(8))
    assert "max_new_tokens" not in (said or "") and not [w for w in caught if "max_new_tokens" in str(w.message)]
    cut = LengthLimitWatch(2, ("abc", 3), steps=1)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert cut.observe(_cut_episodes(8)).startswith("rllm.rollout.max_new_tokens=2: 100% of the responses")


def test_a_run_directory_under_proc_is_not_called_full():
    with pytest.raises(ConfigError) as refused:
        check_run_directory("/proc/run", "hydra.run.dir")
    assert "kernel" in str(refused.value) and "full" not in str(refused.value)


# 8. the training page states what the code prints


def test_the_training_pages_start_up_summary_and_lists_of_choices_are_what_the_code_prints(tmp_path, capsys):
    from rllm_torch.cli.command_line import experiment_names

    page = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text()
    sample = page.split("rllm_torch run\n", 1)[1].split("```", 1)[0].splitlines()
    run(make_config(tmp_path, "rllm.trainer.total_batches=1", "rllm.trainer.val_before_train=false"))
    printed = capsys.readouterr().out.split("rllm_torch run\n", 1)[1].splitlines()[: len(sample)]
    varies = ("  run directory", "  steps")  # the machine's path; 1 step here, the default run's 256 there
    assert [line for line in printed if not line.startswith(varies)] == [
        line for line in sample if not line.startswith(varies)
    ]
    listed = page.split("**Example experiments**", 1)[1].split("```", 1)[0]
    assert "`train.yaml`" in listed  # the base every experiment extends
    assert [name for name in experiment_names() if f"`{name}`" not in listed and name != "train"] == []
    assert "the message lists `smollm2, tiny, tiny_llama`" in page
