"""The report of ``bench_trainer_vs_trl.py``: a table per seed (both sides' settings as they ran,
seconds per step, wall time, peak memory, held-out pass@1 before and after), the training reward
curve by bins, and a summary over the seeds; ``curves.csv`` and ``summary.json`` per seed."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

__all__ = ["NOTES", "SIDES", "report", "summary_table", "reward_bins", "write_curves"]

SIDES = {"ours": "rllm_torch", "trl": "TRL GRPOTrainer"}
STEP_KEYS = ("time/step", "batch/reward", "batch/response_length")  # per-step records of both sides

NOTES = (
    "Passes per step, both: one `generate` call over the step's prompts (KV cache), the reward, one forward and "
    "backward over every completion, one AdamW step. Neither runs a separate old-log-prob pass: TRL skips it when "
    "`num_iterations=1` and generation lines up with the optimizer step (its ratio is `exp(logp - logp.detach())`); "
    "ours skips it with one update a batch (`log_probs` above is the stage's time).",
    "TRL's training forward also computes every token's entropy (its fused LM head, a chunked autograd function, "
    "which on CPU scores every position, prompt ones included) and a few clip-ratio and entropy metrics; it decodes "
    "the completions for its own `completions` argument besides the reward function's decoding.",
    "Padding: TRL lays a batch out as left-padded prompts then right-padded completions (width: longest prompt + "
    "longest completion); ours packs each prompt + response from the left, right padded to the longest row.",
    "Positions: TRL's training forward passes no `position_ids`, so GPT-2's learned absolute positions of a "
    "left-padded (shorter) prompt are shifted by its padding, while `generate` sampled it at positions counted over "
    "real tokens; with the ratio fixed at 1 nothing flags it, but the gradient is of a slightly different policy. "
    "It needs prompts of different lengths in a batch: every prompt of the default `reverse` (7 tokens) and "
    "`arithmetic` (4) has the same length, so it does not touch these runs (it would with `task.min_digits` < "
    "`task.max_digits` or a file task). Ours counts positions over real tokens in both.",
    "Logging: both log every step (TRL `logging_steps=1`), outside the step times; TRL's data loading and logging "
    "between steps took under 10 ms a step in a check on `reverse` (not timed by this script). TRL 1.16's "
    "`GRPOConfig` defaults are `bf16=True` (bfloat16 autocast, on CPU too), `gradient_checkpointing=True`, "
    "`per_device_train_batch_size=8` with one accumulation step, and a shuffled dataset; the settings each run "
    "used are in its table (the dataset is never shuffled here, on either side).",
    "Wall time: ours includes Hydra's start-up, the final checkpoint, the exported model and `curves.png`; TRL's "
    "includes importing trl, datasets and accelerate and building the Arrow dataset.",
)


def reward_bins(steps: list[dict[str, float]], width: int) -> list[tuple[str, float, float]]:
    """``(label, mean reward, mean response length)`` over consecutive bins of ``width`` steps."""
    bins = []
    for start in range(0, len(steps), width):
        part = steps[start : start + width]
        label = f"{part[0]['step']}-{part[-1]['step']}"
        bins.append((label, *(statistics.fmean(r[k] for r in part) for k in ("batch/reward", "batch/response_length"))))
    return bins


def report(context: dict[str, Any], runs: dict[str, dict[str, Any]]) -> str:
    """The results file's text.

    Args:
        context: ``title``, ``command``, ``machine`` (CPU, cores, instruction sets, threads, load),
            ``versions``, ``both`` (what both sides share, one paragraph), ``steps``, ``warmup`` (steps left
            out of the per-step statistics), ``bin`` (steps per bin of the reward table).
        runs: by label (``seed=0``, ...): ``results`` (each side's :func:`summarize` plus ``peak_rss_gib``
            and, validated, ``val_before`` / ``val``), ``curves`` (each side's per-step records) and
            ``settings`` (each side's memory and speed settings as it ran, one line).
    """
    steps, warmup = context["steps"], context["warmup"]
    lines = [
        f"# {context['title']}",
        "",
        f"Run {context['date']} with `{context['command']}` on {context['machine']}; {context['versions']}.",
        "",
        context["both"],
        "",
    ]
    if len(runs) > 1:
        lines += [*summary_table(runs, steps, warmup), ""]
    for label, run in runs.items():
        ours, trl = run["results"]["ours"], run["results"]["trl"]
        lines += [
            f"## {label}" if len(runs) > 1 else "",
            "",
            f"Settings as they ran: ours {run['settings']['ours']}; TRL {run['settings']['trl']}.",
            "",
            f"| {steps} steps | {SIDES['ours']} | {SIDES['trl']} | TRL / ours (< 1: TRL faster) |",
            "|---|---|---|---|",
        ]
        rows = [
            (f"s / step, mean (steps {warmup + 1}-{steps})", "step_s_mean", "{:.3f}"),
            (f"s / step, median (steps {warmup + 1}-{steps})", "step_s_median", "{:.3f}"),
            ("sum of step times, s", "step_s_sum", "{:.1f}"),
            ("wall time of the process, s", "wall_s", "{:.1f}"),
            ("peak resident memory of the process, GiB", "peak_rss_gib", "{:.2f}"),
        ]
        for name, key, fmt in rows:
            lines.append(f"| {name} | {fmt.format(ours[key])} | {fmt.format(trl[key])} | {trl[key] / ours[key]:.2f}x |")
        for key in sorted(ours.get("val", {})):  # the final models on the same validation prompts
            before = ours.get("val_before", {}).get(key)
            start = f"{before:.3f} -> " if before is not None else ""
            lines.append(
                f"| {key} (our validation), step 0 -> {steps} | {start}{ours['val'][key]:.3f} | "
                f"{start}{trl['val'][key]:.3f} | |"
            )
        lines += [
            "",
            "Mean training reward per step (and mean response length in tokens, the end token included), "
            f"by bins of {context['bin']} steps:",
            "",
            f"| steps | {SIDES['ours']} reward | {SIDES['trl']} reward | {SIDES['ours']} length | {SIDES['trl']} length |",
            "|---|---|---|---|---|",
        ]
        for (name, ours_reward, ours_len), (_, trl_reward, trl_len) in zip(
            reward_bins(run["curves"]["ours"], context["bin"]),
            reward_bins(run["curves"]["trl"], context["bin"]),
            strict=True,
        ):
            lines.append(f"| {name} | {ours_reward:.3f} | {trl_reward:.3f} | {ours_len:.2f} | {trl_len:.2f} |")
        stages = ", ".join(f"{stage} {s:.3f}" for stage, s in ours["stage_s_median"].items())
        lines += ["", f"Our step by stage (median s over the same steps): {stages}.", ""]
    lines += [
        "Per-step curves of both sides: `curves.csv` and `summary.json` in each run's output directory.",
        "",
        "What differs (TRL 1.16 on CPU):",
        "",
        *(f"- {note}" for note in NOTES),
    ]
    return "\n".join(lines) + "\n"


def summary_table(runs: dict[str, dict[str, Any]], steps: int, warmup: int) -> list[str]:
    """One row per run: both sides' mean s / step, peak memory and final pass@1, and TRL / ours."""
    lines = [
        f"| run | s / step (steps {warmup + 1}-{steps}): ours | TRL | TRL / ours | peak GiB: ours | TRL | TRL / ours "
        "| pass@1 after: ours | TRL |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, run in runs.items():
        ours, trl = run["results"]["ours"], run["results"]["trl"]
        key = next((k for k in sorted(ours.get("val", {})) if k.endswith("/pass@1")), None)
        after = (f"{ours['val'][key]:.3f}", f"{trl['val'][key]:.3f}") if key else ("-", "-")
        lines.append(
            f"| {label} | {ours['step_s_mean']:.1f} | {trl['step_s_mean']:.1f} | "
            f"{trl['step_s_mean'] / ours['step_s_mean']:.2f}x | {ours['peak_rss_gib']:.2f} | {trl['peak_rss_gib']:.2f} | "
            f"{trl['peak_rss_gib'] / ours['peak_rss_gib']:.2f}x | {after[0]} | {after[1]} |"
        )
    return lines


def write_curves(out: Path, curves: dict[str, list[dict[str, float]]], results: dict[str, dict]) -> None:
    """``curves.csv``: per step, each side's seconds, mean reward and response length; ``summary.json``:
    the statistics and every per-step record."""
    names = {"time/step": "step_s", "batch/reward": "reward", "batch/response_length": "response_length"}
    header = ["step"] + [f"{side}_{names[key]}" for side in SIDES for key in STEP_KEYS]
    lines = [",".join(header)]
    for ours, trl in zip(curves["ours"], curves["trl"], strict=True):
        lines.append(",".join([str(ours["step"])] + [f"{row[k]:.6g}" for row in (ours, trl) for k in STEP_KEYS]))
    (out / "curves.csv").write_text("\n".join(lines) + "\n")
    (out / "summary.json").write_text(json.dumps({"summary": results, "steps": curves}, indent=1) + "\n")
