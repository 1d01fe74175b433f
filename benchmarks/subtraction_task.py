"""A held-out task for the pretrained recipe's checks: two-digit subtractions asked in words
("What is 82 - 27? Answer with the number only.", never a negative answer), as JSONL files for
``task=file`` (scored by the number the response answers with, as ``word_addition`` scores it).
The recipe (``configs/smollm2.yaml``) names ``word_addition``; its defaults are checked on this
task, which no setting was chosen on.

    python benchmarks/subtraction_task.py /tmp/subtraction   # subtraction.jsonl (4096 rows), subtraction_val.jsonl (64)
    rllm-torch-train --config-name smollm2 task=file task.train_path=/tmp/subtraction/subtraction.jsonl \\
        task.val_path=/tmp/subtraction/subtraction_val.jsonl task.apply_chat_template=true \\
        task.reward_fn=rllm_torch.rollouts.word_addition:final_number_reward
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

__all__ = ["subtraction_rows", "write_task", "OVERRIDES"]

TRAIN_ROWS, VAL_ROWS = 4096, 64


def subtraction_rows(count: int, seed: int) -> list[dict]:
    """``count`` rows ``{"prompt", "answer"}`` of ``a - b`` with two-digit ``a >= b``, drawn by ``random.Random(seed)``."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = sorted((rng.randint(10, 99), rng.randint(10, 99)), reverse=True)
        rows.append({"prompt": f"What is {a} - {b}? Answer with the number only.", "answer": str(a - b)})
    return rows


def write_task(directory: Path) -> list[str]:
    """Write ``subtraction.jsonl`` (seed 0) and ``subtraction_val.jsonl`` (seed 1) into
    ``directory`` (the data source is named after the first: ``val/subtraction/pass@1``); returns
    the ``task=file`` overrides that train on them."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, count, seed in (("subtraction", TRAIN_ROWS, 0), ("subtraction_val", VAL_ROWS, 1)):
        lines = [json.dumps(row) for row in subtraction_rows(count, seed)]
        (directory / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    return [
        f"task.train_path={directory / 'subtraction.jsonl'}",
        f"task.val_path={directory / 'subtraction_val.jsonl'}",
        *OVERRIDES,
    ]


OVERRIDES = ["task.apply_chat_template=true", "task.reward_fn=rllm_torch.rollouts.word_addition:final_number_reward"]


if __name__ == "__main__":
    print(" ".join(write_task(Path(sys.argv[1]))))
