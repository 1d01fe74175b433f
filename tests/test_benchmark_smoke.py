"""The benchmark script runs end to end on a small size (its numbers are not checked here)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_estimators  # noqa: E402


def test_the_estimator_benchmark_runs_and_checks_its_own_results(tmp_path):
    out = tmp_path / "RESULTS.md"
    rows = bench_estimators.main(["--sizes", "4096", "--no-compile", "--output", str(out)])
    assert {r["estimator"] for r in rows} == set(bench_estimators.ESTIMATORS)
    assert {r["layout"] for r in rows} == {"equal", "ragged"}
    assert all(r["ours"] > 0 and r["loop"] > 0 for r in rows)
    assert "| 4,096 | equal | grpo |" in out.read_text()


def test_the_returns_benchmark_runs_every_method_and_agrees_with_float64(tmp_path):
    import bench_returns

    rows = bench_returns.main(["--shapes", "8x130", "--gammas", "0.9,1.0", "--output", str(tmp_path / "r.md")])
    assert {r["method"] for r in rows} == {"ours", "time-major scan", "batch-major scan"}
    assert all(r["error"] < 1e-5 for r in rows)
    assert "| 8 x 130 | 0.9 | ours |" in (tmp_path / "r.md").read_text()


def test_a_benchmark_writes_its_results_outside_the_repository_unless_asked(tmp_path, monkeypatch):
    import bench_returns

    tracked = Path(bench_returns.__file__).parent / "RESULTS_returns.md"
    before = tracked.read_bytes()
    monkeypatch.chdir(tmp_path)
    try:
        bench_returns.main(["--shapes", "8x130", "--gammas", "1.0"])
        assert tracked.read_bytes() == before  # the recorded numbers stay as they were
        assert "| 8 x 130 | 1.0 | ours |" in (tmp_path / "outputs" / "benchmarks" / "RESULTS_returns.md").read_text()
    finally:
        tracked.write_bytes(before)
