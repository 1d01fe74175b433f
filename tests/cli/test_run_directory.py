"""One run per directory, and every way a run directory can be wrong at start-up: a second process
on a live run directory is refused (one line naming the directory and the holder's pid, exit 2)
and changes nothing while the first finishes; the lock dies with its process (``kill -9``, then the
same command resumes); a file in the way of the default directory, a read-only or a full file
system is one line and exit 2 with nothing written; a run that fails before its first step leaves
no directory behind. Every run here is a real ``rllm-torch-train`` process."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rllm_torch.core.errors import ConfigError
from rllm_torch.trainer.logs.run_lock import LOCK_NAME, hold_run_directory

ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]
SMALL = [
    "model.num_layers=1",
    "model.hidden_size=32",
    "model.num_heads=2",
    "data.train_batch_size=4",
    "rllm.rollout.n=2",
    "rllm.rollout.n_val=1",
    "rllm.trainer.logger=[jsonl]",
    "rllm.workflow.reward_timeout_s=null",
]


def gated_task(tmp_path: Path, *, body: str = "", val: bool = True) -> tuple[list[str], Path]:
    """A file task whose reward waits while ``tmp_path/block`` exists (so a run can be held live
    at a known point); ``body``: extra lines of the reward before it answers; ``val``: the rows
    are the validation set too."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    block = tmp_path / "block"
    (tmp_path / "gate_reward.py").write_text(
        "import time\nfrom pathlib import Path\n\n\ndef reward(task, response):\n"
        f"    while Path({str(block)!r}).exists():\n        time.sleep(0.02)\n{body}"
        "    return float(response.strip() == task['answer'])\n"
    )
    overrides = ["task=file", f"task.train_path={data}", "task.reward_fn=gate_reward:reward"]
    return overrides + ([f"task.val_path={data}"] if val else []) + SMALL, block


