"""The default job and every built-in estimator's experiment, as a user runs them: ``rllm-torch-train``
with no arguments, and ``rllm-torch-train --config-name <estimator>``, 256 steps each, one at a time,
one thread; validation pass@1 and pass@4 before and after, the default run's validation curve, the
summed step times and the wall time of each command. ``docs/training.md``'s first two tables are
these numbers (``tests/test_docs.py`` checks that they are the file's).

    python benchmarks/default_runs.py --write-results      # about 5 x 1-3 minutes on 2 cores

Writes ``RESULTS_default_runs.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from machine import cpu_name  # noqa: E402
from results import add_write_results, results_path  # noqa: E402
from train_runs import train_run  # noqa: E402

#: (label, arguments of rllm-torch-train): the default job, then the estimators' experiments.
RUNS = [
    ("`grpo` (default)", []),
    ("`rloo`", ["--config-name", "rloo"]),
    ("`reinforce`", ["--config-name", "reinforce"]),
    ("`reinforce_plus_plus_baseline`", ["--config-name", "reinforce_plus_plus_baseline"]),
    ("`prpo`", ["--config-name", "prpo"]),
]
PASS1, PASS4 = "val/arithmetic/pass@1", "val/arithmetic/pass@4"


def run_one(out: Path, label: str, arguments: list[str], reuse: bool) -> dict:
    name = label.strip("`").split("`")[0]
    done = train_run(out / name, arguments, PASS1, reuse=reuse)
    pass4 = [(row["step"], row[PASS4]) for row in done["rows"] if PASS4 in row]
    train_s = sum(row.get("time/step", 0.0) for row in done["rows"])
    return {"label": label, "curve": done["curve"], "pass4": pass4, "train_s": train_s, "wall_s": done["wall_s"]}


def step_table(curve: list[tuple[int, float]]) -> list[str]:
    """The default run's validation pass@1 at every validation, as one Markdown table."""
    return [
        "| step | " + " | ".join(str(step) for step, _ in curve) + " |",
        "|---|" + "---|" * len(curve),
        "| val pass@1 | " + " | ".join(f"{value:.3f}" for _, value in curve) + " |",
    ]


def write(results: list[dict], path: Path, started: dict) -> None:
    default = results[0]
    lines = [
        "# The default job and the estimators' experiments",
        "",
        f"Machine: {cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, Python {platform.python_version()}; "
        f"load average {started['load']:.2f} when the runs started (above 1: other jobs shared the cores, and the times "
        "with them).",
        f"Command: `python benchmarks/default_runs.py {started['arguments']}` (each run: `rllm-torch-train "
        "[--config-name NAME]`, one thread, one run at a time).",
        "",
        "## The default job (`rllm-torch-train`)",
        "",
        f"{default['curve'][-1][0]} steps; training {default['train_s']:.1f} s (the sum of `time/step`), wall "
        f"{default['wall_s']:.0f} s for the whole command; validation pass@1 {default['curve'][0][1]:.3f} → "
        f"{default['curve'][-1][1]:.3f}, pass@4 {default['pass4'][0][1]:.3f} → {default['pass4'][-1][1]:.3f}.",
        "",
        *step_table(default["curve"]),
        "",
        "## Every built-in estimator (`rllm-torch-train --config-name <name>`)",
        "",
        "| estimator | val pass@1 before → after | val pass@4 before → after | training s | wall s |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['label']} | {r['curve'][0][1]:.3f} → {r['curve'][-1][1]:.3f} | {r['pass4'][0][1]:.3f} → "
            f"{r['pass4'][-1][1]:.3f} | {r['train_s']:.1f} | {r['wall_s']:.0f} |"
        )
    path.write_text("\n".join(lines) + "\n")
    print(path.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("outputs") / "default_runs")
    parser.add_argument("--reuse", action="store_true", help="read back finished runs in --out instead of running them")
    add_write_results(parser)
    args = parser.parse_args()
    started = start_record(args.out, args.reuse)
    results = [run_one(args.out, label, arguments, args.reuse) for label, arguments in RUNS]
    write(results, results_path("RESULTS_default_runs.md", args.write_results), started)


def start_record(out: Path, reuse: bool) -> dict:
    """The load average and the arguments when the runs started (read back with ``reuse``)."""
    record = out / "started.json"
    if reuse and record.is_file():
        return json.loads(record.read_text())
    out.mkdir(parents=True, exist_ok=True)
    arguments = " ".join(a for a in sys.argv[1:] if a not in ("--reuse", "--write-results"))
    started = {"load": os.getloadavg()[0], "arguments": f"{arguments} --write-results".strip()}
    record.write_text(json.dumps(started))
    return started


if __name__ == "__main__":
    main()
