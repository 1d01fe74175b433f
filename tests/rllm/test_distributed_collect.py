"""The collector across real gloo ranks: each rank's groups as one process would treat them in
the concatenation of every rank's groups; metrics of the global batch, the same on every rank."""

from __future__ import annotations

import math

import pytest
import rank_tasks
from hypothesis import given, settings
from hypothesis import strategies as st
from rank_pool import RankError, RankPool

from rllm_torch import ONE_PROCESS

settings.register_profile("distributed_collect", max_examples=25, deadline=None)


@pytest.fixture(scope="module")
def pool():
    ranks = RankPool(3)
    yield ranks
    ranks.close()


GROUP = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["solver", "judge"]),
        "rewards": st.one_of(
            st.lists(st.integers(0, 4).map(lambda v: v / 4), min_size=1, max_size=6),
            st.tuples(st.just(1.0), st.integers(2, 4)).map(lambda t: [t[0]] * t[1]),
        ),
        "steps": st.sampled_from([1, 2]),
        "precomputed": st.sampled_from([False, False, False, True]),
    }
)


@settings(settings.get_profile("distributed_collect"))
@given(
    per_rank=st.lists(st.lists(GROUP, max_size=4), min_size=3, max_size=3),
    estimator=st.sampled_from(["grpo", "reinforce_plus_plus_baseline", "prpo"]),
)
def test_collector_on_three_ranks_equals_one_process_on_the_concatenation(pool, per_rank, estimator):
    for r, groups in enumerate(per_rank):
        for i, g in enumerate(groups):
            g["task_id"] = f"task-{r}-{i}"
    config = dict(estimator=estimator, estimator_map={"judge": "rloo"}, use_precomputed_advantage=True)
    results = pool.run_ok(rank_tasks.collect, [(groups, config) for groups in per_rank])
    want_adv, want_metrics = rank_tasks.collect(
        [g for groups in per_rank for g in groups], config, process_group=ONE_PROCESS
    )
    got_adv = [a for adv, _ in results for a in adv]
    assert len(got_adv) == len(want_adv)
    for got_group, want_group in zip(got_adv, want_adv, strict=True):
        for got_steps, want_steps in zip(got_group, want_group, strict=True):
            for got, want in zip(got_steps, want_steps, strict=True):
                if isinstance(want, list):
                    assert got == want
                else:
                    assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9), (got, want)
    metrics = [m for _, m in results]
    assert all(m == metrics[0] for m in metrics), "metrics differ across ranks"
    assert metrics[0].keys() == want_metrics.keys()
    for key, want in want_metrics.items():
        assert math.isclose(metrics[0][key], want, rel_tol=1e-9, abs_tol=1e-9), (key, metrics[0][key], want)


def test_a_bad_reward_on_one_rank_fails_on_every_rank(pool):
    good = [{"task_id": "t", "role": "solver", "rewards": [1.0, 0.0]}]
    bad = [{"task_id": "u", "role": "solver", "rewards": [1.0, "high"]}]
    results = pool.run(rank_tasks.collect, [(good, {}), (bad, {}), (good, {})])
    assert all(isinstance(r, RankError) and r.type_name == "InvalidRewardTypeError" for r in results), results
    assert "'high'" in results[1].message and "rank 1 of 3" in results[0].message
    # and the ranks are still in step afterwards
    ok = pool.run_ok(rank_tasks.collect, [(good, {}), (good, {}), ([], {})])
    assert ok[2] == ([], ok[0][1])
