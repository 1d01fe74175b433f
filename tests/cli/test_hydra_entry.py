"""The Hydra entry point: composition, overrides, typos and bad input fail before training."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException

from rllm_torch.cli.command_line import register_configs
from rllm_torch.cli.train_command import run
from rllm_torch.core.errors import (
    CheckpointMismatchError,
    ConfigError,
    DatasetNotFoundError,
    ModelNotFoundError,
    UnknownBackendError,
    UnknownEstimatorError,
)


def compose_train(*overrides: str):
    register_configs()
    with initialize_config_module(config_module="rllm_torch.configs", version_base=None):
        return compose(config_name="train", overrides=list(overrides))


def test_the_default_config_composes_with_rllms_keys_and_the_three_groups():
    config = compose_train()
    assert config.rllm.algorithm.adv_estimator == "grpo" and config.rllm.rollout.n == 8
    assert config.rllm.stepwise_advantage.mode == "broadcast" and config.rllm.workflow.retry_limit == 3
    assert (config.model.arch, config.task.name, config.backend.name) == ("gpt2", "arithmetic", "torch")
    assert {"rejection_sample", "compact_filtering", "episode_logging", "trainer"} <= set(config.rllm)


def test_the_run_directory_depends_only_on_project_and_experiment_so_the_same_command_resumes():
    register_configs()
    with initialize_config_module(config_module="rllm_torch.configs", version_base=None):
        config = compose(config_name="train", return_hydra_config=True, overrides=["rllm.trainer.experiment_name=long"])
    assert config.hydra.run.dir == "outputs/rllm_torch/long"
    trainer = config.rllm.trainer
    assert (trainer.resume_mode, trainer.save_freq, trainer.max_checkpoints_to_keep, trainer.log_table_every) == (
        "auto",
        32,
        3,
        32,
    )


def test_hydra_logs_to_the_console_only_so_no_empty_log_file_lands_in_the_run_directory():
    register_configs()
    with initialize_config_module(config_module="rllm_torch.configs", version_base=None):
        config = compose(config_name="train", return_hydra_config=True)
    handlers = config.hydra.job_logging.handlers
    assert "file" not in handlers and all(h["class"] != "logging.FileHandler" for h in handlers.values())


def test_overrides_change_the_estimator_and_the_group_size():
    config = compose_train("rllm.algorithm.adv_estimator=rloo", "rllm.rollout.n=4", "model=tiny_llama")
    assert (config.rllm.algorithm.adv_estimator, config.rllm.rollout.n, config.model.arch) == ("rloo", 4, "llama")


def test_a_misspelled_key_fails_at_composition_naming_the_key():
    with pytest.raises(ConfigCompositionException, match="rolout"):
        compose_train("rllm.rolout.n=4")


def test_an_override_of_the_wrong_type_fails_at_composition():
    with pytest.raises(ConfigCompositionException, match="rollout.n"):
        compose_train("rllm.rollout.n=four")


@pytest.mark.parametrize(
    ("override", "error", "match"),
    [
        ("backend.name=jax", UnknownBackendError, "backend.name"),
        ("rllm.algorithm.adv_estimator=gpro", UnknownEstimatorError, "gpro"),
        ("task.name=nope", ConfigError, "task.name"),
        ("model.path=/does/not/exist", ModelNotFoundError, "model.path"),
        ("rllm.algorithm.loss_fn=dpo", ConfigError, "loss_fn"),
        ("rllm.algorithm.loss_agg_mode=seq-sum", ConfigError, "loss_agg_mode"),
        ("rllm.rollout.top_p=0", ConfigError, "rllm.rollout.top_p"),
        ("task.train_path=/nonexistent.jsonl", ConfigError, "task.train_path"),
    ],
)
def test_bad_settings_fail_before_training_starts(tmp_path, override, error, match):
    config = compose_train(override, f"rllm.trainer.default_local_dir={tmp_path}")
    with pytest.raises(error, match=match):
        run(config)
    assert not (tmp_path / "metrics.jsonl").exists()


def test_restarting_with_an_incompatible_change_fails_before_touching_the_run_directory(tmp_path):
    tiny = [
        "task.train_size=16",
        "task.val_size=4",
        "data.train_batch_size=8",
        "rllm.rollout.n=2",
        "model.hidden_size=32",
        "rllm.trainer.total_batches=1",
        "rllm.trainer.logger=[jsonl]",
        f"rllm.trainer.default_local_dir={tmp_path}",
    ]
    run(compose_train(*tiny))
    before = {name: (tmp_path / name).read_bytes() for name in ("config.yaml", "metrics.jsonl")}
    with pytest.raises(CheckpointMismatchError, match="model.hidden_size: 32 in the checkpoint, 64 now"):
        run(compose_train(*tiny, "model.hidden_size=64"))
    assert {name: (tmp_path / name).read_bytes() for name in before} == before


def test_a_missing_dataset_file_fails_before_training_starts(tmp_path):
    config = compose_train(
        "task=file", f"task.train_path={tmp_path / 'missing.jsonl'}", f"rllm.trainer.default_local_dir={tmp_path}"
    )
    with pytest.raises(DatasetNotFoundError, match="missing.jsonl"):
        run(config)


def test_a_user_jsonl_dataset_and_reward_function_train(tmp_path):
    rows = [{"question": f"{i}?", "solution": str(i)} for i in range(4)]
    for split in ("train", "val"):
        (tmp_path / f"sums_{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = compose_train(
        "task=file",
        f"task.train_path={tmp_path / 'sums_train.jsonl'}",
        f"task.val_path={tmp_path / 'sums_val.jsonl'}",
        "task.prompt_key=question",
        "task.answer_key=solution",
        "task.reward_fn=rllm_torch.rollouts.task:exact_match_reward",
        "model.hidden_size=32",
        "data.train_batch_size=4",
        "rllm.rollout.n=2",
        "rllm.trainer.total_batches=1",
        f"rllm.trainer.default_local_dir={tmp_path / 'run'}",
        "rllm.trainer.logger=[jsonl]",
    )
    assert config.rllm.trainer.experiment_name == "file-sums"  # not the arithmetic run's directory
    trainer = run(config)
    assert "val/sums/pass@1" in trainer.val_history[-1][1]  # one data source for both splits


def test_each_task_runs_in_its_own_default_directory():
    for task, name in (("arithmetic", "arithmetic"), ("chain", "chain"), ("distill", "distill")):
        config = compose_train(f"task={task}")
        assert config.rllm.trainer.experiment_name == name


def test_python_m_rllm_torch_train_runs_a_short_training_in_a_subprocess(tmp_path):
    overrides = [
        "rllm.trainer.total_batches=2",
        "task.train_size=32",
        "task.val_size=8",
        "data.train_batch_size=16",
        "rllm.rollout.n=4",
        f"hydra.run.dir={tmp_path}",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "rllm_torch.train", *overrides], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "val/arithmetic/pass@1" in done.stdout
    assert (
        (tmp_path / "config.yaml").exists()
        and (tmp_path / "metrics.jsonl").exists()
        and (tmp_path / "checkpoints" / "final").is_dir()
    )
    assert not list(tmp_path.glob("*.log")), "Hydra's job log file would be empty: the console output is the log"
    # piped, not a terminal: no progress bars (tqdm's rule for ours, and transformers' shard-writing bar)
    assert "\r" not in done.stderr and "train:" not in done.stderr and "shards" not in done.stderr, done.stderr[-1000:]


def test_python_m_rllm_torch_train_with_a_typo_exits_with_an_error_naming_the_key(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "rllm_torch.train", "rllm.trainer.totl_epochs=1", f"hydra.run.dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "totl_epochs" in done.stderr


def test_the_new_task_options_and_loss_keys_compose_from_the_command_line():
    chain = compose_train(
        "task=chain",
        "rllm.algorithm.loss_fn=cispo",
        "rllm.algorithm.loss_agg_mode=seq-mean-token-sum-norm",
        "rllm.algorithm.loss_agg_horizon=4",
    )
    assert (chain.task.name, chain.task.turns, chain.task.max_sum, chain.rllm.algorithm.loss_agg_horizon) == (
        "chain",
        2,
        5,
        4,
    )
    distill = compose_train(
        "task=distill", "task.mix_rl=true", "rllm.algorithm.use_precomputed_advantage=true", "backend.dro_beta=0.1"
    )
    assert distill.task.mix_rl and distill.backend.dro_beta == 0.1
    assert compose_train("task=reasoning_gym").task.dataset == "leg_counting"


@pytest.mark.parametrize("key", ["hydra.run.dir", "rllm.trainer.default_local_dir"])
def test_a_run_directory_under_a_regular_file_is_one_line_exit_2_and_leaves_nothing(tmp_path, key):
    (tmp_path / "notes.txt").write_text("a file, not a directory")
    done = subprocess.run(
        [sys.executable, "-m", "rllm_torch.train", f"{key}={tmp_path / 'notes.txt' / 'run'}", "model.hidden_size=32"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert f"{key}={tmp_path / 'notes.txt' / 'run'}: {tmp_path / 'notes.txt'} is a file, not a directory" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # no outputs/ left behind


def test_the_python_route_and_the_command_line_put_a_run_in_one_directory(tmp_path):
    # rllm.trainer.default_local_dir unset: UnifiedTrainer (and run() without Hydra) use
    # outputs/<project>/<experiment>, the directory Hydra's command line runs in, so either route resumes the other
    from rllm_torch.trainer.logs.run_directory import run_directory
    from rllm_torch.trainer.schema import typed_run_config

    register_configs()
    overrides = ["rllm.trainer.project_name=proj", "rllm.trainer.experiment_name=exp"]
    with initialize_config_module(config_module="rllm_torch.configs", version_base=None):
        config = compose(config_name="train", return_hydra_config=True, overrides=overrides)
    assert config.hydra.run.dir == "outputs/proj/exp"
    typed = typed_run_config({"rllm": {"trainer": {"project_name": "proj", "experiment_name": "exp"}}})
    assert run_directory(typed) == Path("outputs/proj/exp")
    typed.rllm.trainer.default_local_dir = str(tmp_path / "mine")
    assert run_directory(typed) == tmp_path / "mine"  # given: used as it is
