"""The custom-training-loop example (docs/custom-loop.md) trains with every built-in estimator."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "custom_loop.py"


def _load():
    spec = importlib.util.spec_from_file_location("custom_loop", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_plus_plus_baseline", "prpo"])
def test_the_custom_loop_example_learns_with_the_tensor_estimators(estimator):
    before, after = _load().train(estimator)
    assert before == pytest.approx(0.1) and after > 0.6
