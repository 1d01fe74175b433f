"""``rllm-torch-demo`` prints every registered estimator's advantages, and the top-level names are
the estimators'."""

from __future__ import annotations

import subprocess
import sys

import rllm_torch
from rllm_torch import registered_estimator_names


def test_the_demo_shows_every_registered_estimator():
    # in a fresh process, as a user runs it: other test modules register estimators of their own here
    names = subprocess.run(
        [sys.executable, "-c", "import rllm_torch; print(*rllm_torch.registered_estimator_names())"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.split()
    out = subprocess.run(
        [sys.executable, "-m", "rllm_torch.cli.demo", "--groups", "5", "--seed", "1", "--device", "cpu"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    assert len(names) >= 15 and set(names) <= set(registered_estimator_names())
    for name in names:
        assert f"\n{name}:\n" in out or f"\n{name} (" in out, name
    assert "nan" not in out


def test_top_level_names_are_unique_and_pass_at_k_is_the_estimator():
    assert len(rllm_torch.__all__) == len(set(rllm_torch.__all__))
    assert rllm_torch.pass_at_k is rllm_torch.core.estimators.pass_at_k
