"""Checkpoints: atomic layout, pruning, and the bad inputs: a partial or corrupt checkpoint, a
config changed since the checkpoint, a full disk while saving."""

from __future__ import annotations

import errno
import hashlib
import json
import shutil

import pytest
from trainer_fakes import RecordingBackend, TwoRoleWorkflow, make_config

from rllm_torch import UnifiedTrainer
from rllm_torch.core.errors import CheckpointError, CheckpointMismatchError, ConfigError
from rllm_torch.trainer.runtime.checkpoint import CheckpointStore, read_manifest

TRAIN = [{"prompt": f"p{i}"} for i in range(8)]  # 4 batches of 2 per epoch
VAL = [{"prompt": "v0", "data_source": "a"}]


def write_files(directory):
    (directory / "a.bin").write_bytes(b"x" * 10)


def test_a_saved_checkpoint_is_complete_named_by_its_step_and_leaves_no_temporary_directory(tmp_path):
    store = CheckpointStore(tmp_path)
    path = store.save(32, write_files, {"note": "hi"})
    assert path == tmp_path / "step_000032"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000032"]
    info = store.latest()
    assert (info.step, info.metadata) == (32, {"note": "hi"})
    assert json.loads((path / "manifest.json").read_text())["files"] == {"a.bin": 10}


def test_the_latest_checkpoint_is_the_complete_one_with_the_highest_step_whatever_the_save_order(tmp_path):
    store = CheckpointStore(tmp_path, max_to_keep=4)
    assert store.latest() is None
    for step in (4, 2, 6):  # saved out of order (a re-save of an older step)
        store.save(step, write_files, {"step": step})
    assert (store.latest().step, store.latest().metadata) == (6, {"step": 6})
    assert [i.step for i in store.complete()] == [2, 4, 6]
    (tmp_path / "step_000006" / "manifest.json").unlink()  # the newest left incomplete: the one before it
    with pytest.warns(UserWarning, match="step_000006"):
        assert store.latest().step == 4


def test_old_checkpoints_are_pruned_to_max_to_keep(tmp_path):
    store = CheckpointStore(tmp_path, max_to_keep=2)
    for step in (2, 4, 6, 8):
        store.save(step, write_files, {})
    assert [i.step for i in store.complete()] == [6, 8]


