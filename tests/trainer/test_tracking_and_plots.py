"""Logs and curves: metrics.jsonl on resume, the console table, TensorBoard, wandb when it is
missing, rllm-torch-plot, and the data loader's per-epoch order that resuming relies on."""

from __future__ import annotations

import builtins
import json

import pytest

from rllm_torch.backends.torch_backend.data import TaskDataLoader
from rllm_torch.cli.plot import main as plot_main
from rllm_torch.cli.plot import plot_run, read_metrics
from rllm_torch.core.errors import ConfigError
from rllm_torch.trainer.logs.console_sink import ConsoleSink
from rllm_torch.trainer.logs.tracking import Tracking


def train_row(step, reward):
    return {
        "reward/solver/mean": reward,
        "advantage/solver/mean": 0.0,
        "advantage/solver/std": 1.0,
        "actor/loss": 0.5 - step / 10,
        "time/step": 0.1,
    }


def write_run(run_dir, steps=6):
    logger = Tracking(["jsonl"], run_dir=run_dir)
    logger.open(resume_step=-1)
    for step in range(1, steps + 1):
        logger.log(train_row(step, step / steps), step=step)
        if step % 3 == 0:
            logger.log({"val/arithmetic/pass@1": step / 10, "val/arithmetic/pass@4": step / 5}, step=step)
    logger.finish()


def test_opening_metrics_jsonl_at_a_resume_step_drops_later_rows_and_a_half_written_line(tmp_path):
    write_run(tmp_path)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 7, "reward/sol')  # killed mid-write
    logger = Tracking(["jsonl"], run_dir=tmp_path)
    logger.open(resume_step=3)
    logger.log({"x": 1.0}, step=4)
    logger.finish()
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [
        1,
        2,
        3,
        3,
        4,
    ]


def test_a_fresh_run_starts_metrics_jsonl_empty(tmp_path):
    write_run(tmp_path)
    logger = Tracking(["jsonl"], run_dir=tmp_path)
    logger.open(resume_step=-1)
    logger.finish()
    assert (tmp_path / "metrics.jsonl").read_text() == ""


def test_the_console_prints_a_metrics_table_every_table_every_steps_and_a_line_per_validation(capsys):
    sink = ConsoleSink(table_every=2)
    for step in (1, 2, 3):
        sink.log({"step": step, **train_row(step, 0.25 * step)}, step)
    sink.log({"step": 3, "val/arithmetic/pass@1": 0.5}, 3)
    out = capsys.readouterr().out
    assert out.count("reward/solver/mean") == 1 and "mean 1-2" in out and "0.375" in out  # the mean of 0.25 and 0.5
    assert "step 3 validation: val/arithmetic/pass@1=0.500" in out


def test_the_tensorboard_logger_writes_event_files_in_the_run_directory(tmp_path):
    logger = Tracking(["tensorboard"], run_dir=tmp_path)
    logger.log({"reward/solver/mean": 0.5, "note": "text is skipped"}, step=1)
    logger.finish()
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_the_wandb_logger_without_wandb_installed_warns_and_the_other_loggers_still_log(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb":
            raise ImportError("No module named 'wandb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    logger = Tracking(["jsonl", "wandb"], run_dir=tmp_path)
    with pytest.warns(UserWarning, match=r"wandb is not installed \(pip install 'rllm_torch\[wandb\]'\)"):
        logger.log({"reward/solver/mean": 0.5}, step=1)
    logger.finish()
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 1


def test_an_unknown_logger_fails_naming_it_and_the_choices():
    with pytest.raises(ConfigError, match=r"unknown logger\(s\) \['tensorbord'\].*'tensorboard'"):
        Tracking(["tensorbord"], run_dir=".")


def test_read_metrics_gives_each_numeric_metric_its_steps_and_values(tmp_path):
    write_run(tmp_path)
    series = read_metrics(tmp_path / "metrics.jsonl")
    assert series["val/arithmetic/pass@1"] == ([3, 6], [0.3, 0.6])
    assert series["reward/solver/mean"][0] == [1, 2, 3, 4, 5, 6]


def test_plot_run_draws_a_png_of_the_run(tmp_path):
    write_run(tmp_path)
    path = plot_run(tmp_path)
    assert path == tmp_path / "curves.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rllm_torch_plot_on_a_directory_without_metrics_exits_with_a_clear_message(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        plot_main([str(tmp_path)])
    assert exited.value.code == 2 and "metrics.jsonl: no such file" in capsys.readouterr().err


def test_rllm_torch_plot_writes_the_png_where_it_is_told(tmp_path, capsys):
    write_run(tmp_path)
    plot_main([str(tmp_path), "-o", str(tmp_path / "out.png")])
    assert (tmp_path / "out.png").is_file() and capsys.readouterr().out.strip() == str(tmp_path / "out.png")


def test_set_epoch_gives_the_same_order_as_the_same_pass_of_a_fresh_loader():
    rows = [{"i": i} for i in range(10)]
    passes = TaskDataLoader(rows, 3, shuffle=True, seed=5)
    orders = [list(passes) for _ in range(3)]
    resumed = TaskDataLoader(rows, 3, shuffle=True, seed=5)
    resumed.set_epoch(2)
    assert list(resumed) == orders[2] != orders[1]
