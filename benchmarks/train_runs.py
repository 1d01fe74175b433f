"""One real ``rllm-torch-train`` run for a benchmark: the command with its overrides, one thread,
its wall time and the validation curve it logged (shared by the learning benchmarks)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

__all__ = ["train_run"]


def train_run(run_dir: Path, overrides: list[str], curve_key: str, *, reuse: bool = False) -> dict:
    """Run ``rllm-torch-train *overrides`` into ``run_dir`` (emptied first) with one thread.

    ``reuse``: a finished run already in ``run_dir`` (its ``metrics.jsonl``) is read back instead of
    run again, e.g. to rebuild a results table; unless its ``bench_run.json`` (written when a run
    finishes) names other overrides. Its wall time is known only from that record.

    Returns ``{"curve": [(step, value of curve_key)], "rows": metrics rows, "wall_s": seconds}``.

    Raises:
        RuntimeError: the run failed (its output's tail in the message).
    """
    record = run_dir / "bench_run.json"
    recorded = json.loads(record.read_text()) if record.is_file() else {"overrides": overrides, "wall_s": None}
    if reuse and (run_dir / "metrics.jsonl").is_file() and recorded["overrides"] == overrides:
        wall = recorded["wall_s"]
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
        command = [shutil.which("rllm-torch-train") or "rllm-torch-train", *overrides, f"hydra.run.dir={run_dir}"]
        start = time.perf_counter()
        done = subprocess.run(
            command, capture_output=True, text=True, env=os.environ | {"OMP_NUM_THREADS": "1"}, check=False
        )
        wall = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError(
                f"{run_dir.name} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
        record.write_text(json.dumps({"overrides": overrides, "wall_s": wall}))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    curve = [(row["step"], row[curve_key]) for row in rows if curve_key in row]
    return {"curve": curve, "rows": rows, "wall_s": wall}
