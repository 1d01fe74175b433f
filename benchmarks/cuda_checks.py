"""The 2026 estimators and losses on a CUDA device: the same numbers as float64 on the CPU, the
same under ``torch.compile(fullgraph=True)``, no host sync where none is claimed, and their time
on the GPU beside the CPU's, in one run.

    python benchmarks/cuda_checks.py --output RESULTS_cuda.md     # needs a CUDA device

Estimators: ``maxrl`` and ``remax`` on 1M trajectories in groups of 8 (dense) and ragged groups,
``optimal_token_baseline`` on ``[B, T]`` tokens, ``turn_level_advantages`` on ragged turns.
Losses: each of :data:`rllm_torch.core.losses.POLICY_LOSSES` added in 2026 on ``[B, T]`` log-probs:
value and gradient against float64, the value compiled. Times are medians of CUDA-synchronised wall times (ms).
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_estimators import timed  # noqa: E402
from machine import cpu_name  # noqa: E402

from rllm_torch import GroupedRewards, GroupedTurns, rloo, turn_level_advantages  # noqa: E402
from rllm_torch.core.estimators import maxrl, optimal_token_baseline, remax  # noqa: E402
from rllm_torch.core.losses import policy_loss  # noqa: E402
from rllm_torch.core.tokens import TokenRewards  # noqa: E402

LOSSES = ("sapo", "geo_mean", "dppo_tv", "dppo_kl", "clip_cov", "kl_cov", "luspo", "vespo")
RANDOM_SELECTION = {"clip_cov"}  # picks tokens at random: compared by value range, not elementwise


def compiled_equals(fn, inputs: list, want: torch.Tensor, rtol: float) -> str:
    """Whether ``torch.compile(fn, fullgraph=True)`` gives ``want`` (or why it does not compile)."""
    try:
        return str(
            torch.allclose(torch.compile(fn, fullgraph=True, dynamic=False)(*inputs), want, rtol=rtol, atol=1e-5)
        )
    except Exception as exc:  # noqa: BLE001 - recorded in the table
        return f"fails: {type(exc).__name__}"


def sync_free(fn, inputs: list) -> str:
    """``"yes"`` when ``fn(*inputs)`` runs under ``set_sync_debug_mode("error")``, else why not."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn(*inputs)
        return "yes"
    except RuntimeError as exc:
        return f"no ({str(exc).splitlines()[0][:60]})"
    finally:
        torch.cuda.set_sync_debug_mode("default")


def table_row(label: str, fn, on_dev: list, cpu32: list, diff: float, same: str, device: str) -> str:
    cpu_ms = timed(lambda: fn(*cpu32), "cpu", budget_s=2.0, max_repeats=5)
    gpu_ms = timed(lambda: fn(*on_dev), device, budget_s=1.0, max_repeats=20)
    row = f"| {label} | {diff:.2e} | {same} | {sync_free(fn, on_dev)} | {cpu_ms:.2f} | {gpu_ms:.3f} | {cpu_ms / gpu_ms:.0f}x |"
    print(row, flush=True)
    return row


