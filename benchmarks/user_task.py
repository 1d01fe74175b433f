"""A task of a user's own: reverse 4-letter words over ``abcd`` (``{"prompt": "abcd=", "answer":
"dcba"}``, 2048 rows drawn from seed 0) with a partial-credit reward (the share of the answer's
letters in their place), ``rllm-torch-train task=file`` with no length setting (the response length
is taken from the answers: twice the longest, 8 tokens) beside the same run at the old default of
2 new tokens, 30 steps each, everything else at its default. Per run: the training reward by step,
the first step above 0.2, the share of responses cut at the length limit, and whether any whole
answer was written (a reward of 1.0). ``tests/cli/test_users_own_task.py`` runs the first in the
suite.

    python benchmarks/user_task.py --write-results

Writes ``RESULTS_user_task.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from machine import cpu_name  # noqa: E402
from results import add_write_results, results_path  # noqa: E402
from train_runs import train_run  # noqa: E402

REWARD = """def score(task, response):
    answer, response = task["answer"], response.strip()
    longest = max(len(answer), len(response))
    return sum(a == b for a, b in zip(answer, response)) / longest if longest else 1.0
"""
RUNS = [
    ("no length setting (derived)", []),
    ("rllm.rollout.max_new_tokens=2 (the old default)", ["rllm.rollout.max_new_tokens=2"]),
]
CUT = "batch/termination_reason/max_response_length_exceeded"


def write_task(out: Path) -> list[str]:
    """The data and the reward module in ``out``; the file task's overrides."""
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    words = ["".join(rng.choice("abcd") for _ in range(4)) for _ in range(2048)]
    (out / "words.jsonl").write_text("".join(json.dumps({"prompt": f"{w}=", "answer": w[::-1]}) + "\n" for w in words))
    (out / "partial.py").write_text(REWARD)
    return ["task=file", f"task.train_path={(out / 'words.jsonl').absolute()}", "task.reward_fn=partial:score"]


def start_record(out: Path, reuse: bool) -> dict:
    """The load average and the arguments when the runs started (read back with ``reuse``)."""
    record = out / "started.json"
    if reuse and record.is_file():
        return json.loads(record.read_text())
    arguments = " ".join(a for a in sys.argv[1:] if a not in ("--reuse", "--write-results"))
    started = {"load": os.getloadavg()[0], "arguments": f"{arguments} --write-results".strip()}
    record.write_text(json.dumps(started))
    return started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("outputs") / "user_task")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--reuse", action="store_true", help="read back finished runs in --out instead of running them")
    add_write_results(parser)
    args = parser.parse_args()
    task = write_task(args.out)
    started = start_record(args.out, args.reuse)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(args.out.absolute()), os.environ.get("PYTHONPATH")]))
    lines = [
        "# A task of a user's own: reverse-word with a partial-credit reward",
        "",
        f"Machine: {cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, Python {platform.python_version()}; "
        f"load average {started['load']:.2f} at the start.",
        f"Command: `python benchmarks/user_task.py {started['arguments']}`; each run is `rllm-torch-train "
        f"{' '.join(task[:1] + ['task.train_path=words.jsonl'] + task[2:])} rllm.trainer.total_batches={args.steps} [setting]` "
        "(the tiny model from scratch, 64 prompts x 8 rollouts a step, one thread).",
        "",
        "| run | training reward, steps 1 / 10 / 20 / 30 | first step above 0.2 | responses cut at the limit, step 1 → 30 "
        "| a whole answer written (reward 1.0) from step |",
        "|---|---|---|---|---|",
    ]
    for label, overrides in RUNS:
        name = "derived" if not overrides else "two_tokens"
        done = train_run(
            args.out / name, [*task, f"rllm.trainer.total_batches={args.steps}", *overrides], "batch/reward"
        )
        rows = [row for row in done["rows"] if "batch/reward" in row]
        reward = {row["step"]: row["batch/reward"] for row in rows}
        above = next((row["step"] for row in rows if row["batch/reward"] > 0.2), None)
        whole = next((row["step"] for row in rows if row["reward/solver/max"] == 1.0), None)
        marks = [s for s in (1, 10, 20, 30) if s in reward]
        lines.append(
            f"| {label} | {' / '.join(f'{reward[s]:.3f}' for s in marks)} | {above if above else 'none'} | "
            f"{rows[0][CUT]:.0%} → {rows[-1][CUT]:.0%} | {whole if whole else 'never'} |"
        )
    path = results_path("RESULTS_user_task.md", args.write_results)
    path.write_text("\n".join(lines) + "\n")
    print(path.read_text())


if __name__ == "__main__":
    main()
