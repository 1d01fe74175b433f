"""Additions asked in words for a pretrained chat model (``"What is 27 + 82? Answer with the
number only."``), scored by the number the response ends on, as GSM8K's graders read it.

The reward (:func:`final_number_reward`) takes the answer a response gives the way peers' math
graders do: the content of the last ``\\boxed{...}`` when there is one (the MATH / DeepSeek-R1
convention), else the number after the last ``####`` (GSM8K's), else the last number in the
text (the "last number" fallback of lm-evaluation-harness' GSM8K flexible-extract filter). Commas
between digits and a trailing ``.0`` are dropped; the reward is 1.0 when that number equals the
answer, else 0.0.
"""

from __future__ import annotations

import random
import re
from typing import Any

from rllm_torch.core.errors import ConfigError
from rllm_torch.rollouts.task import Task, alphabet_of, seeded_splits

__all__ = ["extract_final_number", "final_number_reward", "word_addition_problems", "word_addition_task"]

_NUMBER = r"-?\d[\d,]*(?:\.\d+)?"
_BOXED = re.compile(r"\\boxed\{\s*(" + _NUMBER + r")\s*\}")
_HASHES = re.compile(r"####\s*(" + _NUMBER + ")")
_ANY = re.compile(_NUMBER)


def extract_final_number(response: str) -> str | None:
    """The number ``response`` answers with: the last ``\\boxed{n}``, else the last ``#### n``,
    else the last number; commas removed and a ``.0`` fraction dropped. None when there is none.

    Examples:
        >>> extract_final_number("27 + 82 = 109"), extract_final_number("so #### 1,234 and 5")
        ('109', '1234')
        >>> extract_final_number(r"\\boxed{42}. Check: 40 + 2"), extract_final_number("no digits")
        ('42', None)
    """
    for pattern in (_BOXED, _HASHES, _ANY):
        found = pattern.findall(response)
        if found:
            number = found[-1].replace(",", "")
            return number[:-2] if number.endswith(".0") else number
    return None


def final_number_reward(task: dict, response: str) -> float:
    """1.0 when :func:`extract_final_number` of ``response`` equals ``task["answer"]``, else 0.0.

    Examples:
        >>> final_number_reward({"answer": "109"}, "The answer is 109."), final_number_reward({"answer": "109"}, "10")
        (1.0, 0.0)
    """
    return 1.0 if extract_final_number(response) == str(task["answer"]) else 0.0


def word_addition_problems(
    count: int, *, min_digits: int, max_digits: int, seed: int, data_source: str = "word_addition"
) -> list[dict]:
    """``count`` problems ``"What is a + b? Answer with the number only."`` whose operands have
    ``min_digits`` to ``max_digits`` digits, drawn by ``random.Random(seed)``.

    Raises:
        ConfigError: ``min_digits`` below 1 or above ``max_digits``, or ``count < 0``.

    Examples:
        >>> word_addition_problems(1, min_digits=2, max_digits=2, seed=0)[0]["prompt"]
        'What is 63 + 43? Answer with the number only.'
    """
    if not 1 <= min_digits <= max_digits or count < 0:
        raise ConfigError(
            "word_addition task: need 1 <= task.min_digits <= task.max_digits and task.train_size/val_size >= 0, got "
            f"min_digits={min_digits}, max_digits={max_digits}, size={count}."
        )
    rng = random.Random(seed)

    def operand() -> int:
        digits = rng.randint(min_digits, max_digits)
        return rng.randint(10 ** (digits - 1) if digits > 1 else 0, 10**digits - 1)

    rows = []
    for _ in range(count):
        a, b = operand(), operand()
        prompt = f"What is {a} + {b}? Answer with the number only."
        rows.append({"prompt": prompt, "answer": str(a + b), "data_source": data_source})
    return rows


def word_addition_task(task_config: Any) -> Task:
    """Train and validation splits from ``task_config.{train_size, val_size, min_digits,
    max_digits, seed}`` (validation draws with ``seed + 1``), rewarded by :func:`final_number_reward`.
    Meant for a pretrained model with its chat template (``task.apply_chat_template=true``)."""
    digits = dict(min_digits=task_config.min_digits, max_digits=task_config.max_digits)
    train, val = seeded_splits(word_addition_problems, task_config, **digits)
    return Task(
        name="word_addition", train=train, val=val, reward_fn=final_number_reward, alphabet=alphabet_of(train, val)
    )
