"""Makes tests/data/rllm_f1_reward.json: seeded responses and ground truths scored by rLLM's own
``rllm.rewards.reward_fn.f1_reward_fn`` (and ``zero_reward``).

Run with rLLM's package importable (its ``rllm/rewards/reward_fn.py`` and ``reward_types.py``;
stand-ins for the code, math and search reward classes it imports and does not use in these two
functions, and for ``rllm.types.Action``), not from the repo:

    python tests/data/make_rllm_f1_cases.py RLLM_ROOT RLLM_COMMIT OUT.json
"""

from __future__ import annotations

import json
import random
import sys

SEED = 48
WORDS = [
    "the",
    "a",
    "an",
    "The",
    "THE",
    "An",
    "Paris",
    "paris",
    "France",
    "capital",
    "of",
    "is",
    "Hello",
    "world",
    "theater",
    "anyway",
    "apple",
    "1984",
    "42",
    "3.14",
    "New",
    "York",
    "café",
    "CAFÉ",
    "naïve",
    "über",
    "日本",
    "Straße",
    "don't",
    "U.S.A.",
    "e-mail",
    "co-op",
    "(a)",
    "[the]",
    "an't",
    "ĳ",
    "ǅ",
    "x",
    "y",
]
PUNCT = ["", ".", ",", "!", "?", "'", '"', "-", "—", "…", "«", "»", "“", "”", "¿", ";", ":"]
SPACES = [" ", "  ", "\t", "\n", "\u00a0", "\u2003", "\u3000", ""]


def text(rng: random.Random) -> str:
    words = [rng.choice(WORDS) + rng.choice(PUNCT) for _ in range(rng.randint(0, 7))]
    return "".join(w + rng.choice(SPACES) for w in words)


def cases(count: int) -> list[dict]:
    rng = random.Random(SEED)
    out = []
    for _ in range(count):
        gold = text(rng)
        kind = rng.randrange(10)
        if kind == 0:
            response: object = gold
        elif kind == 1:
            response = gold.upper() + rng.choice(PUNCT)
        elif kind == 2:
            response = " ".join(reversed(gold.split())) + " " + text(rng)
        else:
            response = text(rng)
        truth: object = gold
        roll = rng.random()
        if roll < 0.04:
            truth = rng.choice([None, 42, 3.5, ["a", "b"], True, ""])
        elif roll < 0.07:
            response = rng.choice([None, 42, 0.5, ["Paris"], {"x": 1}, ""])
        row: object = {"ground_truth": truth} if rng.random() > 0.03 else rng.choice([{}, {"question": "q"}])
        out.append({"task_info": row, "response": response, "as_action": rng.random() < 0.1})
    return out


HAND = [
    ({"ground_truth": "Hello, world!"}, "hello there world"),
    ({"ground_truth": "The Eiffel Tower"}, "the eiffel tower."),
    ({"ground_truth": "the a an"}, "a"),
    ({"ground_truth": "a b c d"}, "a b a b"),
    ({"ground_truth": "x y y"}, "y y y z"),
]


def main() -> None:
    root, commit, path = sys.argv[1], sys.argv[2], sys.argv[3]
    sys.path.insert(0, root)
    from rllm import Action
    from rllm.rewards.reward_fn import f1_reward_fn, zero_reward

    inputs = [{"task_info": t, "response": r, "as_action": False} for t, r in HAND] + cases(600)
    for case in inputs:
        action = Action(action=case["response"]) if case["as_action"] else case["response"]
        out = f1_reward_fn(case["task_info"], action)
        zero = zero_reward(case["task_info"], action)
        case["rllm"] = {
            "reward": out.reward,
            "is_correct": out.is_correct,
            "metadata": out.metadata,
            "zero_reward": [zero.reward, zero.is_correct, zero.metadata],
        }
    doc = {
        "about": "rLLM's rllm.rewards.reward_fn.f1_reward_fn(task_info, response) and zero_reward on seeded inputs; "
        "as_action: the response wrapped in rLLM's Action. Made by tests/data/make_rllm_f1_cases.py.",
        "rllm_repo": "https://github.com/rllm-org/rllm",
        "rllm_commit": commit,
        "rllm_file": "rllm/rewards/reward_fn.py",
        "python": ".".join(map(str, sys.version_info[:3])),
        "seed": SEED,
    }
    cases_json = ",\n".join("  " + json.dumps(case, ensure_ascii=True) for case in inputs)
    head = json.dumps(doc, indent=1, ensure_ascii=True)[:-2]  # one case a line, for readable diffs
    with open(path, "w", encoding="utf-8") as f:
        f.write(f'{head},\n "cases": [\n{cases_json}\n ]\n}}\n')


if __name__ == "__main__":
    main()
