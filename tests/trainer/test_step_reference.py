"""The trainer's step gives the numbers it gave when ``tests/data/step_reference.json`` was
recorded (``tests/step_reference.py``): every metric of every step and validation, and the
exported weights, for the default job, the multi-turn tasks, async training at staleness 0,
per-role losses, remax, ``optimal_token_baseline`` and dynamic sampling; for async training at
staleness 2, whose samples depend on timing, what the schedule cannot change.

The runs are made and recorded with every CPU-dispatching library held to its portable code path
(``step_reference.PORTABLE_NUMERICS``), so the comparison is exact, bit for bit, on any x86-64 CPU:
no tolerance, and a one-line change of the step's arithmetic fails it."""

from __future__ import annotations

import json

import pytest
from step_reference import DATA, RUNS, TIMING_DEPENDENT, portable_runs

REFERENCE = json.loads(DATA.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every reference run, made once in a child process with portable numerics."""
    return portable_runs(tmp_path_factory.mktemp("step_reference"))["runs"]


@pytest.mark.parametrize("name", sorted(RUNS))
def test_the_step_gives_the_recorded_numbers(runs, name):
    want, got = REFERENCE["runs"][name], runs[name]
    assert [sorted(r) for r in got["rows"]] == [sorted(r) for r in want["rows"]]  # the same metrics, steps, validations
    if name in TIMING_DEPENDENT:  # which version samples a batch is a race: what the schedule cannot change
        steps = [
            (r["step"], r["groups/num_groups"], r["async/staleness_max"]) for r in got["rows"] if "actor/loss" in r
        ]
        assert [s[:2] for s in steps] == [
            (r["step"], r["groups/num_groups"]) for r in want["rows"] if "actor/loss" in r
        ]
        assert all(0 <= s[2] <= 2 for s in steps)
    else:
        assert got["rows"] == want["rows"]
        assert got["weights_sha256"] == want["weights_sha256"]
