"""Learning with the 2026 policy losses, loss options and estimators on the default task: 64 steps
of ``rllm-torch-train`` per setting and seed, validation pass@1 before and after, from real runs.

    python benchmarks/bench_losses.py --write-results      # 2 seeds, 2 runs at a time

The losses and loss options run with ``backend.ppo_epochs=2`` (with one update per batch the ratio
is 1 and every ratio loss has the REINFORCE gradient: the second epoch is where they differ), each
beside ``ppo`` under the same setting; the estimators with the default single update, beside
``grpo``. Each run sets ``seed`` and ``backend.seed`` (a seed is another initialisation and other
samples) and one thread. Writes ``RESULTS_losses.md``.
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

TWO_EPOCHS = ["backend.ppo_epochs=2"]
#: (label, overrides): the losses by their peers' names, then the options, then the estimators.
SETTINGS = [
    ("loss_fn=ppo (reference)", [*TWO_EPOCHS]),
    ("loss_fn=sapo (SAPO)", [*TWO_EPOCHS, "rllm.algorithm.loss_fn=sapo"]),
    ("loss_fn=geo_mean (GMPO)", [*TWO_EPOCHS, "rllm.algorithm.loss_fn=geo_mean"]),
    ("loss_fn=dppo_tv", [*TWO_EPOCHS, "rllm.algorithm.loss_fn=dppo_tv"]),
    ("loss_fn=dppo_kl", [*TWO_EPOCHS, "rllm.algorithm.loss_fn=dppo_kl"]),
    ("loss_fn=clip_cov", [*TWO_EPOCHS, "rllm.algorithm.loss_fn=clip_cov"]),
    ("loss_fn=kl_cov", [*TWO_EPOCHS, "rllm.algorithm.loss_fn=kl_cov"]),
    (
        "loss_fn=luspo (seq-mean-token-sum)",
        [*TWO_EPOCHS, "rllm.algorithm.loss_fn=luspo", "rllm.algorithm.loss_agg_mode=seq-mean-token-sum"],
    ),
    ("loss_fn=vespo", [*TWO_EPOCHS, "rllm.algorithm.loss_fn=vespo"]),
    ("ppo, backend.delta=1.5 (TRL's two-sided clip)", [*TWO_EPOCHS, "backend.delta=1.5"]),
    ("ppo, backend.top_entropy_quantile=0.2", [*TWO_EPOCHS, "backend.top_entropy_quantile=0.2"]),
    (
        "ppo, use_kl_loss, kl_loss_type=k3+",
        [*TWO_EPOCHS, "rllm.algorithm.use_kl_loss=true", "rllm.algorithm.kl_loss_type=k3+"],
    ),
    ("adv_estimator=grpo (reference)", []),
    ("adv_estimator=maxrl", ["rllm.algorithm.adv_estimator=maxrl"]),
    ("adv_estimator=remax", ["rllm.algorithm.adv_estimator=remax"]),
    ("adv_estimator=optimal_token_baseline", ["rllm.algorithm.adv_estimator=optimal_token_baseline"]),
]
PASS1 = "val/arithmetic/pass@1"


def run_one(out: Path, label: str, overrides: list[str], seed: int, steps: int) -> dict:
    name = "".join(c if c.isalnum() else "_" for c in label)[:60] + f"_seed{seed}"
    done = train_run(
        out / name,
        [f"rllm.trainer.total_batches={steps}", f"seed={seed}", f"backend.seed={seed}", *overrides],
        PASS1,
    )
    train_s = sum(row.get("time/step", 0.0) for row in done["rows"])
    return {"label": label, "seed": seed, "curve": done["curve"], "train_s": train_s, "wall_s": done["wall_s"]}


def write(results: list[dict], path: Path, args: argparse.Namespace) -> None:
    lines = [
        "# The 2026 losses, loss options and estimators on the default task",
        "",
        f"Machine: {cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, Python {platform.python_version()}.",
        f"Command: `python benchmarks/bench_losses.py {' '.join(sys.argv[1:])}` ({args.steps} steps per run, one "
        f"thread per run, {args.jobs} runs at a time; `seed` and `backend.seed` set together).",
        "",
        "Validation pass@1 (64 prompts x 4 samples) before training and after the last step, per seed;",
        "training: the summed `time/step` of the run's steps (median over the seeds); wall: the whole command.",
        "",
        "| setting | val pass@1 before → after (" + "; ".join(f"seed {s}" for s in args.seeds) + ") | mean after "
        "| training s | wall s |",
        "|---|---|---|---|---|",
    ]
    for label, _ in SETTINGS:
        rows = sorted((r for r in results if r["label"] == label), key=lambda r: r["seed"])
        if not rows:
            continue
        cells = "; ".join(f"{r['curve'][0][1]:.3f} → {r['curve'][-1][1]:.3f}" for r in rows)
        after = sum(r["curve"][-1][1] for r in rows) / len(rows)
        train = sorted(r["train_s"] for r in rows)[len(rows) // 2]
        wall = sorted(r["wall_s"] for r in rows)[len(rows) // 2]
        lines.append(f"| {label} | {cells} | {after:.3f} | {train:.1f} | {wall:.0f} |")
    path.write_text("\n".join(lines) + "\n")
    print(path.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", nargs="*", help="run only the settings whose label contains one of these")
    parser.add_argument("--out", type=Path, default=Path("outputs") / "losses")
    add_write_results(parser)
    args = parser.parse_args()
    chosen = [(lab, o) for lab, o in SETTINGS if not args.only or any(k in lab for k in args.only)]
    runs = [(lab, o, s) for lab, o in chosen for s in args.seeds]
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda run: run_one(args.out, *run, args.steps), runs))
    write(results, results_path("RESULTS_losses.md", args.write_results), args)


if __name__ == "__main__":
    main()
