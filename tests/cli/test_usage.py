"""What ``rllm-torch-train`` says before it trains: ``--version`` and ``--help`` speak of itself (not
"Hydra 1.3.8", "powered by Hydra") and list the config groups and the most used keys; an
argparse-style ``--flag`` is one line naming the key it meant; a Ctrl-C at any moment of the
start-up (the imports, the composition, the trainer's start) is one line and exit status 130."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rllm_torch.cli.command_line import check_command_line
from rllm_torch.cli.usage import MOST_USED
from rllm_torch.core.errors import ConfigError

SCRIPT = Path(sys.executable).parent / "rllm-torch-train"
needs_script = pytest.mark.skipif(not SCRIPT.is_file(), reason="the rllm-torch-train console script is not installed")


def script(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=120, cwd=cwd, env=env)


@needs_script
def test_version_names_the_program_and_its_libraries_once(tmp_path):
    done = script("--version", cwd=tmp_path)
    assert done.returncode == 0 and done.stderr == ""
    (line,) = done.stdout.splitlines()
    assert line.startswith("rllm-torch-train 0.1.0 (torch ") and "hydra-core 1.3" in line and "Hydra 1.3" not in line


@needs_script
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_speaks_of_rllm_torch_train_and_lists_the_groups_and_the_most_used_keys(tmp_path, flag):
    done = script("--config-name", "rloo", flag, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert (
        text.startswith("usage: rllm-torch-train ") and "powered by Hydra" not in text and "train_command" not in text
    )
    assert "  model: smollm2, tiny, tiny_llama" in text and "  task: arithmetic, chain, distill, file," in text
    for key in MOST_USED:
        assert f"\n  {key}=" in text, key
    assert "rllm.rollout.n=8 " in text and "rollouts per training prompt" in text  # default and help, from the schema
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize(
    ("argv", "meant"),
    [
        (
            ["--lr", "0.01"],
            "`--lr 0.01`: rllm-torch-train takes settings as key=value, not as --flags; did you mean backend.lr=0.01?",
        ),
        (["--learning-rate=3e-4"], "did you mean backend.lr=3e-4?"),
        (["--config-name", "rloo", "--epochs", "2"], "did you mean rllm.trainer.total_epochs=2?"),
        (["--max_new_tokens", "8"], "did you mean rllm.rollout.max_new_tokens=8?"),
        (["rllm.rollout.n=4", "--batch-size", "16"], "did you mean data.train_batch_size=16?"),
        (["--zzz"], "`--zzz`: rllm-torch-train takes settings as key=value, not as --flags; rllm-torch-train --help"),
    ],
)
def test_an_argparse_style_flag_names_the_key_it_meant(argv, meant):
    with pytest.raises(ConfigError) as info:
        check_command_line(argv)
    assert meant in str(info.value) and "\n" not in str(info.value)


def test_hydras_own_flags_and_their_values_still_pass():
    check_command_line(["--config-name", "rloo", "--cfg", "job", "rllm.rollout.n=4"])
    check_command_line(["-cn", "reverse", "--info", "--resolve"])


@needs_script
@pytest.mark.parametrize("delay_s", [0.3, 1.0, 2.0, 4.0])
def test_ctrl_c_at_any_moment_of_the_start_up_is_one_line_and_exit_130(tmp_path, delay_s):
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    launch = subprocess.Popen(
        [SCRIPT, "model.hidden_size=32", "rllm.trainer.logger=[jsonl]"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # whatever this process inherited
    )
    try:
        time.sleep(delay_s)  # the imports take seconds (torch, transformers, Hydra), then the composition
        launch.send_signal(signal.SIGINT)
        _, stderr = launch.communicate(timeout=60)
    finally:
        launch.kill()
    assert launch.returncode == 130, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr[-3000:]
    if lines == ["rllm-torch-train: interrupted while starting, before the run began; nothing was written"]:
        assert not list(tmp_path.iterdir())
    elif len(lines) == 1:  # a fast machine: the run had begun, before its steps
        assert lines[0].startswith("rllm-torch-train: interrupted; the same command "), lines[0]
    else:  # a faster one: its steps had begun, and the Ctrl-C stopped them as SIGTERM does (issue 49)
        assert len(lines) == 2 and lines[0].startswith("rllm-torch-train: SIGINT received; stopping"), lines
        assert lines[1].startswith("rllm-torch-train: stopped by SIGINT ") and lines[1].endswith("(exit 130)"), lines
