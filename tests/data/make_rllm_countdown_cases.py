"""Makes tests/data/rllm_countdown_reward.json: seeded countdown responses and task rows, scored
by rLLM's own ``rllm.rewards.countdown_reward.countdown_reward_fn``.

Run with rLLM's package importable (its ``rllm/rewards/countdown_reward.py`` and
``reward_types.py``, with an ``rllm`` package root exposing ``Action``), not from the repo:

    python tests/data/make_rllm_countdown_cases.py RLLM_ROOT RLLM_COMMIT OUT.json
"""

from __future__ import annotations

import json
import random
import sys

SEED = 48
OPS = ["+", "-", "*", "/", "//", "**", "%"]
SPACES = [" ", "", "  ", "\t", "\u00a0", "\u2003"]
WORDS = ["", "Let me think.", "So the answer:", "Done.", "</think>", "Assistant:", "<|im_start|>assistant", "answer"]


def expression(rng: random.Random, nums: list[int], ops: list[str]) -> str:
    """A random fully or partly parenthesised expression using each of ``nums`` once."""
    terms = [str(n) for n in rng.sample(nums, len(nums))]
    while len(terms) > 1:
        i = rng.randrange(len(terms) - 1)
        sp = rng.choice(SPACES[:3])
        joined = f"{terms[i]}{sp}{rng.choice(ops)}{sp}{terms[i + 1]}"
        if rng.random() < 0.5:
            joined = f"({joined})"
        terms[i : i + 2] = [joined]
    return terms[0]


def value(expr: str):
    try:
        result = eval(expr, {"__builtins__": None}, {})  # generator only: expressions built above from small ints
        return result if isinstance(result, (int, float)) else None
    except Exception:
        return None


def row(rng: random.Random) -> tuple[list[int], int | float, str]:
    """nums, a target reachable with the basic operators, and the expression reaching it."""
    while True:
        nums = [rng.randint(1, 12) for _ in range(rng.randint(2, 4))]
        expr = expression(rng, nums, ["+", "-", "*", "/"])
        v = value(expr)
        if v is not None and abs(v) < 1e6:
            return nums, (round(v) if abs(v - round(v)) < 1e-9 else v), expr


def mutate_answer(rng: random.Random, nums: list[int], expr: str) -> str:
    """An answer body: the right expression, or one of the ways to get it (or its reading) wrong."""
    kind = rng.randrange(24)
    if kind == 0:
        return expr
    if kind == 1:
        return expression(rng, nums, OPS)  # any operator, % and ** and // included
    if kind == 2:
        return expr + rng.choice([".", " .", "=", " = 5", "!", ",", ";", " ", "\u3002"])
    if kind == 3:
        return expr.replace(" ", rng.choice(SPACES))
    if kind == 4:  # a number reused or dropped or added
        extra = rng.choice(nums + [rng.randint(0, 30)])
        return rng.choice([f"{expr} + {extra}", f"{expr} * 1", expr.replace(str(nums[0]), "", 1) + "+0"])
    if kind == 5:
        return expr.replace(str(nums[0]), f"{nums[0]}.0", 1)
    if kind == 6:
        return expr.replace("*", rng.choice(["x", "\u00d7", "**", "//"])).replace(
            "/", rng.choice(["\u00f7", "//", "/"])
        )
    if kind == 7:
        return expr.replace("-", rng.choice(["\u2212", "--", "+-", "-"]))
    if kind == 8:  # unicode digits in place of ascii ones
        table = rng.choice(
            [
                str.maketrans("0123456789", "\uff10\uff11\uff12\uff13\uff14\uff15\uff16\uff17\uff18\uff19"),
                str.maketrans("0123456789", "\u0660\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669"),
            ]
        )
        return expr.translate(table)
    if kind == 9:
        return rng.choice(["", " ", "()", "...", "(", ")", "+", "-1", "1/0", f"{nums[0]}/0", "0**-1"])
    if kind == 10:
        return f"({expr})({rng.choice(nums)})" if rng.random() < 0.5 else f"({expr})()"
    if kind == 11:
        return expr.replace(" ", "\n", 1) if " " in expr else expr + "\n"
    if kind == 12:
        return (
            expr.replace(" ", rng.choice(["\r", "\x0b", "\x0c", "\u2028", "\x85"]), 1) if " " in expr else "\r" + expr
        )
    if kind == 13:
        return f"{rng.choice(['The answer is', 'x =', 'Result:'])} {expr}"
    if kind == 14:
        return f"{expr} = {rng.randint(0, 40)}"
    if kind == 15:
        return "-(" + expr + ")" if rng.random() < 0.5 else "+(" + expr + ")"
    if kind == 16:
        return "(" * 3 + expr + ")" * rng.choice([3, 2, 4])
    if kind == 17:
        return f"{nums[0]}**{rng.randint(0, 3)}" + "".join(f"+{n}" for n in nums[1:])
    if kind == 18:
        return expr.replace(str(nums[-1]), f"0{nums[-1]}", 1)
    if kind == 19:
        return expr.replace(str(nums[0]), str(nums[0] + 1), 1)
    if kind == 20:
        return f"{expr} <answer>{expression(rng, nums, ['+', '-', '*'])}"
    if kind == 21:
        return expr.upper() + "  "
    if kind == 22:
        return f"{expr} % 1000" if rng.random() < 0.5 else f"({expr}) // 1"
    return "  " + expr + "\t"