def test_a_partial_or_damaged_checkpoint_is_skipped_with_a_warning_naming_it(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(2, write_files, {})
    (tmp_path / "step_000004").mkdir()  # a copy that stopped before its manifest
    (tmp_path / "step_000004" / "a.bin").write_bytes(b"x")
    damaged = store.save(6, write_files, {})
    (damaged / "a.bin").write_bytes(b"x" * 3)  # truncated after the manifest was written
    (tmp_path / ".tmp-step_000008-999").mkdir()  # a writer killed mid-save
    with pytest.warns(UserWarning) as caught:
        latest = store.latest()
    assert latest.step == 2
    messages = " ".join(str(w.message) for w in caught)
    assert "step_000004" in messages and "no manifest.json" in messages
    assert "step_000006" in messages and "a.bin should have 10 bytes, found 3" in messages
    assert store.remove_stale_temporaries() == [tmp_path / ".tmp-step_000008-999"]


def test_a_full_disk_while_saving_raises_a_clear_error_and_keeps_the_previous_checkpoint(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(2, write_files, {})

    def disk_full(directory):
        (directory / "a.bin").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(
        CheckpointError,
        match=r"step_000004 failed: No space left on device \(errno 28\); the previous checkpoint .*step_000002 is intact",
    ):
        store.save(4, disk_full, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000002"]
    assert store.latest().step == 2


def test_a_write_that_fails_otherwise_also_leaves_no_temporary_directory(tmp_path):
    def unpicklable(directory):
        (directory / "a.bin").write_bytes(b"half")
        raise TypeError("cannot pickle 'generator' object")

    with pytest.raises(
        CheckpointError, match="step_000002 failed: TypeError: cannot pickle.*no earlier checkpoint exists"
    ):
        CheckpointStore(tmp_path).save(2, unpicklable, {})
    assert list(tmp_path.iterdir()) == []


# ---- the trainer ---------------------------------------------------------------------------


class StatefulBackend(RecordingBackend):
    """A fake backend with a state: the number of updates it made."""

    def __init__(self, config, **kwargs):
        super().__init__(config)
        self.updates = 0

    async def update_policy(self, trainer_state):
        await super().update_policy(trainer_state)
        self.updates += 1

    def state_dict(self):
        return {"updates": self.updates}

    def load_state_dict(self, state):
        self.updates = state["updates"]


class Unpicklable:
    def __reduce__(self):
        raise OSError(errno.ENOSPC, "No space left on device")


class DiskFullAfterStep2Backend(StatefulBackend):
    """Its state cannot be written after step 2, as on a disk that filled up."""

    def state_dict(self):
        return {"updates": self.updates, "blob": Unpicklable() if self.updates > 2 else None}


def trainer_for(tmp_path, *overrides, backend=StatefulBackend):
    config = make_config(
        tmp_path,
        "data.train_batch_size=2",
        "rllm.rollout.n=2",
        "rllm.rollout.n_val=1",
        "rllm.trainer.save_freq=2",
        *overrides,
    )
    return UnifiedTrainer(backend, config, TwoRoleWorkflow, TRAIN, VAL)


def test_a_resumed_run_continues_from_the_newest_checkpoint_with_its_state(tmp_path):
    trainer_for(tmp_path, "rllm.trainer.total_batches=3").fit()  # checkpoints at steps 2 and 3
    resumed = trainer_for(tmp_path, "rllm.trainer.total_batches=6")
    resumed.fit()
    assert resumed.backend.updates == 6
    assert [c for c in resumed.backend.calls if c.startswith("on_batch_start")] == [
        "on_batch_start@4",
        "on_batch_start@5",
        "on_batch_start@6",
    ]
    assert [step for step, _ in resumed.val_history] == [
        0,
        3,
        6,
    ]  # the first run's history is kept, no validation before resuming
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3, 3, 4, 5, 6, 6]  # training rows 1-6, validations at 0, 3, 6: nothing twice


def test_a_full_disk_stops_the_run_with_a_clear_message_and_the_previous_checkpoint_still_resumes(tmp_path):
    with pytest.raises(CheckpointError, match="step_000004 failed: No space left on device.*step_000002 is intact"):
        trainer_for(tmp_path, "rllm.trainer.total_batches=6", backend=DiskFullAfterStep2Backend).fit()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000002"]
    resumed = trainer_for(tmp_path, "rllm.trainer.total_batches=6")
    resumed.fit()
    assert resumed.backend.calls.count("update_policy") == 4 and resumed.backend.updates == 6


def test_a_config_changed_since_the_checkpoint_fails_naming_the_setting_and_the_checkpoint_stays_usable(tmp_path):
    trainer_for(tmp_path, "rllm.trainer.total_batches=2").fit()
    with pytest.raises(
        CheckpointMismatchError, match=r"step_000002.*rllm.rollout.n: 2 in the checkpoint, 4 now.*experiment_name"
    ):
        trainer_for(tmp_path, "rllm.trainer.total_batches=4", "rllm.rollout.n=4")  # before anything is written
    same = trainer_for(tmp_path, "rllm.trainer.total_batches=4")
    same.fit()
    assert same.backend.updates == 4


def test_a_corrupt_newest_checkpoint_is_skipped_and_the_one_before_resumes(tmp_path):
    trainer_for(tmp_path, "rllm.trainer.total_batches=4").fit()
    newest = tmp_path / "checkpoints" / "step_000004" / "backend.pt"
    newest.write_bytes(b"\0" * newest.stat().st_size)  # same size, garbage inside
    resumed = trainer_for(tmp_path, "rllm.trainer.total_batches=4")
    with pytest.warns(UserWarning, match="step_000004: unreadable"):
        resumed.fit()
    assert resumed.backend.calls.count("update_policy") == 2


def test_resume_path_to_a_damaged_checkpoint_fails_instead_of_picking_another(tmp_path):
    trainer_for(tmp_path, "rllm.trainer.total_batches=2").fit()
    (tmp_path / "checkpoints" / "step_000002" / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="no manifest.json"):
        trainer_for(tmp_path, f"rllm.trainer.resume_mode={tmp_path / 'checkpoints' / 'step_000002'}")


def test_an_unknown_resume_mode_that_is_not_a_directory_fails_before_training(tmp_path):
    with pytest.raises(ConfigError, match="resume_mode='atuo'"):
        trainer_for(tmp_path, "rllm.trainer.resume_mode=atuo")


def test_the_rejection_sampling_accumulation_survives_a_restart(tmp_path):
    # 2 tasks per step, every task partially solved; a release needs 3: steps 1, 3 accumulate, 2, 4 release
    settings = (
        "rllm.rejection_sample.enable=true",
        "rllm.rejection_sample.min_partial_solve_tasks=3",
        "rllm.rejection_sample.accumulate=true",
        "rllm.trainer.save_freq=1",
    )
    whole = trainer_for(tmp_path / "whole", "rllm.trainer.total_batches=4", *settings)
    whole.fit()
    trainer_for(tmp_path / "split", "rllm.trainer.total_batches=1", *settings).fit()  # stops holding step 1's groups
    resumed = trainer_for(tmp_path / "split", "rllm.trainer.total_batches=4", *settings)
    resumed.fit()
    assert [b.num_groups for b in whole.backend.batches] == [8, 8]  # 2 roles x 4 tasks per release
    assert [b.num_groups for b in resumed.backend.batches] == [8, 8]


def test_resume_mode_disable_in_a_directory_with_checkpoints_refuses_to_mix_two_runs(tmp_path):
    trainer_for(tmp_path, "rllm.trainer.total_batches=2").fit()
    with pytest.raises(CheckpointError, match="resume_mode=disable.*step_000002"):
        trainer_for(tmp_path, "rllm.trainer.resume_mode=disable")


@pytest.mark.parametrize(
    "key, value",
    [
        ("task.max_sum", "5"),
        ("task.apply_chat_template", "true"),
        ("model.pad_token", "x"),
        ("task.dataset", "basic_arithmetic"),  # two reasoning-gym datasets in one directory
        ("task.val_size", "8"),
        ("rllm.rollout.temperature", "0.7"),
        ("backend.grad_clip", "0.5"),
        ("rllm.algorithm.kl_coef", "0.1"),
        ("rllm.compact_filtering.enable", "true"),
    ],
)
def test_a_change_of_a_fingerprinted_setting_is_a_mismatch_naming_it(tmp_path, key, value):
    trainer_for(tmp_path, "rllm.trainer.total_batches=2").fit()
    with pytest.raises(CheckpointMismatchError, match=rf"{key}: .* in the checkpoint, .* now"):
        trainer_for(tmp_path, "rllm.trainer.total_batches=4", f"{key}={value}")


def test_a_checkpoint_from_before_the_new_keys_resumes_with_their_defaults(tmp_path):
    from rllm_torch.trainer.runtime.fingerprint import check_fingerprint, config_fingerprint

    current = config_fingerprint(make_config(tmp_path))
    added = {"task.min_digits": "2", "task.max_digits": "5", "task.apply_chat_template": "true", "model.pad_token": "x"}
    old = {k: v for k, v in current.items() if k not in added}
    assert len(old) == len(current) - len(added)
    check_fingerprint(old, current, "step_000002")  # no error: the defaults are what the old run had
    for key, value in added.items():  # and the old run is held to those defaults, key by key
        other = config_fingerprint(make_config(tmp_path, f"{key}={value}"))
        with pytest.raises(CheckpointMismatchError, match=rf"{key}: .* in the checkpoint, .* now"):
            check_fingerprint(old, other, "step_000002")


def flip_bytes(path, count=200):
    """Flip ``count`` bytes in the middle of ``path``: same size, and (here) still loadable."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    for i in range(middle, min(middle + count, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_the_manifest_records_each_files_sha256_and_a_flipped_byte_fails_the_content_check(tmp_path):
    store = CheckpointStore(tmp_path)
    path = store.save(2, write_files, {})
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["sha256"] == {"a.bin": hashlib.sha256(b"x" * 10).hexdigest()}
    (path / "a.bin").write_bytes(b"x" * 9 + b"y")  # bit rot: the size is right
    assert store.latest().step == 2  # listing checks sizes only
    with pytest.raises(CheckpointError, match="bytes of a.bin changed since it was written"):
        read_manifest(path, verify_content=True)


def test_a_checkpoint_whose_bytes_rotted_is_skipped_for_the_one_before(tmp_path):
    trainer_for(tmp_path, "rllm.trainer.total_batches=4").fit()
    flip_bytes(tmp_path / "checkpoints" / "step_000004" / "trainer.pt", count=2)
    resumed = trainer_for(tmp_path, "rllm.trainer.total_batches=4")
    with pytest.warns(UserWarning, match="step_000004: unreadable.*trainer.pt changed since it was written"):
        resumed.fit()
    assert resumed.backend.calls.count("update_policy") == 2 and resumed.backend.updates == 4


def test_when_every_checkpoint_is_damaged_the_run_stops_and_keeps_its_metrics(tmp_path):
    trainer_for(tmp_path, "rllm.trainer.total_batches=4").fit()
    metrics = (tmp_path / "metrics.jsonl").read_text()
    for step in (2, 4):
        flip_bytes(tmp_path / "checkpoints" / f"step_{step:06d}" / "backend.pt", count=2)
    with pytest.warns(UserWarning), pytest.raises(CheckpointError, match="every checkpoint of .* is damaged"):
        trainer_for(tmp_path, "rllm.trainer.total_batches=4").fit()
    for step in (2, 4):  # a size that no longer matches: not even listed as complete
        (tmp_path / "checkpoints" / f"step_{step:06d}" / "backend.pt").write_bytes(b"")
    with pytest.warns(UserWarning), pytest.raises(CheckpointError, match=r"damaged \(step_000002, step_000004"):
        trainer_for(tmp_path, "rllm.trainer.total_batches=4")
    assert (tmp_path / "metrics.jsonl").read_text() == metrics


def test_a_fresh_run_over_a_run_without_checkpoints_keeps_the_earlier_metrics_beside_its_own(tmp_path):
    trainer_for(tmp_path, "rllm.trainer.total_batches=2", "rllm.trainer.save_freq=0").fit()
    first = (tmp_path / "metrics.jsonl").read_text()
    shutil.rmtree(tmp_path / "checkpoints")  # e.g. save_freq=0 and a run stopped before its end
    with pytest.warns(UserWarning, match="kept as .*metrics.1.jsonl"):
        trainer_for(tmp_path, "rllm.trainer.total_batches=2", "rllm.trainer.save_freq=0").fit()
    assert (tmp_path / "metrics.1.jsonl").read_text() == first
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == first.count("\n")


def test_a_resumed_run_prunes_what_a_stopped_run_left_over_its_max_to_keep(tmp_path):
    trainer_for(tmp_path, "rllm.trainer.total_batches=4", "rllm.trainer.max_checkpoints_to_keep=0").fit()
    assert [p.name for p in sorted((tmp_path / "checkpoints").glob("step_*"))] == ["step_000002", "step_000004"]
    trainer_for(tmp_path, "rllm.trainer.total_batches=4", "rllm.trainer.max_checkpoints_to_keep=1").fit()
    assert [p.name for p in sorted((tmp_path / "checkpoints").glob("step_*"))] == ["step_000004"]
