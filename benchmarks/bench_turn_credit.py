"""Learning with multi-turn credit: ``rllm.stepwise_advantage.mode`` broadcast vs turn_level vs
gigpo on the multi-turn tasks (``task=chain``, ``task=guess``), two seeds each, the same
estimator for every mode; validation pass@1 at equal steps, from real ``rllm-torch-train`` runs.

    python benchmarks/bench_turn_credit.py --write-results     # 12 runs, 2 at a time

Writes ``RESULTS_turn_credit.md`` (the table), and ``turn_credit_curves.png`` (the curves) beside
it, or with ``--write-results`` into ``docs/images/`` (the documentation shows it). Each run is the experiment config of its task (``--config-name chain`` / ``guess``) with
``rllm.algorithm.adv_estimator``, ``rllm.stepwise_advantage.mode``, ``seed`` and ``backend.seed`` set; one thread
per run.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from machine import cpu_name  # noqa: E402
from results import add_write_results, results_path  # noqa: E402
from train_runs import train_run  # noqa: E402


def run_one(out: Path, task: str, mode: str, seed: int, estimator: str, extra: list[str]) -> dict:
    name = f"{task}_{mode}_seed{seed}"
    overrides = [
        "--config-name",
        task,
        f"rllm.algorithm.adv_estimator={estimator}",
        f"rllm.stepwise_advantage.mode={mode}",
        f"seed={seed}",
        f"backend.seed={seed}",  # the model's initialisation and the sampler: a seed is a different run
        f"rllm.trainer.experiment_name={name}",
        *extra,
    ]
    done = train_run(out / name, overrides, f"val/{task}/pass@1")
    return {"task": task, "mode": mode, "seed": seed, "curve": done["curve"], "wall_s": done["wall_s"]}


def write(results: list[dict], path: Path, args: argparse.Namespace) -> None:
    lines = [
        "# Multi-turn credit: broadcast vs turn_level vs gigpo",
        "",
        f"Machine: {cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, Python {platform.python_version()}.",
        f"Command: `python benchmarks/bench_turn_credit.py {' '.join(sys.argv[1:])}` "
        f"(estimator `{args.estimator}` in every mode; one thread per run, {args.jobs} runs at a time).",
        "",
        "Validation pass@1 (64 prompts x 4 samples) at each validation step; last column: the mean over",
        "the last two validations.",
        "",
    ]
    for task in args.tasks:
        rows = [r for r in results if r["task"] == task]
        steps = [s for s, _ in rows[0]["curve"]]
        lines += [
            f"## task={task}",
            "",
            "| mode | seed | " + " | ".join(f"step {s}" for s in steps) + " | last two | wall s |",
        ]
        lines.append("|---|---|" + "---|" * (len(steps) + 2))
        for r in sorted(rows, key=lambda r: (args.modes.index(r["mode"]), r["seed"])):
            values = [v for _, v in r["curve"]]
            lines.append(
                f"| {r['mode']} | {r['seed']} | "
                + " | ".join(f"{v:.3f}" for v in values)
                + f" | {sum(values[-2:]) / 2:.3f} | {r['wall_s']:.0f} |"
            )
        lines.append("")
    path.write_text("\n".join(lines))
    print(path.read_text())
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, len(args.tasks), figsize=(5 * len(args.tasks), 3.5), squeeze=False)
    colours = dict(zip(args.modes, ["tab:gray", "tab:blue", "tab:orange", "tab:green"], strict=False))
    for ax, task in zip(axes[0], args.tasks, strict=True):
        for r in (r for r in results if r["task"] == task):
            steps, values = zip(*r["curve"], strict=True)
            ax.plot(
                steps,
                values,
                color=colours[r["mode"]],
                linestyle="-" if r["seed"] == 0 else "--",
                label=f"{r['mode']} seed {r['seed']}",
            )
        ax.set_title(f"task={task}")
        ax.set_xlabel("step")
        ax.set_ylabel("validation pass@1")
        ax.legend(fontsize=7)
    fig.tight_layout()
    figure = path.with_name("turn_credit_curves.png")
    if path.parent == Path(__file__).parent:  # the tracked results: the documentation's figure
        figure = Path(__file__).parents[1] / "docs" / "images" / "turn_credit_curves.png"
    fig.savefig(figure, dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=["guess", "chain"])
    parser.add_argument("--modes", nargs="+", default=["broadcast", "turn_level", "gigpo"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--estimator", default="rloo")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("outputs") / "turn_credit")
    parser.add_argument("overrides", nargs="*", help="more Hydra overrides for every run")
    add_write_results(parser)
    args = parser.parse_args()
    runs = [(t, m, s) for t in args.tasks for m in args.modes for s in args.seeds]
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda run: run_one(args.out, *run, args.estimator, args.overrides), runs))
    write(results, results_path("RESULTS_turn_credit.md", args.write_results), args)


if __name__ == "__main__":
    main()
