"""What a resumed run may change: every setting of the schema is either in the checkpoint's
fingerprint (a change is a ``CheckpointMismatchError`` naming it) or declared resumable (a change
applies from the resumed step, is said in the start-up summary and recorded); a finished run
started again writes nothing."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from tiny_runs import TINY
from trainer_fakes import make_config

from rllm_torch.cli.command_line import known_keys, register_configs
from rllm_torch.cli.train_command import run
from rllm_torch.core.errors import CheckpointMismatchError
from rllm_torch.trainer.runtime import fingerprint


def schema_settings() -> set[str]:
    """Every setting of the schema: its leaf keys and its open (dict-typed) keys."""
    keys, open_prefixes = known_keys()
    return {k for k in keys if not any(other.startswith(f"{k}.") for other in keys)} | open_prefixes


def test_every_setting_is_fingerprinted_or_declared_resumable_and_no_table_names_a_stale_key():
    settings = schema_settings()
    fingerprinted, resumable = set(fingerprint.FINGERPRINT_KEYS), set(fingerprint.RESUMABLE_KEYS)
    unclassified = sorted(settings - fingerprinted - resumable)
    assert not unclassified, (
        f"settings neither fingerprinted nor resumable: {unclassified}; declare each with setting(...) in "
        "rllm_torch/trainer/schema.py (resumable=True if a resumed run may change it)"
    )
    assert not fingerprinted & resumable, sorted(fingerprinted & resumable)
    assert not (fingerprinted | resumable) - settings, sorted((fingerprinted | resumable) - settings)
    assert len(fingerprint.FINGERPRINT_KEYS) == len(fingerprinted) and len(fingerprint.RESUMABLE_KEYS) == len(
        resumable
    )  # no repeats


# What decides the samples, the rewards, the advantages or the loss is fingerprinted: a rule stated
# here apart from the tables, so a key moved to RESUMABLE_KEYS by mistake turns this red.
COMPUTED_PREFIXES = (
    "model.",
    "task.",
    "data.",
    "rllm.rollout.",
    "rllm.algorithm.",
    "rllm.stepwise_advantage.",
    "rllm.compact_filtering.",
    "rllm.rejection_sample.",
)
RESUMABLE_UNDER_THEM = {  # each read where it is used, and a run that changes it halfway is still one run
    "rllm.algorithm.lr_schedule",
    "rllm.algorithm.warmup_steps",
    "data.val_batch_size",  # how validation is batched, not what it samples
    "rllm.algorithm.warmup_steps_ratio",
    "rllm.algorithm.use_rllm",  # read by nothing
    "rllm.stepwise_advantage.enable",  # rLLM's verl switch, read by nothing here
    "model.gguf_cache_dir",  # a cache of the .gguf file's conversion, not part of the model
    "task.env_latency_ms",  # how long the environment waits: when episodes finish, not what they hold
}


def test_every_setting_that_decides_what_is_computed_is_fingerprinted():
    computed = {k for k in schema_settings() if k.startswith(COMPUTED_PREFIXES)} - RESUMABLE_UNDER_THEM
    assert computed and not computed - set(fingerprint.FINGERPRINT_KEYS), sorted(
        computed - set(fingerprint.FINGERPRINT_KEYS)
    )
    assert RESUMABLE_UNDER_THEM <= set(fingerprint.RESUMABLE_KEYS)


@pytest.mark.parametrize(
    "key, value",
    [
        ("rllm.algorithm.importance_sampling_level", "sequence"),
        ("backend.clip_ratio_c", "3.0"),
        ("backend.entropy_coeff", "0.01"),
        ("rllm.algorithm.rollout_correction.tis_mode", "token"),
        ("rllm.algorithm.rollout_correction.tis_cap", "5.0"),
        ("rllm.algorithm.rollout_correction.bypass_mode", "true"),
        ("rllm.algorithm.filter_groups.enable", "true"),
        ("rllm.algorithm.filter_groups.metric", "acc"),
        ("rllm.algorithm.filter_groups.max_num_gen_batches", "3"),
        ("rllm.algorithm.loss_agg_mode", "seq-mean-token-mean"),
        ("backend.dtype", "bfloat16"),
        ("backend.rollout.engine", "vllm"),
    ],
)
def test_a_change_of_a_newer_fingerprinted_setting_is_a_mismatch_naming_it(tmp_path, key, value):
    saved = fingerprint.config_fingerprint(make_config(tmp_path))
    changed = fingerprint.config_fingerprint(make_config(tmp_path, f"{key}={value}"))
    with pytest.raises(CheckpointMismatchError, match=rf"{key}: .* in the checkpoint, .* now"):
        fingerprint.check_fingerprint(saved, changed, "step_000002")


# ---- checkpoints from before a key was fingerprinted ---------------------------------------


def test_a_checkpoint_written_before_a_key_existed_resumes_with_the_keys_default(tmp_path):
    current = fingerprint.config_fingerprint(make_config(tmp_path))
    older = {k: v for k, v in current.items() if k != "rllm.rollout.temperature"}
    fingerprint.check_fingerprint(older, current, "step_000002")  # the default: what a run before the key had
    with pytest.raises(CheckpointMismatchError, match="rllm.rollout.temperature: 1.0 in the checkpoint, 0.5 now"):
        fingerprint.check_fingerprint(
            older, fingerprint.config_fingerprint(make_config(tmp_path, "rllm.rollout.temperature=0.5")), "s"
        )


def test_a_loss_fn_left_null_is_fingerprinted_as_the_loss_it_stands_for(tmp_path):
    # the schema's default was "ppo" until echo's estimator got its own loss: those checkpoints resume
    null, named = (
        fingerprint.config_fingerprint(make_config(tmp_path, *s)) for s in ([], ["rllm.algorithm.loss_fn=ppo"])
    )
    assert null["rllm.algorithm.loss_fn"] == named["rllm.algorithm.loss_fn"] == "ppo"
    fingerprint.check_fingerprint(named, null, "step_000002")
    echo = fingerprint.config_fingerprint(make_config(tmp_path, "rllm.algorithm.adv_estimator=echo"))
    assert echo["rllm.algorithm.loss_fn"] == "echo"
    with pytest.raises(CheckpointMismatchError, match="rllm.algorithm.loss_fn: 'ppo' in the checkpoint, 'echo' now"):
        fingerprint.check_fingerprint({**echo, "rllm.algorithm.loss_fn": "ppo"}, echo, "step_000002")


def test_a_first_format_checkpoint_is_compared_on_the_keys_it_recorded(tmp_path):
    current = fingerprint.config_fingerprint(make_config(tmp_path, "rllm.rollout.temperature=0.5"))
    first_format = {k: v for k, v in current.items() if k in ("seed", "rllm.rollout.n", "task.name")}
    fingerprint.check_fingerprint(first_format, current, "step_000002")  # temperature was not recorded then
    with pytest.raises(CheckpointMismatchError, match="rllm.rollout.n: 4 in the checkpoint, 8 now"):
        fingerprint.check_fingerprint({**first_format, "rllm.rollout.n": 4}, current, "step_000002")


def test_the_default_run_directory_of_a_reasoning_gym_task_names_its_dataset():
    register_configs()
    with initialize_config_module(config_module="rllm_torch.configs", version_base=None):
        config = compose(config_name="train", overrides=["task=reasoning_gym", "task.dataset=basic_arithmetic"])
    assert config.rllm.trainer.experiment_name == "reasoning_gym-basic_arithmetic"


# ---- the real backend: a resumed run applies what it may change ------------------------------

SETTINGS = [*TINY, "rllm.trainer.save_freq=2"]


def lr_by_step(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["actor/lr"] for r in rows if "actor/lr" in r}


def test_a_changed_learning_rate_and_schedule_apply_from_the_resumed_step_and_are_said_and_recorded(tmp_path, capsys):
    new = ["backend.lr=0.01", "rllm.algorithm.lr_schedule=linear", "rllm.trainer.total_batches=4"]
    run(make_config(tmp_path / "whole", *SETTINGS, *new))
    run(make_config(tmp_path / "resumed", *SETTINGS, "rllm.trainer.total_batches=2"))  # lr 0.001, constant
    capsys.readouterr()
    run(make_config(tmp_path / "resumed", *SETTINGS, *new))
    out = capsys.readouterr().out
    whole, resumed = lr_by_step(tmp_path / "whole"), lr_by_step(tmp_path / "resumed")
    assert [resumed[s] for s in (1, 2)] == [0.001, 0.001]
    assert [resumed[s] for s in (3, 4)] == [whole[s] for s in (3, 4)] == [0.01 * 1 / 4, 0.0]  # linear to 0 at step 4
    said = next(line for line in out.splitlines() if "changed on resume:" in line)
    assert "backend.lr 0.001 -> 0.01" in said and "rllm.algorithm.lr_schedule constant -> linear" in said
    assert "rllm.trainer.total_batches 2 -> 4" in said
    record = [json.loads(line) for line in (tmp_path / "resumed" / "resumes.jsonl").read_text().splitlines()]
    assert len(record) == 1 and record[0]["step"] == 2
    assert record[0]["changed"]["backend.lr"] == [0.001, 0.01]
    manifest = json.loads((tmp_path / "resumed" / "checkpoints" / "step_000004" / "manifest.json").read_text())
    assert manifest["metadata"]["resumable"]["backend.lr"] == 0.01  # the next resume compares with 0.01


def test_each_resume_of_one_run_directory_adds_its_own_row_to_resumes_jsonl(tmp_path):
    run_dir, settings = tmp_path / "run", [*TINY, "rllm.trainer.save_freq=1"]
    run(make_config(run_dir, *settings, "rllm.trainer.total_batches=1"))  # checkpoint at step 1
    assert not (run_dir / "resumes.jsonl").exists()  # a fresh start is no resume
    run(make_config(run_dir, *settings, "rllm.trainer.total_batches=2"))  # resumes at 1, checkpoint at 2
    run(make_config(run_dir, *settings, "rllm.trainer.total_batches=3", "backend.lr=0.01"))  # resumes at 2
    rows = [json.loads(line) for line in (run_dir / "resumes.jsonl").read_text().splitlines()]
    assert [(r["step"], Path(r["checkpoint"]).name, r["changed"]) for r in rows] == [
        (1, "step_000001", {"rllm.trainer.total_batches": [1, 2]}),
        (2, "step_000002", {"rllm.trainer.total_batches": [2, 3], "backend.lr": [0.001, 0.01]}),
    ]


def snapshot(directory: Path) -> dict[str, tuple[int, str]]:
    return {
        str(p.relative_to(directory)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def test_a_finished_run_started_again_with_a_changed_setting_writes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "rllm_torch.train",
        *SETTINGS,
        "rllm.trainer.total_batches=2",
        f"hydra.run.dir={run_dir}",
    ]
    first = subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    before = snapshot(run_dir)
    assert {"config.yaml", ".hydra/overrides.yaml", "curves.png", "metrics.jsonl"} <= set(before)
    again = subprocess.run([*command, "backend.lr=0.5"], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "already complete" in again.stdout
    assert snapshot(run_dir) == before


def test_weights_that_do_not_fit_the_model_built_now_are_a_mismatch_not_a_torch_traceback(tmp_path):
    data = tmp_path / "sums_train.jsonl"
    settings = [*SETTINGS[2:], "task.name=file", f"task.train_path={data}", "rllm.trainer.total_batches=1"]
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(8)))
    run(make_config(tmp_path / "run", *settings))
    # the same path with new characters: the character tokenizer, so the embedding, grows
    data.write_text("".join(json.dumps({"prompt": f"{c}+1=", "answer": c}) + "\n" for c in "abcdefghijklmnop"))
    with pytest.raises(
        CheckpointMismatchError, match=r"step_000001: its weights do not fit the model built now \(size mismatch for"
    ):
        run(make_config(tmp_path / "run", *settings[:-1], "rllm.trainer.total_batches=2"))
