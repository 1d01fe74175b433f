"""Makes tests/data/rllm_echo_loss.json: seeded loss inputs and what rLLM's own ``echo`` and
``ppo_clip`` losses (branch ``terminal-rl``, ``rllm/trainer/algorithms/loss.py``) give on them: the
loss and its gradient through ``logp_curr``.

The module is loaded alone from rLLM's git directory (it imports only the standard library and
torch), not from the repo:

    python tests/data/make_rllm_echo_cases.py RLLM_GIT_DIR a5fa9aa1 OUT.json

Each case's aggregation is the masked sum over the case's ``normaliser`` (a token-mean over a
global count, as rLLM's verl backend aggregates), the same in the test.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import types

import torch

SEED = 48
CASES = 120


def rllm_loss_module(git_dir: str, commit: str) -> types.ModuleType:
    source = subprocess.run(
        ["git", "--git-dir", git_dir, "show", f"{commit}:rllm/trainer/algorithms/loss.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    module = types.ModuleType("rllm_loss")
    sys.modules["rllm_loss"] = module  # dataclasses looks its module up
    exec(compile(source, "rllm/trainer/algorithms/loss.py", "exec"), module.__dict__)
    return module


def case(rng: random.Random) -> dict:
    rows, tokens = rng.randint(1, 4), rng.randint(1, 7)
    kinds = [[rng.choice("aao.") for _ in range(tokens)] for _ in range(rows)]  # action, observation, padding
    near = rng.random() < 0.5  # ratios near 1, or far (clipped, and past the ±20 clamp of log ρ)
    spread = 0.3 if near else 25.0
    old = [[-rng.uniform(0.05, 3.0) for _ in range(tokens)] for _ in range(rows)]
    curr = [[o + rng.uniform(-spread, spread) if rng.random() < 0.9 else o for o in row] for row in old]
    curr = [[min(c, -1e-3) for c in row] for row in curr]
    action = [[1.0 if k == "a" else 0.0 for k in row] for row in kinds]
    params = {"eps_clip": rng.choice([0.1, 0.2, 0.28])}
    if rng.random() < 0.5:
        params["eps_clip_high"] = rng.choice([None, 0.2, 0.35])
    if rng.random() < 0.75:
        params["env_loss_coef"] = rng.choice([0.0, 0.05, 0.5, 2.0])
    return {
        "logp_curr": curr,
        "logp_old": old,
        "advantages": [[round(rng.gauss(0, 1.5), 4) for _ in range(tokens)] for _ in range(rows)],
        "action_mask": action,
        "obs_mask": [[1.0 if k == "o" else 0.0 for k in row] for row in kinds],
        "params": params,
        "normaliser": max(1.0, sum(map(sum, action))) * rng.choice([1.0, 2.5]),
    }


def run(module: types.ModuleType, name: str, inputs: dict) -> dict:
    logp = torch.tensor(inputs["logp_curr"], dtype=torch.float64, requires_grad=True)
    normaliser = inputs["normaliser"]
    ctx = module.LossContext(
        logp_curr=logp,
        logp_old=torch.tensor(inputs["logp_old"], dtype=torch.float64),
        advantages=torch.tensor(inputs["advantages"], dtype=torch.float64),
        action_mask=torch.tensor(inputs["action_mask"], dtype=torch.float64),
        obs_mask=torch.tensor(inputs["obs_mask"], dtype=torch.float64),
        aggregate=lambda per_token, mask, mode=None: (per_token * mask).sum() / normaliser,
        params=dict(inputs["params"]),
    )
    loss, metrics = getattr(module, name)(ctx)
    loss.backward()
    return {"loss": loss.item(), "grad": logp.grad.tolist(), "metrics": metrics}


def main(git_dir: str, commit: str, out: str) -> None:
    module = rllm_loss_module(git_dir, commit)
    rng = random.Random(SEED)
    cases = []
    for _ in range(CASES):
        inputs = case(rng)
        cases.append(
            {"inputs": inputs, "echo": run(module, "echo", inputs), "ppo_clip": run(module, "ppo_clip", inputs)}
        )
    with open(out, "w") as f:
        json.dump({"rllm_commit": commit, "seed": SEED, "cases": cases}, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
