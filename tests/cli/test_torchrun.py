"""``rllm-torch-train`` under ``torchrun`` with 2 real processes (gloo on CPU): one run, rank 0
writes, start-up errors on every rank, a killed rank ends the run and the same command resumes
it exactly, two launches as two nodes equal one launch, another world size cannot resume.

Every launch has a timeout, so a hang fails the test instead of CI."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_resume_after_kill import OVERRIDES, checkpoint_steps, metric_rows

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
LAUNCH_TIMEOUT_S = 240


def train(run_dir: Path, *extra: str, nproc: int = 2, launcher: list[str] | None = None) -> list[str]:
    launcher = launcher or [*TORCHRUN, "--standalone", f"--nproc_per_node={nproc}"]
    return [*launcher, "-m", "rllm_torch.train", *OVERRIDES, *extra, f"hydra.run.dir={run_dir}"]


def run(command: list[str], timeout: float = LAUNCH_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=ENV)


def test_two_processes_are_one_run_whose_rank_0_writes_each_step_once(tmp_path):
    done = run(train(tmp_path / "run"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "world size 2: torch.distributed gloo, devices rank 0: cpu, rank 1: cpu" in done.stdout
    assert done.stdout.count("wall time") == 1  # one summary: rank 0's
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in rows if "actor/loss" in r]
    assert train_steps == list(range(1, 41))
    val_steps = [r["step"] for r in rows if "val/arithmetic/pass@1" in r]
    assert val_steps == [0, 5, 10, 15, 20, 25, 30, 35, 40]
    # the global batch: 8 prompts x 4 rollouts a step, whatever the world size
    assert all(
        r["groups/num_trajs_before_filter"] == 32 and r["groups/num_groups"] == 8 for r in rows if "actor/loss" in r
    )
    assert (tmp_path / "run" / ".hydra" / "config.yaml").is_file()
    assert checkpoint_steps(tmp_path / "run") == [39, 40]


def test_dynamic_sampling_on_two_ranks_fills_each_ranks_share_from_the_same_number_of_batches(tmp_path):
    extra = ("rllm.algorithm.filter_groups.enable=true", "rllm.trainer.total_batches=3", "rllm.trainer.test_freq=0")
    done = run(train(tmp_path / "run", *extra))
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "actor/loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:  # 8 prompts a step, 4 per rank, each rank drawing the step's batches in step with the other
        assert r["batch/dynamic_sampling/gen_batches"] >= 1
        trained = 8 - r["batch/dynamic_sampling/prompts_short"]
        assert r["groups/num_groups"] == trained and r["batch/dynamic_sampling/prompts_with_signal"] >= trained


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.train_batch_size=1", "2 processes for data.train_batch_size=1 prompts per step"),
        ("data.train_batch_size=7", "data.train_batch_size=7 is not divisible by the world size 2"),
        ("backend.parallelism=tensor", "backend.parallelism='tensor' is not one of ('ddp', 'fsdp')"),
        ("backend.device=cuda", "backend.device=cuda but CUDA is not available on this machine"),
    ],
)
def test_a_bad_setting_stops_every_rank_at_start_up(tmp_path, override, message):
    # every rank runs the same check before any collective; torchrun stops the other ranks as
    # soon as the first one exits, so the message may be printed once or twice
    done = run(train(tmp_path / "run", override))
    assert done.returncode != 0
    assert message in done.stdout + done.stderr, (done.stdout + done.stderr)[-3000:]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_rllm_torch_torchrun_ends_a_run_stopped_by_a_bad_setting_with_that_error_not_torchruns_traceback(tmp_path):
    launcher = [sys.executable, "-m", "rllm_torch.cli.launch", "--standalone", "--nproc_per_node=2"]
    done = run(train(tmp_path / "run", "data.train_batch_size=7", launcher=launcher))
    assert done.returncode == 2
    assert "DistributedSetupError: data.train_batch_size=7 is not divisible by the world size 2" in done.stderr
    assert "rllm-torch-torchrun: rank " in done.stderr.splitlines()[-1]
    assert "Traceback" not in done.stderr and "ChildFailedError" not in done.stderr, done.stderr[-3000:]


def test_the_default_run_directory_of_a_torchrun_launch_names_the_world_size(monkeypatch):
    from hydra import compose, initialize_config_module

    from rllm_torch.cli.command_line import register_configs

    register_configs()
    monkeypatch.setenv("WORLD_SIZE", "2")  # what torchrun sets in every rank
    with initialize_config_module(config_module="rllm_torch.configs", version_base=None):
        config = compose(config_name="train", return_hydra_config=True)
    assert config.rllm.trainer.experiment_name == "arithmetic-world2"  # not the one-process run's directory
    assert config.hydra.run.dir == "outputs/rllm_torch/arithmetic-world2"


def _workers(launcher_pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(launcher_pid)], capture_output=True, text=True).stdout.split()
    return [int(pid) for pid in found]


def test_a_killed_rank_ends_the_run_and_the_same_command_resumes_it_exactly(tmp_path):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    uninterrupted = subprocess.Popen(
        train(whole), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV
    )
    victim = subprocess.Popen(train(killed), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    while not any(s >= 6 for s in checkpoint_steps(killed)) and victim.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    workers = _workers(victim.pid)
    assert len(workers) == 2, f"expected the 2 worker processes of torchrun, found {workers}"
    os.kill(workers[-1], signal.SIGKILL)
    killed_at = time.monotonic()
    output, _ = victim.communicate(timeout=LAUNCH_TIMEOUT_S)
    assert victim.returncode != 0
    assert time.monotonic() - killed_at < 60, "the surviving rank did not stop within 60 s"
    assert "Signal 9 (SIGKILL)" in output, output[-3000:]  # torchrun names the rank that died
    saved = checkpoint_steps(killed)
    assert saved and saved[-1] < 40, "the run finished before it could be killed"

    resumed = run(train(killed))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {killed / 'checkpoints' / f'step_{saved[-1]:06d}'}" in resumed.stdout
    assert uninterrupted.wait(timeout=LAUNCH_TIMEOUT_S) == 0, uninterrupted.stderr.read()[-3000:]
    whole_rows, resumed_rows = metric_rows(whole), metric_rows(killed)
    assert [r["step"] for r in resumed_rows] == [r["step"] for r in whole_rows]
    after = [(w, r) for w, r in zip(whole_rows, resumed_rows, strict=True) if w["step"] > saved[-1]]
    assert len(after) >= 30
    for whole_row, resumed_row in after:
        assert resumed_row == whole_row, f"step {whole_row['step']} differs after resuming"
    final_whole = torch.load(whole / "checkpoints" / "step_000040" / "backend.pt", weights_only=False)["model"]
    final_resumed = torch.load(killed / "checkpoints" / "step_000040" / "backend.pt", weights_only=False)["model"]
    assert all(torch.equal(final_whole[k], final_resumed[k]) for k in final_whole)

    other_size = run([sys.executable, "-m", "rllm_torch.train", *OVERRIDES, f"hydra.run.dir={killed}"])
    assert other_size.returncode != 0
    assert "world_size: 2 in the checkpoint, 1 now" in other_size.stderr + other_size.stdout


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_launches_as_two_nodes_give_the_run_of_one_launch(tmp_path):
    one_launch = subprocess.Popen(
        train(tmp_path / "one"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV
    )
    endpoint = f"127.0.0.1:{_free_port()}"
    node = [
        *TORCHRUN,
        "--nnodes=2",
        "--nproc_per_node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        "--rdzv-id=two-nodes",
    ]
    nodes = [
        subprocess.Popen(
            train(tmp_path / "two", launcher=node), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV
        )
        for _ in range(2)
    ]
    for launch in nodes:
        output, _ = launch.communicate(timeout=LAUNCH_TIMEOUT_S)
        assert launch.returncode == 0, output[-3000:]
    assert one_launch.wait(timeout=LAUNCH_TIMEOUT_S) == 0, one_launch.stderr.read()[-3000:]
    assert metric_rows(tmp_path / "two") == metric_rows(tmp_path / "one")


def test_fsdp_runs_checkpoints_its_shards_and_resumes_exactly(tmp_path):
    fsdp = [
        "backend.parallelism=fsdp",
        "rllm.algorithm.lr_schedule=constant",
        "rllm.trainer.test_freq=4",
        "rllm.trainer.save_freq=4",
    ]
    whole = subprocess.Popen(
        train(tmp_path / "whole", *fsdp, "rllm.trainer.total_batches=8"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    first = run(train(tmp_path / "split", *fsdp, "rllm.trainer.total_batches=4"))
    assert first.returncode == 0, first.stderr[-3000:]
    shards = tmp_path / "split" / "checkpoints" / "step_000004" / "sharded"
    assert (shards / ".metadata").is_file() and len(list(shards.glob("*.distcp"))) == 2  # one file per rank
    second = run(train(tmp_path / "split", *fsdp, "rllm.trainer.total_batches=8"))
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resuming from" in second.stdout and "step_000004" in second.stdout
    assert whole.wait(timeout=LAUNCH_TIMEOUT_S) == 0, whole.stderr.read()[-3000:]
    whole_rows, split_rows = metric_rows(tmp_path / "whole"), metric_rows(tmp_path / "split")
    assert [r["step"] for r in split_rows] == [r["step"] for r in whole_rows]
    assert [r for r in split_rows if r["step"] > 4] == [r for r in whole_rows if r["step"] > 4]
    final = tmp_path / "split" / "checkpoints" / "final"
    loaded = run(
        [
            sys.executable,
            "-c",
            f"from transformers import AutoModelForCausalLM; AutoModelForCausalLM.from_pretrained({str(final)!r})",
        ]
    )
    assert loaded.returncode == 0, loaded.stderr[-2000:]  # the gathered export is a plain model


def test_a_rank_that_hangs_past_dist_timeout_s_ends_the_run_with_an_error_naming_the_setting(tmp_path):
    (tmp_path / "slow_rank.py").write_text(
        "import os, time\n\n"
        "def reward(task, response):\n"
        "    if os.environ.get('RANK') == '1':\n"
        "        time.sleep(60)  # rank 1's verifier hangs\n"
        "    return float(response.strip() == task['answer'])\n"
    )
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    command = [
        *TORCHRUN,
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "rllm_torch.train",
        "task=file",
        f"task.train_path={tmp_path / 'train.jsonl'}",
        "task.reward_fn=slow_rank:reward",
        "task.val_size=0",
        "model.hidden_size=32",
        "data.train_batch_size=4",
        "rllm.rollout.n=2",
        "rllm.trainer.total_batches=2",
        "backend.device=cpu",
        "backend.dist_timeout_s=5",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    start = time.monotonic()
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, env={**ENV, "PYTHONPATH": str(tmp_path)}
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert time.monotonic() - start < 120, "the run did not end soon after the timeout"
    assert "rank 0 waited backend.dist_timeout_s=5 s for another rank at a collective" in output, output[-3000:]
    assert "raise backend.dist_timeout_s" in output