def response(rng: random.Random, nums: list[int], expr: str) -> str:
    """A response around one or more answer tags, with text, prefixes and broken tags."""
    body = mutate_answer(rng, nums, expr)
    kind = rng.randrange(14)
    if kind == 0:
        return f"<answer>{body}</answer>"
    if kind == 1:
        return f"{rng.choice(WORDS)} <answer>{body}</answer> {rng.choice(WORDS)}"
    if kind == 2:  # several tags: the last counts
        other = mutate_answer(rng, nums, expr)
        return (
            f"<answer>{other}</answer> wait, <answer>{body}</answer>"
            if rng.random() < 0.5
            else f"<answer>{body}</answer>\n<answer>{other}</answer>"
        )
    if kind == 3:
        return f"User: solve it. Assistant: <think>hm</think> <answer>{body}</answer>"
    if kind == 4:
        return f"<answer>{body}</answer> Assistant: {rng.choice(['done', '<answer>1</answer>', ''])}"
    if kind == 5:
        return f"<|im_start|>user\nsolve<|im_end|>\n<|im_start|>assistant\n<answer>{body}</answer>"
    if kind == 6:
        return f"<answer>{body}</answer><|im_start|>assistant {rng.choice(['', '<answer>0</answer>'])}"
    if kind == 7:
        return f"<answer>\n{body}\n</answer>"
    if kind == 8:
        return rng.choice(
            [
                body,
                f"<answer>{body}",
                f"{body}</answer>",
                f"<Answer>{body}</Answer>",
                f"<answer >{body}</answer>",
                f"< answer>{body}</answer>",
                f"answer: {body}",
            ]
        )
    if kind == 9:
        return f"<answer><answer>{body}</answer></answer>"
    if kind == 10:
        return f"<think>\n{rng.choice(WORDS)}\n</think>\n<answer>{body}</answer>\n"
    if kind == 11:
        return (
            f"Assistant: one <answer>{body}</answer> Assistant: two <answer>{mutate_answer(rng, nums, expr)}</answer>"
        )
    if kind == 12:
        return f"<answer>{body}</answer>" + rng.choice(["", ".", " \u2705", "\n\n"])
    return f"<answer> {body} </answer>"


def task_info(rng: random.Random, nums: list[int], target) -> object:
    """The row: mostly as rLLM's dataset has it, sometimes with its fields' types or presence changed."""
    kind = rng.randrange(30)
    if kind == 0:
        return {"target": str(target), "nums": nums}
    if kind == 1:
        return {"target": target, "nums": [str(n) for n in nums]}
    if kind == 2:
        return {"target": float(target), "nums": [float(n) for n in nums]}
    if kind == 3:
        return {"target": target, "nums": " ".join(map(str, nums))}
    if kind == 4:
        return rng.choice(
            [
                {"nums": nums},
                {"target": target},
                {"target": None, "nums": nums},
                {"target": target, "nums": []},
                {"target": target, "nums": None},
                {},
            ]
        )
    if kind == 5:
        return {"target": 0, "nums": nums} if rng.random() < 0.5 else {"target": target, "nums": nums + [nums[0]]}
    if kind == 6:
        return rng.choice([None, [], [target, nums], "row", 7])
    if kind == 7:
        return {"target": target, "nums": [str(nums[0])] + nums[1:]}
    if kind == 8:
        return {"target": True, "nums": nums} if rng.random() < 0.3 else {"target": target + 1e-7, "nums": nums}
    if kind == 9:
        return {
            "target": target,
            "nums": nums,
            "ground_truth": str(target),
            "question": "q",
            "data_source": "countdown",
        }
    return {"target": target, "nums": nums}


