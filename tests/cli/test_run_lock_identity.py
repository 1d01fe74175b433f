"""The run lock and the start-up's clean-up at their edges (issue 50): a stale lock file whose line
is longer than the new holder's is rewritten whole; one run directory reached through a symlink or
a ``..`` is the same run (one lock, re-entrant in its process, refused to another); a run that
fails in its first step, with only a validation row of step 0 logged, is not a trained run and
leaves its directory as it found it, while a logged step >= 1 or a checkpoint keeps it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rllm_torch.cli.run_directory import claimed_run_directory
from rllm_torch.core.errors import ConfigError
from rllm_torch.trainer.logs.run_lock import LOCK_NAME, hold_run_directory, lock_holder
from rllm_torch.trainer.ranks import RunRanks


def test_a_stale_longer_line_in_the_lock_file_is_replaced_whole(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    stale = "4294967295 a-much-longer-host-name-of-the-run-before.cluster.example.org\n"
    (run_dir / LOCK_NAME).write_text(stale)  # left by a killed run: unlocked
    hold = hold_run_directory(run_dir)
    try:
        assert (run_dir / LOCK_NAME).read_text() == f"{os.getpid()} {socket.gethostname()}\n"
        assert lock_holder(run_dir / LOCK_NAME) == f"process {os.getpid()}"
    finally:
        hold.release()


def _other_process_holds(path: Path) -> subprocess.CompletedProcess:
    code = f"from rllm_torch.trainer.logs.run_lock import hold_run_directory as h; h({str(path)!r})"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_the_same_directory_through_a_symlink_or_dotdot_is_the_same_run(tmp_path):
    run_dir = tmp_path / "runs" / "run"
    (tmp_path / "elsewhere").mkdir()
    outer = hold_run_directory(run_dir)
    (tmp_path / "link").symlink_to(run_dir)
    through_link = hold_run_directory(tmp_path / "link")  # re-entrant: the same run, not a second holder
    through_dotdot = hold_run_directory(tmp_path / "elsewhere" / ".." / "runs" / "run")
    assert through_link.path.resolve() == through_dotdot.path.resolve() == (run_dir / LOCK_NAME).resolve()
    other = _other_process_holds(tmp_path / "link")
    assert f"is in use by process {os.getpid()}" in other.stderr and "ConfigError" in other.stderr
    through_link.release()
    through_dotdot.release()
    assert (run_dir / LOCK_NAME).is_file()  # the outer hold still holds it
    outer.release()
    assert not (run_dir / LOCK_NAME).exists()


def test_a_run_held_by_another_process_is_refused_through_a_symlink(tmp_path):
    run_dir = tmp_path / "run"
    (tmp_path / "link").symlink_to(run_dir, target_is_directory=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom rllm_torch.trainer.logs.run_lock import hold_run_directory as h\n"
            f"hold = h({str(run_dir)!r}); print('held', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        for path in (tmp_path / "link", tmp_path / "x" / ".." / "run"):
            (tmp_path / "x").mkdir(exist_ok=True)
            with pytest.raises(ConfigError, match=f"in use by process {holder.pid}"):
                hold_run_directory(path)
    finally:
        holder.communicate(input="", timeout=60)


def _fail_inside(run_dir: Path, write) -> list[str]:
    """Claim a fresh ``run_dir``, write what a run had written by then, fail; what is left."""
    with pytest.raises(RuntimeError):
        with claimed_run_directory(run_dir, RunRanks(), key="rllm.trainer.default_local_dir"):
            (run_dir / "config.yaml").write_text("a: 1\n")
            (run_dir / ".hydra").mkdir()
            write(run_dir)
            raise RuntimeError("the reward failed")
    return sorted(p.name for p in run_dir.iterdir()) if run_dir.exists() else []


def _rows(*steps: int, partial: bool = False):
    def write(run_dir: Path) -> None:
        text = "".join(json.dumps({"step": s, "val/pass@1": 0.0}) + "\n" for s in steps)
        (run_dir / "metrics.jsonl").write_text(text + ('{"step": 1, "actor/lo' if partial else ""))

    return write


@pytest.mark.parametrize(
    "write",
    [_rows(), _rows(0), _rows(0, partial=True), lambda d: (d / "checkpoints").mkdir()],
    ids=["nothing logged", "validation at step 0", "a cut row", "an empty checkpoints folder"],
)
def test_a_run_that_fails_in_its_first_step_leaves_its_directory_as_it_found_it(tmp_path, write):
    assert _fail_inside(tmp_path / "run", write) == []


def test_a_run_that_trained_a_step_keeps_its_directory_when_it_fails_later(tmp_path):
    assert "metrics.jsonl" in _fail_inside(tmp_path / "run", _rows(0, 1))
    existing = tmp_path / "old"
    existing.mkdir()
    (existing / "notes.txt").write_text("mine")  # not fresh: nothing of it is the failed run's to remove
    assert _fail_inside(existing, _rows()) == [".hydra", "config.yaml", "metrics.jsonl", "notes.txt"]
