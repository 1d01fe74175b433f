"""The trainer's step gives the numbers it gave when ``tests/data/step_reference.json`` was
recorded (``tests/step_reference.py``): every metric of every step and validation, and the
exported weights, for the default job, the multi-turn tasks, async training at staleness 0,
per-role losses, remax, ``optimal_token_baseline`` and dynamic sampling; for async training at
staleness 2, whose samples depend on timing, what the schedule cannot change.

On the machine that recorded them (its CPU model and torch version) the comparison is exact, bit
for bit; on another CPU, whose float32 kernels may round differently in the last bits, the metrics
must agree within 1e-5 (relative) and the weights' sums within 1e-5."""

from __future__ import annotations

import json

import pytest
from step_reference import DATA, RUNS, TIMING_DEPENDENT, machine, run_reference

REFERENCE = json.loads(DATA.read_text())
SAME_MACHINE = REFERENCE["machine"] == machine()


@pytest.mark.parametrize("name", sorted(RUNS))
def test_the_step_gives_the_recorded_numbers(tmp_path, name):
    want, got = REFERENCE["runs"][name], run_reference(name, tmp_path)
    assert [sorted(r) for r in got["rows"]] == [sorted(r) for r in want["rows"]]  # the same metrics, steps, validations
    if name in TIMING_DEPENDENT:  # which version samples a batch is a race: what the schedule cannot change
        steps = [
            (r["step"], r["groups/num_groups"], r["async/staleness_max"]) for r in got["rows"] if "actor/loss" in r
        ]
        assert [s[:2] for s in steps] == [
            (r["step"], r["groups/num_groups"]) for r in want["rows"] if "actor/loss" in r
        ]
        assert all(0 <= s[2] <= 2 for s in steps)
    elif SAME_MACHINE:
        assert got["rows"] == want["rows"]
        assert got["weights_sha256"] == want["weights_sha256"]
    else:
        for got_row, want_row in zip(got["rows"], want["rows"], strict=True):
            assert got_row == pytest.approx(want_row, rel=1e-5, abs=1e-7), got_row["step"]
        assert got["weights_sum"] == pytest.approx(want["weights_sum"], rel=1e-5)
        assert got["weights_sumsq"] == pytest.approx(want["weights_sumsq"], rel=1e-5)
