"""The end of a run (final validation, its checkpoint, the ``checkpoints/final`` export) as a stage
of its own: a run stopped anywhere in it does the missing part on the next start, and only a run
whose every part is done is "already complete" (issue 29)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from tiny_runs import TINY
from trainer_fakes import make_config
from transformers import AutoModelForCausalLM

from rllm_torch.backends.torch_backend import backend as torch_backend
from rllm_torch.backends.torch_backend.actor import Actor
from rllm_torch.cli.train_command import run

SETTINGS = (*TINY, "rllm.trainer.total_batches=2", "rllm.trainer.save_freq=2", "rllm.trainer.logger=[jsonl]")


class Stopped(BaseException):
    """What a kill does to the process, without a process: nothing after it runs."""


def file_digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()}


def rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl without the timings (the only values that may differ between two runs)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")} for line in lines]


def finished_run(run_dir: Path, capsys) -> dict[str, str]:
    run(make_config(run_dir, *SETTINGS))
    capsys.readouterr()
    return file_digests(run_dir / "checkpoints" / "final")


def test_a_lost_final_export_is_written_again_equal_to_the_first_and_only_then_the_run_is_complete(tmp_path, capsys):
    first = finished_run(tmp_path, capsys)
    metrics = (tmp_path / "metrics.jsonl").read_text()
    shutil.rmtree(tmp_path / "checkpoints" / "final")

    run(make_config(tmp_path, *SETTINGS))
    assert "already complete" not in capsys.readouterr().out
    assert file_digests(tmp_path / "checkpoints" / "final") == first
    assert (tmp_path / "metrics.jsonl").read_text() == metrics  # nothing trained or validated again
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoints" / "final").num_parameters() > 0

    run(make_config(tmp_path, *SETTINGS))
    assert "already complete: step 2 of 2" in capsys.readouterr().out


def test_an_export_left_without_its_weights_is_not_taken_for_a_complete_one(tmp_path, capsys):
    first = finished_run(tmp_path, capsys)
    (tmp_path / "checkpoints" / "final" / "model.safetensors").unlink()  # what an in-place write left when killed
    run(make_config(tmp_path, *SETTINGS))
    assert "already complete" not in capsys.readouterr().out
    assert file_digests(tmp_path / "checkpoints" / "final") == first


def test_a_run_stopped_during_its_export_leaves_no_final_directory_and_the_next_start_writes_it(
    tmp_path, capsys, monkeypatch
):
    whole = finished_run(tmp_path / "whole", capsys)
    save = Actor.save_pretrained

    def stopped_half_way(self, path):
        save(self, path)
        (path / "model.safetensors").unlink()
        raise Stopped

    monkeypatch.setattr(Actor, "save_pretrained", stopped_half_way)
    with pytest.raises(Stopped):
        run(make_config(tmp_path / "run", *SETTINGS))
    checkpoints = tmp_path / "run" / "checkpoints"
    assert not (checkpoints / "final").exists() and list(checkpoints.glob(".tmp-final-*"))
    monkeypatch.setattr(Actor, "save_pretrained", save)

    run(make_config(tmp_path / "run", *SETTINGS))
    assert file_digests(checkpoints / "final") == whole
    assert not list(checkpoints.glob(".tmp-*"))  # the stale temporary is gone
    assert rows(tmp_path / "run") == rows(tmp_path / "whole")


def test_a_run_stopped_after_its_final_validation_validates_once_again_on_the_next_start(tmp_path, capsys, monkeypatch):
    # save_freq=2: the step-2 checkpoint is written in the loop, before the final validation; the
    # run stops after that validation is logged and before the checkpoint that records it
    finished_run(tmp_path / "whole", capsys)
    validated = torch_backend.TorchBackend.on_validation_end

    async def stopped_after_the_final_validation(self, state):
        await validated(self, state)
        if state.global_step == 2:
            raise Stopped

    monkeypatch.setattr(torch_backend.TorchBackend, "on_validation_end", stopped_after_the_final_validation)
    with pytest.raises(Stopped):
        run(make_config(tmp_path / "run", *SETTINGS))
    assert not (tmp_path / "run" / "checkpoints" / "final").exists()
    monkeypatch.undo()
    capsys.readouterr()

    run(make_config(tmp_path / "run", *SETTINGS))
    out = capsys.readouterr().out
    assert "(step 2 of 2): the final validation and the end of training" in out
    assert rows(tmp_path / "run") == rows(tmp_path / "whole")  # the final validation once, with the same values
    assert [r["step"] for r in rows(tmp_path / "run") if "val/arithmetic/pass@1" in r] == [0, 2]
    assert file_digests(tmp_path / "run" / "checkpoints" / "final") == file_digests(
        tmp_path / "whole" / "checkpoints" / "final"
    )


def test_val_only_on_a_finished_run_validates_its_final_weights_again(tmp_path, capsys):
    finished_run(tmp_path, capsys)
    run(make_config(tmp_path, *SETTINGS, "rllm.trainer.val_only=true"))
    assert "validation only (rllm.trainer.val_only=true) of the weights of" in capsys.readouterr().out
    validations = [r for r in rows(tmp_path) if "val/arithmetic/pass@1" in r]
    assert [r["step"] for r in validations] == [0, 2, 2]  # before, it found step 2 validated and did nothing


@pytest.mark.parametrize(
    "damage",
    [
        lambda final: (final / "model.safetensors").write_bytes((final / "model.safetensors").read_bytes()[:100]),
        lambda final: (final / "tokenizer_config.json").unlink(),
        lambda final: (final / "config.json").write_text((final / "config.json").read_text().replace("3", "4")),
    ],
    ids=["truncated weights", "a tokenizer file missing", "same-size edit of the config"],
)
def test_a_damaged_export_is_not_taken_for_a_complete_one_and_is_written_again(tmp_path, capsys, damage):
    first = finished_run(tmp_path, capsys)
    damage(tmp_path / "checkpoints" / "final")
    run(make_config(tmp_path, *SETTINGS))
    assert "finishing from" in capsys.readouterr().out
    assert file_digests(tmp_path / "checkpoints" / "final") == first


def test_curves_lost_to_a_stop_are_drawn_again_by_the_next_start(tmp_path, capsys):
    run(make_config(tmp_path, *SETTINGS))
    (tmp_path / "curves.png").unlink()
    run(make_config(tmp_path, *SETTINGS))
    assert "already complete" in capsys.readouterr().out
    assert (tmp_path / "curves.png").stat().st_size > 0
