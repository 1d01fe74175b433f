"""The data-parallel example (docs/distributed.md) runs under torchrun (2 real processes) and learns."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "distributed_loop.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


def test_the_distributed_loop_example_learns_on_two_ranks_with_identical_weights():
    done = subprocess.run([*TORCHRUN, str(EXAMPLE), "grpo"], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]  # a rank whose weights differ exits non-zero
    before, after = map(float, re.search(r"world size 2: expected reward ([\d.]+) -> ([\d.]+)", done.stdout).groups())
    assert before == 0.1 and after > 0.9