def cases(count: int) -> list[dict]:
    rng = random.Random(SEED)
    out = []
    for _ in range(count):
        nums, target, expr = row(rng)
        info = task_info(rng, nums, target)
        resp: object = response(rng, nums, expr)
        roll = rng.random()
        if roll < 0.02:
            resp = rng.choice([None, 7, ["<answer>1</answer>"], {"Assistant:": 1}, ["Assistant:"], 1.5])
        out.append({"task_info": info, "response": resp, "as_action": rng.random() < 0.1})
    return out


HAND = [  # the probes and the cases named in the brief
    ({"target": 6, "nums": [1, 2, 3]}, "<answer>\n1 + 2 + 3\n</answer>"),
    ({"target": 6, "nums": [1, 2, 3]}, "<answer>1+2+3</answer> Assistant: done"),
    ({"target": 6, "nums": [1, 2, 3]}, "<answer>1 + 2 + 3.</answer>"),
    ({"target": 8, "nums": [2, 3]}, "<answer>2**3</answer>"),
    ({"target": 1, "nums": [3, 2]}, "<answer>3//2</answer>"),
    ({"target": 1, "nums": [3, 2]}, "<answer>3%2</answer>"),
    ({"target": "6", "nums": [1, 2, 3]}, "<answer>1+2+3</answer>"),
    ({"target": 6, "nums": ["1", "2", "3"]}, "<answer>1+2+3</answer>"),
    ({"target": 6, "nums": [1, 2, 3]}, "<answer>1+2+3</answer>"),
    ({"target": 6, "nums": [1, 2, 3]}, ""),
    ({"target": 6, "nums": [1, 2, 3]}, "<answer></answer>"),
    ({"target": 0, "nums": [2, 2]}, "<answer>2-2</answer>"),
    ({"target": 1024, "nums": [2, 10]}, "<answer>2**10</answer>"),
    ({"target": 2.5, "nums": [5, 2]}, "<answer>5/2</answer>"),
    ({"target": 6, "nums": [1, 2, 3]}, "<answer>(1+2)(3)</answer>"),
    ({"target": 6, "nums": [1, 2, 3]}, "<answer>1+2+3 </answer>\n<answer>1*2*3</answer>"),
    ({"target": 1, "nums": [1]}, "<answer>(((((((((((1)))))))))))</answer>"),
    ({"target": 0, "nums": [1, 2]}, "<answer>0**-1+2</answer>"),
]


def main() -> None:
    root, commit, path = sys.argv[1], sys.argv[2], sys.argv[3]
    sys.path.insert(0, root)
    from rllm import Action
    from rllm.rewards.countdown_reward import countdown_reward_fn

    inputs = [{"task_info": t, "response": r, "as_action": False} for t, r in HAND] + cases(620)
    for case in inputs:
        action = Action(action=case["response"]) if case["as_action"] else case["response"]
        out = countdown_reward_fn(case["task_info"], action)
        case["rllm"] = {
            "reward": out.reward,
            "reward_type": type(out.reward).__name__,
            "is_correct": out.is_correct,
            "metadata": out.metadata,
        }
    doc = {
        "about": "rLLM's rllm.rewards.countdown_reward.countdown_reward_fn(task_info, response) on seeded inputs; "
        "as_action: the response wrapped in rLLM's Action. Made by tests/data/make_rllm_countdown_cases.py.",
        "rllm_repo": "https://github.com/rllm-org/rllm",
        "rllm_commit": commit,
        "rllm_file": "rllm/rewards/countdown_reward.py",
        "python": ".".join(map(str, sys.version_info[:3])),
        "seed": SEED,
        "cases": inputs,
    }
    cases_json = ",\n".join("  " + json.dumps(case, ensure_ascii=True) for case in doc.pop("cases"))
    head = json.dumps(doc, indent=1, ensure_ascii=True)[:-2]  # one case a line, for readable diffs
    with open(path, "w", encoding="utf-8") as f:
        f.write(f'{head},\n "cases": [\n{cases_json}\n ]\n}}\n')


if __name__ == "__main__":
    main()