def launch(args: list[str], cwd: Path, **kwargs) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env |= {"PYTHONPATH": str(cwd), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.Popen([sys.executable, "-m", "rllm_torch.train", *args], cwd=cwd, env=env, text=True, **kwargs)


def wait_for(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail("timed out waiting")
        time.sleep(0.05)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip() and "HYDRA_FULL_ERROR" not in line]


def test_a_second_run_on_a_live_directory_exits_2_naming_it_and_its_pid_and_the_first_finishes_untouched(tmp_path):
    overrides, block = gated_task(tmp_path)
    run_dir = tmp_path / "run"
    block.touch()  # the first run holds at its first reward (validation before training), config written
    first = launch(
        [*overrides, "rllm.trainer.total_batches=2", f"hydra.run.dir={run_dir}"],
        tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: (run_dir / "config.yaml").is_file() and (run_dir / "metrics.jsonl").is_file())
        config_before = (run_dir / "config.yaml").read_bytes()
        second = launch(
            [*overrides, "model.hidden_size=64", "rllm.trainer.total_batches=5", f"hydra.run.dir={run_dir}"],
            tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        _, stderr = second.communicate(timeout=120)
        assert second.returncode == 2, stderr[-3000:]
        (line,) = error_lines(stderr)
        assert f"the run directory {run_dir} is in use by process {first.pid}," in line, line
        assert "Traceback" not in stderr
        assert (run_dir / "config.yaml").read_bytes() == config_before
        block.unlink()
        out, err = first.communicate(timeout=180)
    finally:
        first.kill()
    assert first.returncode == 0, err[-3000:]
    assert "hidden_size: 32" in (run_dir / "config.yaml").read_text()
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 2], steps  # validation, two steps, the final validation: one run's rows
    assert sorted(p.name for p in run_dir.glob("metrics*")) == ["metrics.jsonl"]  # nothing renamed under it
    assert "kept as" not in err and not (run_dir / LOCK_NAME).exists()


def test_after_kill_9_the_lock_is_gone_with_its_process_and_the_same_command_resumes(tmp_path):
    overrides, block = gated_task(tmp_path)
    run_dir = tmp_path / "run"
    command = [*overrides, "rllm.trainer.total_batches=20", "rllm.trainer.save_freq=1", f"hydra.run.dir={run_dir}"]
    victim = launch(command, tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: (run_dir / "checkpoints" / "step_000002" / "manifest.json").is_file())
        block.touch()  # the run stops at its next reward, holding its lock
        time.sleep(1.0)
        assert (run_dir / LOCK_NAME).read_text().split()[0] == str(victim.pid)
        victim.send_signal(signal.SIGKILL)
        assert victim.wait(timeout=30) == -signal.SIGKILL
    finally:
        victim.kill()
    saved = max(p.parent.name for p in (run_dir / "checkpoints").glob("step_*/manifest.json"))
    assert (run_dir / LOCK_NAME).exists()  # left behind by the killed run, locked by no one
    block.unlink()
    resumed = launch(command, tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = resumed.communicate(timeout=180)
    assert resumed.returncode == 0, err[-3000:]
    assert f"resuming from {run_dir / 'checkpoints' / saved} " in out, out
    assert (run_dir / "checkpoints" / "step_000020").is_dir() and not (run_dir / LOCK_NAME).exists()


def test_the_lock_is_reentrant_in_its_process_refused_to_another_and_leaves_nothing_when_let_go(tmp_path):
    run_dir = tmp_path / "a" / "run"
    outer = hold_run_directory(run_dir)
    inner = hold_run_directory(run_dir)  # the trainer inside the command line's hold
    other = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from rllm_torch.trainer.logs.run_lock import hold_run_directory as h; h({str(run_dir)!r})",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert f"is in use by process {os.getpid()}" in other.stderr and "ConfigError" in other.stderr
    inner.release()
    assert (run_dir / LOCK_NAME).is_file()  # still held by the outer hold
    outer.release()
    assert not (tmp_path / "a").exists()  # taking the lock made a/run; letting go removed both


@pytest.mark.parametrize("in_the_way", ["outputs", "outputs/rllm_torch/arithmetic"])
def test_a_file_where_the_default_run_directory_goes_is_one_line_exit_2_and_nothing_written(tmp_path, in_the_way):
    (tmp_path / in_the_way).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / in_the_way).write_text("notes\n")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    done = launch([], tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, stderr = done.communicate(timeout=120)
    assert done.returncode == 2, stderr[-3000:]
    (line,) = error_lines(stderr)
    assert line == (
        f"rllm-torch-train: ConfigError: hydra.run.dir=outputs/rllm_torch/arithmetic: {tmp_path / in_the_way} is a "
        "file, not a directory; choose a run directory elsewhere."
    )
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


UNSHARE = shutil.which("unshare")


def in_own_mount(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """``script`` (sh) in a user and mount namespace of its own (a tmpfs can be mounted there)."""
    probe = subprocess.run([UNSHARE, "-rm", "true"], capture_output=True, timeout=30) if UNSHARE else None
    if probe is None or probe.returncode != 0:
        pytest.skip("no unprivileged user and mount namespaces here (unshare -rm) to mount a small file system")
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return subprocess.run(
        [UNSHARE, "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=180, cwd=tmp_path, env=env
    )


@pytest.mark.parametrize(
    ("mount", "fill", "reason"),
    [
        ("-o ro,size=4m", "", "may not write to"),
        ("-o size=64k", "dd if=/dev/zero of=mnt/filler bs=1k count=64 2>/dev/null;", "is full"),
    ],
    ids=["read-only", "full"],
)
def test_a_read_only_or_full_file_system_is_one_line_exit_2(tmp_path, mount, fill, reason):
    (tmp_path / "mnt").mkdir()
    done = in_own_mount(
        f"mount -t tmpfs {mount} tmpfs mnt && {fill} {sys.executable} -m rllm_torch.train hydra.run.dir=mnt/run; "
        "echo rc=$?; ls -A mnt",
        tmp_path,
    )
    assert "rc=2" in done.stdout, done.stdout + done.stderr[-3000:]
    (line,) = error_lines(done.stderr)
    assert line.startswith("rllm-torch-train: ConfigError: hydra.run.dir=mnt/run: ") and reason in line, line
    assert "run" not in done.stdout.split("rc=2")[1].split()  # nothing made in the mount


@pytest.mark.parametrize("val", [True, False], ids=["in the first validation", "in the first step"])
def test_a_reward_that_fails_before_the_first_step_is_done_leaves_no_run_directory(tmp_path, val):
    overrides, _ = gated_task(tmp_path, body="    raise KeyError('answer')\n", val=val)
    done = launch(
        [*overrides, "rllm.workflow.retry_limit=1", "rllm.trainer.total_batches=1"],
        tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    _, stderr = done.communicate(timeout=120)
    assert done.returncode == 2, stderr[-3000:]
    assert "KeyError" in stderr and "Traceback" not in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.jsonl", "gate_reward.py"]  # no outputs/, no .hydra/


def test_a_run_directory_that_cannot_be_made_is_a_config_error_naming_the_setting(tmp_path):
    (tmp_path / "notes").write_text("a file")
    with pytest.raises(
        ConfigError, match=r"rllm.trainer.default_local_dir=.*notes/run: cannot write the run directory"
    ):
        hold_run_directory(tmp_path / "notes" / "run")
