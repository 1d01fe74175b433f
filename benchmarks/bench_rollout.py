"""Rollout speed: the sampler through ``transformers``' ``generate`` (KV cache) against the
hand-written loop it replaced (the whole sequence through the model again for every new token),
in one run, on the same prompts and models.

    python benchmarks/bench_rollout.py            # writes outputs/benchmarks/RESULTS_rollout.md
    python benchmarks/bench_rollout.py --write-results  # the same into the tracked benchmarks/RESULTS_rollout.md
    python benchmarks/bench_rollout.py --device cuda

Models: the default policy (GPT-2 style, 2 layers, d = 64) and a 4-layer d = 256 one, random
weights, the character tokenizer, context 512. Each of ``--prompts`` arithmetic prompts gets
exactly ``L`` new tokens (the end token is not allowed to stop a row early, so both methods do
the same work); tokens per second = prompts x L / wall time of one call (after a warm-up call).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from machine import cpu_name
from omegaconf import OmegaConf
from results import add_write_results, results_path

from rllm_torch.backends.torch_backend import build_char_tokenizer, sample_completions
from rllm_torch.backends.torch_backend.policy import build_policy
from rllm_torch.backends.torch_backend.sampling import _left_padded

MODELS = {"default (2 x 64)": (2, 64, 4), "4 x 256": (4, 256, 4)}


@torch.no_grad()
def old_loop(model, prompts, *, max_new_tokens, eos_token_id, pad_token_id, temperature=1.0, generator=None):
    """The replaced sampler: every step runs the model over the whole sequence (no KV cache)."""
    ids_NT, mask_NT = _left_padded(prompts, pad_token_id, next(model.parameters()).device)
    alive_N = torch.ones(len(prompts), dtype=torch.bool, device=ids_NT.device)
    for _ in range(max_new_tokens):
        position_ids_NT = (mask_NT.cumsum(-1) - 1).clamp(min=0)
        logits_NTV = model(
            input_ids=ids_NT, attention_mask=mask_NT, position_ids=position_ids_NT, use_cache=False
        ).logits
        logits_NV = logits_NTV[:, -1].float() / temperature
        token_N = torch.multinomial(logits_NV.softmax(-1), 1, generator=generator).squeeze(1)
        _ = F.log_softmax(logits_NV, -1).gather(1, token_N[:, None])
        token_N = torch.where(alive_N, token_N, torch.full_like(token_N, pad_token_id))
        ids_NT = torch.cat([ids_NT, token_N[:, None]], 1)
        mask_NT = torch.cat([mask_NT, alive_N[:, None].long()], 1)
        alive_N = alive_N & (token_N != eos_token_id)
    return ids_NT


def timed(fn) -> float:
    fn()  # warm-up
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run(device: str, lengths: list[int], num_prompts: int) -> list[dict]:
    tok = build_char_tokenizer("0123456789+=")
    prompts = [
        tok(f"{a}+{b}=")["input_ids"] for a, b in zip(range(num_prompts), range(3, 3 + num_prompts), strict=True)
    ]
    never = len(tok)  # an id no model samples: rows run to the full length
    rows = []
    for name, (layers, hidden, heads) in MODELS.items():
        config = OmegaConf.create(
            dict(path=None, arch="gpt2", num_layers=layers, hidden_size=hidden, num_heads=heads, max_positions=512)
        )
        model = build_policy(config, tok).to(device).eval()
        for length in lengths:
            common = dict(max_new_tokens=length, eos_token_id=never, pad_token_id=tok.pad_token_id)
            gen = torch.Generator(device=device).manual_seed(0)
            new = timed(lambda: sample_completions(model, prompts, generator=gen, **common))
            old = timed(lambda: old_loop(model, prompts, generator=gen, **common))
            tokens = num_prompts * length
            row = dict(model=name, length=length, old=tokens / old, new=tokens / new, old_s=old, new_s=new)
            row["speedup"] = row["new"] / row["old"]
            rows.append(row)
            print(
                f"{name:>18}  L={length:<4} old {row['old']:9.0f} tok/s ({old:6.2f} s)  new {row['new']:9.0f} tok/s ({new:6.2f} s)  x{row['speedup']:.1f}",
                flush=True,
            )
    return rows


def write(rows: list[dict], path: Path, device: str, num_prompts: int) -> None:
    machine = f"{cpu_name()}, {os.cpu_count()} cores"
    if device == "cuda":
        machine += f", {torch.cuda.get_device_name()}"
    lines = [
        f"# Rollout speed ({device}): generate with a KV cache against the old loop",
        "",
        f"Run {datetime.datetime.now():%Y-%m-%d %H:%M} with `python benchmarks/bench_rollout.py --device {device}` on {machine}; "
        f"torch {torch.__version__} ({torch.get_num_threads()} thread(s)), transformers {transformers.__version__}. "
        f"{num_prompts} prompts, exactly L new tokens each; tokens per second of one call after a warm-up.",
        "",
        "| model | new tokens L | old loop tok/s | generate tok/s | speed-up | old s | generate s |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['model']} | {r['length']} | {r['old']:.0f} | {r['new']:.0f} | {r['speedup']:.1f}x | {r['old_s']:.2f} | {r['new_s']:.2f} |"
        for r in rows
    ]
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--lengths", default="2,16,64,256")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", default=None, help="results file (default: see --write-results)")
    add_write_results(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = run(args.device, [int(v) for v in args.lengths.split(",")], args.prompts)
    default = results_path(f"RESULTS_rollout{'_cuda' if args.device == 'cuda' else ''}.md", args.write_results)
    write(rows, Path(args.output) if args.output else default, args.device, args.prompts)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
