"""``rllm-torch-demo`` prints every registered estimator's advantages, and the top-level names are
the estimators'."""

from __future__ import annotations

import rllm_torch
from rllm_torch import registered_estimator_names
from rllm_torch.cli.demo import main


def test_the_demo_shows_every_registered_estimator(capsys):
    main(["--groups", "5", "--seed", "1", "--device", "cpu"])
    out = capsys.readouterr().out
    for name in registered_estimator_names():
        assert f"\n{name}:\n" in out or f"\n{name} (" in out, name
    assert "nan" not in out


def test_top_level_names_are_unique_and_pass_at_k_is_the_estimator():
    assert len(rllm_torch.__all__) == len(set(rllm_torch.__all__))
    assert rllm_torch.pass_at_k is rllm_torch.core.estimators.pass_at_k
