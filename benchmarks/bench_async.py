"""Async training against the synchronous loop, in real ``rllm-torch-train`` runs, one at a time
(each run's timing is its own): steps per hour, and validation pass@1 at equal steps and at
equal wall-clock time.

    python benchmarks/bench_async.py --write-results                 # every part below
    python benchmarks/bench_async.py --parts latency --seeds 0 1     # one part

Parts:

* ``latency``: ``task=guess`` (up to 4 turns) whose environment waits 50-200 ms before each
  feedback (``task.env_latency_ms=[50,200]``, a tool call), rloo with GiGPO's credit (the shipped
  ``guess`` experiment); sync for ``--steps`` steps, async for three times as many at staleness 1
  (without and with partial rollouts), 2 and 4 (with), each with AReaL's decoupled PPO
  (``tis_mode=token_mask``, cap 5), validation every 16 steps. "pass@1 at equal wall-clock" is each async run's last
  validation logged no later than the synchronous run's whole training time.
* ``chain``: two-turn chains with one such wait per episode (sync, staleness 1 without and with
  partial rollouts): where sampling and the update take about as long.
* ``default``: the default task (arithmetic, no latency), sync against staleness 1, 2, 4.
* ``real``: SmolLM2-135M-Instruct (``--config-name smollm2``, its README command), a few steps.

Steps per hour count training time only (the sum of ``time/step``; validation and start-up
excluded); "training s" adds the validations (the clock that "at sync's time" compares). Every
run of the first three parts has ``OMP_NUM_THREADS=1`` and ``backend.num_threads=1`` (the
``real`` part keeps its config's every core, as its README command does): the synchronous
loop computes on one core, the async one samples on the main thread while its update runs in a
second thread, so on this 2-core machine it may also use the second core; the overlap of an
environment's waits with the update is what the latency part measures. Writes ``RESULTS_async.md``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from machine import cpu_name  # noqa: E402
from results import add_write_results, results_path  # noqa: E402
from train_runs import train_run  # noqa: E402

PARTIAL = "rllm.async_training.partial_rollout=true"
#: (label, overrides): sync, then async at staleness 1 without and with partial rollouts, 2 and 4 with them
MODES = [
    ("sync", []),
    ("async, staleness 1", ["rllm.async_training.staleness_threshold=1"]),
    *[(f"async, staleness {k}, partial", [f"rllm.async_training.staleness_threshold={k}", PARTIAL]) for k in (1, 2, 4)],
]
#: the default task has no environment: no partial rollouts there
PLAIN_MODES = [
    ("sync", []),
    *[(f"async, staleness {k}", [f"rllm.async_training.staleness_threshold={k}"]) for k in (1, 2, 4)],
]
#: async mode with AReaL's decoupled PPO (the sampler's log-probs weigh each token, masked beyond 5)
ASYNC = [
    "rllm.async_training.enable=true",
    "rllm.algorithm.rollout_correction.tis_mode=token_mask",
    "rllm.algorithm.rollout_correction.tis_cap=5",
]


def _runs(
    out: Path,
    name: str,
    base: list[str],
    pass_key: str,
    seed: int,
    steps: int,
    long_steps: int,
    modes: list,
    reuse: bool = False,
) -> list[dict]:
    """One run per ``(label, overrides)`` of ``modes``, the async ones ``long_steps`` long."""
    results = []
    for label, extra in modes:
        is_async = label != "sync"
        overrides = [*base, *(ASYNC if is_async else []), *extra, f"seed={seed}", f"backend.seed={seed}"]
        n = long_steps if is_async else steps
        done = train_run(
            out / f"{name}_{label.replace(', ', '_').replace(' ', '')}_seed{seed}",
            [*overrides, f"rllm.trainer.total_batches={n}"],
            pass_key,
            reuse=reuse,
        )
        trained = [r for r in done["rows"] if "time/step" in r]
        elapsed, clock = 0.0, {}  # the training time (steps and validations) when each validation ended
        for row in done["rows"]:
            elapsed += row.get("time/step", 0.0) + row.get("time/testing", 0.0)
            if pass_key in row:
                clock[row["step"]] = elapsed
        step_s = [r["time/step"] for r in trained]
        results.append(
            {
                "label": label,
                "seed": seed,
                "steps": len(trained),
                "steps_per_hour": 3600 / statistics.mean(step_s),
                "curve": done["curve"],
                "clock": clock,
                "wall_s": done["wall_s"],
                "stale_max": max((r.get("async/staleness_max", 0) for r in trained), default=0),
                "stale_mean": statistics.mean(r.get("async/staleness_mean", 0.0) for r in trained),
            }
        )
        print(
            f"{name} seed {seed} {label}: {results[-1]['steps_per_hour']:.0f} steps/h, {done['curve'][-1]}", flush=True
        )
    return results


def _at(curve: list[tuple[int, float]], step: int) -> float | None:
    return next((v for s, v in curve if s == step), None)


def _number(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _table(results: list[dict], steps: int) -> list[str]:
    sync = {r["seed"]: r for r in results if r["label"] == "sync"}
    lines = [
        "| mode | seed | steps/hour | x sync | staleness mean / max | pass@1 at step "
        f"{steps} | pass@1 at sync's time (step reached) | last pass@1 (step) | training s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        base = sync[r["seed"]]
        budget = max(base["clock"].values())
        reached = [s for s, t in r["clock"].items() if t <= budget * 1.0001]
        at_time = (_at(r["curve"], max(reached)), max(reached)) if reached else (None, None)
        equal_steps = _at(r["curve"], steps)
        last = r["curve"][-1]
        lines.append(
            f"| {r['label']} | {r['seed']} | {r['steps_per_hour']:.0f} | {r['steps_per_hour'] / base['steps_per_hour']:.2f} "
            f"| {r['stale_mean']:.2f} / {r['stale_max']:.0f} | {_number(equal_steps)} "
            f"| {_number(at_time[0])} ({at_time[1] or 'none by then'}) | {last[1]:.3f} ({last[0]}) "
            f"| {max(r['clock'].values()):.0f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", default=["latency", "chain", "default", "real"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--steps", type=int, default=64, help="the synchronous run's steps (latency part)")
    parser.add_argument("--out", type=Path, default=Path("outputs/bench_async"))
    parser.add_argument("--append", action="store_true", help="add the sections to the results file already there")
    parser.add_argument("--reuse", action="store_true", help="read back the runs already in --out (train_runs.py)")
    add_write_results(parser)
    args = parser.parse_args()
    one_thread = ["backend.num_threads=1", "rllm.trainer.log_table_every=0", "rllm.trainer.save_freq=0"]
    sections = []
    if "latency" in args.parts:
        base = ["--config-name", "guess", "task.env_latency_ms=[50,200]", "rllm.trainer.test_freq=16", *one_thread]
        results = [
            r
            for seed in args.seeds
            for r in _runs(
                args.out, "guess", base, "val/guess/pass@1", seed, args.steps, 3 * args.steps, MODES, args.reuse
            )
        ]
        sections += [
            "## A multi-turn task whose environment waits 50-200 ms per reply",
            "",
            f"`--config-name guess task.env_latency_ms=[50,200]`, validation every 16 steps (64 prompts x 4); sync "
            f"{args.steps} steps, async {3 * args.steps} with `tis_mode=token_mask tis_cap=5` (decoupled PPO).",
            "",
            *_table(results, args.steps),
            "",
        ]
    if "chain" in args.parts:
        base = ["--config-name", "chain", "task.env_latency_ms=[50,200]", "rllm.trainer.test_freq=16", *one_thread]
        results = [
            r
            for seed in args.seeds
            for r in _runs(
                args.out, "chain", base, "val/chain/pass@1", seed, args.steps, 3 * args.steps, MODES[:3], args.reuse
            )
        ]
        sections += [
            "## Two-turn chains, one environment reply of 50-200 ms per episode",
            "",
            f"`--config-name chain task.env_latency_ms=[50,200]`, the same settings as above (sync {args.steps} steps, "
            f"async {3 * args.steps}); this task learns slowly at this size (pass@1 stays low), its row is the speed.",
            "",
            *_table(results, args.steps),
            "",
        ]
    if "default" in args.parts:
        base = ["rllm.trainer.test_freq=32", *one_thread]
        results = _runs(
            args.out, "default", base, "val/arithmetic/pass@1", args.seeds[0], 64, 64, PLAIN_MODES, args.reuse
        )
        sections += ["## The default task (no environment latency)", "", *_table(results, 64), ""]
    if "real" in args.parts:
        base = ["--config-name", "smollm2", "rllm.trainer.test_freq=4", "rllm.trainer.val_before_train=false"]
        base += ["rllm.trainer.log_table_every=0", "rllm.trainer.save_freq=0", "task.val_size=16"]
        modes = [MODES[0], MODES[2]]  # sync, and staleness 1 with partial rollouts
        results = _runs(args.out, "smollm2", base, "val/word_addition/pass@1", args.seeds[0], 4, 4, modes, args.reuse)
        sections += [
            "## A real checkpoint: SmolLM2-135M-Instruct, 4 steps (its README command, 2 threads)",
            "",
            *_table(results, 4),
            "",
        ]
    header = [
        "# Async training against the synchronous loop",
        "",
        f"Machine: {cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}, Python "
        f"{platform.python_version()}. Command: `python benchmarks/bench_async.py --write-results` (runs one at a time).",
        "",
    ]
    path = results_path("RESULTS_async.md", args.write_results)
    if args.append and path.is_file():  # another part's sections under the first call's header
        text = (
            path.read_text().rstrip("\n")
            + "\n\n"
            + f"(`--parts {' '.join(args.parts)}`, a later call:)\n\n"
            + "\n".join(sections)
        )
    else:
        text = "\n".join(header + sections)
    print(text)
    path.write_text(text + "\n")


if __name__ == "__main__":
    main()