def estimator_cases(n: int, gen: torch.Generator) -> dict:
    """name -> (function of device tensors, its inputs on the CPU in float64)."""
    rewards = (torch.rand(n // 8, 8, generator=gen) > 0.6).double()
    baselines = (torch.rand(n // 8, generator=gen) > 0.5).double()
    flat = torch.rand(n, generator=gen, dtype=torch.float64)
    index = torch.randint(0, n // 8, (n,), generator=gen)
    B, T = 4096, 1024
    tok_rewards = torch.zeros(B, T, dtype=torch.float64)
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    tok_rewards[torch.arange(B), lengths - 1] = (torch.rand(B, generator=gen) > 0.5).double()
    logp = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 3
    sq = torch.rand(B, T, generator=gen, dtype=torch.float64) * 0.5 + 0.1
    groups = torch.arange(B) // 16
    turns = torch.randint(1, 9, (n // 8,), generator=gen)  # a trajectory's turn count, 1..8
    turn_traj = torch.repeat_interleave(torch.arange(n // 8), turns)
    turn_rewards = torch.rand(turn_traj.shape[0], generator=gen, dtype=torch.float64)
    traj_group = torch.arange(n // 8) // 8
    G = n // 64  # the turn_level case's groups
    return {
        "maxrl, dense [G, 8]": (lambda r: maxrl(GroupedRewards.from_padded(r, validate=False))[0], (rewards,)),
        "maxrl, ragged": (
            lambda r, i: maxrl(GroupedRewards.from_flat(r, i, num_groups=n // 8, validate=False))[0],
            (flat, index),
        ),
        "remax, dense [G, 8]": (
            lambda r, b: remax(GroupedRewards.from_padded(r, validate=False), baselines=b)[0],
            (rewards, baselines),
        ),
        f"optimal_token_baseline [{B}, {T}]": (
            lambda r, m, lp, s, g: optimal_token_baseline(
                TokenRewards(r, m, old_log_probs=lp, sum_pi_squared=s, group_index=g)
            )[0],
            (tok_rewards, mask, logp, sq, groups),
        ),
        f"turn_level (rloo), {turn_traj.shape[0]} turns": (
            lambda r, t, g: turn_level_advantages(GroupedTurns.from_flat(r, t, g, num_groups=G), rloo, gamma=0.9)[0],
            (turn_rewards, turn_traj, traj_group),
        ),
    }


def loss_inputs(B: int, T: int, gen: torch.Generator) -> tuple:
    old = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 3
    new = old + torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.1
    adv = torch.randn(B, 1, generator=gen, dtype=torch.float64).expand(B, T).contiguous()
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    return new, old, adv, mask


def loss_options(name: str) -> dict:
    return {"loss_agg_mode": "seq-mean-token-sum"} if name == "luspo" else {}


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1024 * 1024, help="trajectories of the outcome estimators")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    dev = args.device
    gen = torch.Generator().manual_seed(0)
    name = torch.cuda.get_device_name() if dev == "cuda" else dev
    lines = [
        "# The 2026 estimators and losses on CUDA",
        "",
        f"Device: {name}; host: {cpu_name()}; torch {torch.__version__}, Python {platform.python_version()}.",
        f"Command: `python benchmarks/cuda_checks.py {' '.join(argv if argv is not None else sys.argv[1:])}`.",
        "",
        "| case | max abs diff float32 GPU vs float64 CPU | compiled (fullgraph) = eager | no host sync | CPU float32 ms | GPU ms | CPU / GPU |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, (fn, inputs) in estimator_cases(args.n, gen).items():
        want = fn(*inputs)
        on_dev = [x.float().to(dev) if x.is_floating_point() else x.to(dev) for x in inputs]
        cpu32 = [x.float() if x.is_floating_point() else x for x in inputs]
        got = fn(*on_dev)
        diff = (got.double().cpu() - want).abs().max().item()
        lines.append(table_row(label, fn, on_dev, cpu32, diff, compiled_equals(fn, on_dev, got, 1e-5), dev))
    B, T = 512, 2048
    new, old, adv, mask = loss_inputs(B, T, gen)
    for loss in LOSSES:
        opts = loss_options(loss)

        def run(n, o, a, m, loss=loss, opts=opts):
            n = n.detach().requires_grad_(True)
            value, _ = policy_loss(loss, n, o, a, m, **opts)
            (grad,) = torch.autograd.grad(value, n)
            return torch.cat([value.reshape(1), grad.reshape(-1)])

        want = run(new, old, adv, mask)
        on_dev = [x.float().to(dev) for x in (new, old, adv, mask)]
        got = run(*on_dev)
        if loss in RANDOM_SELECTION:
            diff = abs(got[0].double().cpu() - want[0]).item()
        else:
            diff = (got.double().cpu() - want).abs().max().item()
        value = lambda *x, loss=loss, opts=opts: policy_loss(loss, *x, **opts)[0]  # noqa: E731
        same = compiled_equals(value, on_dev, got[0], 1e-4)  # autograd.grad does not trace with fullgraph
        cpu32 = [x.float() for x in (new, old, adv, mask)]
        label = f"loss {loss} [{B}, {T}], value + gradient"
        lines.append(table_row(label, run, on_dev, cpu32, diff, same, dev))
    if args.output:
        args.output.write_text("\n".join(lines) + "\n")
    return lines


if __name__ == "__main__":
    main()
