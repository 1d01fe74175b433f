"""Sampling on the real checkpoint against its floors: one step's rollouts of the SmolLM2 recipe
(8 ``word_addition`` prompts through the chat template x 8 rollouts, exactly 32 new tokens: the
end token is not allowed to stop a row, so every variant does the same work) through
:func:`~rllm_torch.backends.torch_backend.sampling.sample_completions`, each variant timed in one
run on the same prompts, and the floors of that work measured on the same machine.

    python benchmarks/bench_sampling.py --model-path $GGUF                  # outputs/benchmarks/RESULTS_sampling.md
    python benchmarks/bench_sampling.py --model-path $GGUF --write-results  # benchmarks/RESULTS_sampling.md

Variants: ``each row`` (every row prefilled on its own, as before issue 43), ``shared prompts``
(each distinct prompt prefilled once, its keys and values repeated for its rollouts: the default),
``each row, static cache`` (``generate``'s preallocated cache, taken from 128 new tokens on), and
``shared, bf16 autocast`` (what ``backend.dtype=bfloat16`` samples with; on a CPU without AMX or
AVX-512 BF16 it is emulated and slower, which the table then shows).

Floors: the FLOP floor is the matmul work at this machine's float32 matmul rate (``--threads``
threads; measured here on the decode's own shape, 64 rows x 576 -> 1536, and on a large one, 4096
rows; the faster rate is used): the prefill of the prompt tokens a variant computes through the
body (``2 x body parameters`` per token; the head scores one column per row) and 32 decoding steps
of every row through body and head (``2 x all matmul parameters`` per row and step). The memory
floor reads the float32 weights once per decoding step (and once for the prefill) at this
machine's copy bandwidth. The larger of the two is the variant's floor; ``each row``'s floor is the
one of the work as it was, so ``floor (each row) / s`` says how far below the old work's floor a
variant went.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time

import torch
import transformers
from machine import cpu_name
from results import add_write_results, results_path

from rllm_torch.backends.torch_backend import sample_completions
from rllm_torch.backends.torch_backend.model import build_policy
from rllm_torch.backends.torch_backend.pretrained import pretrained_dir
from rllm_torch.backends.torch_backend.tokenizer import encode_prompts, load_tokenizer
from rllm_torch.rollouts.word_addition import word_addition_problems

PROMPTS, ROLLOUTS, NEW_TOKENS = 8, 8, 32


def matmul_rate(rows: int, inner: int, outer: int, dtype: torch.dtype, repeats: int = 5) -> float:
    """GFLOP/s of ``[rows, inner] @ [inner, outer]`` in ``dtype`` (best of ``repeats``)."""
    a, b = torch.randn(rows, inner, dtype=dtype), torch.randn(inner, outer, dtype=dtype)
    best = float("inf")
    for _ in range(repeats + 1):
        start = time.perf_counter()
        for _ in range(10):
            a @ b
        best = min(best, (time.perf_counter() - start) / 10)
    return 2 * rows * inner * outer / best / 1e9


def copy_bandwidth(size_bytes: int = 512 * 2**20) -> float:
    """GB/s of reading and writing a float32 tensor of ``size_bytes`` (best of 5; read + write counted)."""
    src = torch.empty(size_bytes // 4)
    dst = torch.empty_like(src)
    src.fill_(1.0)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * size_bytes / best / 1e9


def parameter_counts(model: torch.nn.Module) -> tuple[int, int]:
    """(body matmul parameters, head parameters): the head is the output embedding (tied or not)."""
    head = model.get_output_embeddings().weight
    embed = model.get_input_embeddings().weight
    body = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and p is not embed and p is not head)
    return body, head.numel()


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def add_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """The checkpoint, its GGUF cache, the thread count and the timed calls of a benchmark on the real checkpoint."""
    parser.add_argument("--model-path", required=True, help="the checkpoint: a directory or a .gguf file")
    parser.add_argument("--gguf-cache-dir", default="~/.cache/rllm_torch/gguf")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per variant (median)")


def load_checkpoint(args: argparse.Namespace) -> tuple:
    """``(tokenizer, model)`` of ``args.model_path`` (float32), torch's threads set to ``args.threads``."""
    torch.set_num_threads(args.threads)
    directory = pretrained_dir(args.model_path, cache_dir=args.gguf_cache_dir)
    tokenizer = load_tokenizer(directory, "")
    return tokenizer, build_policy(type("M", (), {"path": str(directory), "gguf_cache_dir": None})(), tokenizer)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_checkpoint_arguments(parser)
    add_write_results(parser)
    args = parser.parse_args(argv)
    tokenizer, model = load_checkpoint(args)
    model.eval()
    problems = word_addition_problems(PROMPTS, min_digits=2, max_digits=2, seed=0)
    distinct = encode_prompts(tokenizer, [p["prompt"] for p in problems], apply_chat_template=True)
    prompts = [ids for ids in distinct for _ in range(ROLLOUTS)]
    never = len(tokenizer) + 7  # an id no row samples: every row runs to NEW_TOKENS
    common = dict(max_new_tokens=NEW_TOKENS, eos_token_id=never, pad_token_id=tokenizer.pad_token_id)

    def variant(share: bool, static: bool = False, bf16: bool = False):
        def call():
            generator = torch.Generator().manual_seed(0)
            autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else torch.autocast("cpu", enabled=False)
            kwargs = dict(common, max_new_tokens=NEW_TOKENS)
            with autocast:
                return sample_completions(
                    model, prompts, generator=generator, share_prompts=share, static_cache=static, **kwargs
                )

        return call

    body, head = parameter_counts(model)
    rates = {
        "decode shape": matmul_rate(len(prompts), 576, 1536, torch.float32),
        "4096 rows": matmul_rate(4096, 576, 1536, torch.float32),
    }
    bf16_rate = matmul_rate(4096, 576, 1536, torch.bfloat16)
    rate, bandwidth = max(rates.values()), copy_bandwidth()
    weights_bytes = 4 * (body + head)
    prompt_tokens = {"each": sum(map(len, prompts)), "shared": sum(map(len, distinct))}
    decode_flop = NEW_TOKENS * len(prompts) * 2 * (body + head)

    def floor(kind: str) -> float:
        flop = 2 * body * prompt_tokens[kind] + decode_flop
        return max(flop / rate / 1e9, (NEW_TOKENS + 1) * weights_bytes / bandwidth / 1e9)

    rows = [
        ("each row (before)", variant(False), "each"),
        ("shared prompts (default)", variant(True), "shared"),
        ("each row, static cache", variant(False, static=True), "each"),
        ("shared, bf16 autocast", variant(True, bf16=True), "shared"),
    ]
    load = os.getloadavg()[0]
    results = [(name, timed(call, args.repeats), kind) for name, call, kind in rows]
    base = results[0][1]
    lines = [
        "# Sampling on the real checkpoint against its floors",
        "",
        f"Run {datetime.datetime.now():%Y-%m-%d %H:%M} with `python benchmarks/bench_sampling.py --model-path $GGUF"
        f"{' --write-results' if args.write_results else ''}` on {cpu_name()}, "
        f"{len(os.sched_getaffinity(0))} cores, {args.threads} torch threads; torch {torch.__version__}, "
        f"transformers {transformers.__version__}; load average {load:.2f} at the start.",
        "",
        f"SmolLM2-135M-Instruct (float32; {body / 1e6:.1f}M body and {head / 1e6:.1f}M head matmul parameters), "
        f"{PROMPTS} word_addition prompts through the chat template ({prompt_tokens['shared']} prompt tokens) x "
        f"{ROLLOUTS} rollouts, exactly {NEW_TOKENS} new tokens each ({NEW_TOKENS * len(prompts)} tokens). Median of "
        f"{args.repeats} calls after a warm-up. Machine: float32 matmul "
        + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in rates.items())
        + f" (bf16, 4096 rows: {bf16_rate:.0f} GFLOP/s), copy bandwidth {bandwidth:.1f} GB/s.",
        "",
        "| variant | s | tokens/s | x faster than each row | its floor, s | s / its floor | floor of each row's work / s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, seconds, kind in results:
        lines.append(
            f"| {name} | {seconds:.2f} | {NEW_TOKENS * len(prompts) / seconds:.0f} | {base / seconds:.2f}x | "
            f"{floor(kind):.2f} | {seconds / floor(kind):.2f}x | {floor('each') / seconds:.2f} |"
        )
    text = "\n".join(lines) + "\n"
    target = results_path("RESULTS_sampling.md", args.write_results)
    target.write_text(text)
    print(text)
    print(f"wrote {target}", file=sys.stderr)


if __name__ == "__main__":
    main()
