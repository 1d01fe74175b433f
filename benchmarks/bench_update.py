"""The update on the real checkpoint against its float32 and bfloat16 floors: one step's update of
the SmolLM2 recipe (8 ``word_addition`` prompts through the chat template x 8 rollouts, responses
of 16-32 tokens: about the recipe's 1,500 scored tokens) through the trainer's own scoring module
(:class:`~rllm_torch.backends.torch_backend.forward.PolicyScorer`: shared prompts, chunked
log-probs) and its AdamW, each variant timed in one run on the same rows, and the matmul floors of
that work measured on the same machine in the same run.

    python benchmarks/bench_update.py --model-path $GGUF                  # outputs/benchmarks/RESULTS_update.md
    python benchmarks/bench_update.py --model-path $GGUF --write-results  # benchmarks/RESULTS_update.md
    ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 python benchmarks/bench_update.py --model-path $GGUF --write-results \\
        --append --title "..."        # as an Intel CPU without AMX runs (oneDNN runs PyTorch's bf16 matmuls)

Variants: float32 and bf16 autocast (what ``backend.dtype`` chooses between: float32 weights and
AdamW state either way), each with activation checkpointing (the pretrained default) and without;
and bf16 weights without checkpointing (the model itself in bf16, AdamW on bf16 weights: not a
recipe, which would need float32 master weights, but a bound on what dropping autocast's casts
gives). Each call is the update's work: the forward of every row, a token-mean policy-gradient
loss, its backward, one AdamW step.

Floors: the matmul FLOPs of that work, each linear layer's at the rate its own shapes run at here
(forward and backward of ``F.linear`` at the step's tokens, best of ``--floor-repeats``), in float32
and in bf16: the body's ``6 x`` parameters per token through it (``8 x`` with checkpointing: the
forward runs again in the backward) and the head's ``8 x`` its parameters per scored token (its
chunks recompute their logits in the backward). Attention's own matmuls are not in the floor; the
profile columns show the share of each call that attention, the matmuls and the rest (elementwise
work, autocast's casts, the norms) take. The process runs under the torch backend's host heap
setting (:func:`~rllm_torch.backends.torch_backend.micro_batches.map_host_tensors`), as a run's does. ``saved`` is what the forward keeps for the backward
(``torch.autograd.graph.saved_tensors_hooks``, distinct storages): the activation memory that
checkpointing trades for the second forward.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
import transformers
from bench_sampling import add_checkpoint_arguments, load_checkpoint
from machine import cpu_name
from results import add_write_results, write_results_file

from rllm_torch.backends.torch_backend.forward import PolicyScorer
from rllm_torch.backends.torch_backend.logprobs import default_chunk_tokens
from rllm_torch.backends.torch_backend.micro_batches import map_host_tensors
from rllm_torch.backends.torch_backend.model import adamw, enable_gradient_checkpointing
from rllm_torch.backends.torch_backend.shared_prompts import pack_rows
from rllm_torch.backends.torch_backend.tokenizer import encode_prompts
from rllm_torch.rollouts.word_addition import word_addition_problems

PROMPTS, ROLLOUTS, MIN_RESPONSE, MAX_RESPONSE = 8, 8, 16, 32
ISA_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")


def recipe_rows(tokenizer, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask, positions)``, ``[R, T]`` right padded: each prompt's
    ``ROLLOUTS`` rows, responses of random ordinary tokens and random lengths (scored positions)."""
    problems = word_addition_problems(PROMPTS, min_digits=2, max_digits=2, seed=seed)
    prompts = encode_prompts(tokenizer, [p["prompt"] for p in problems], apply_chat_template=True)
    generator = torch.Generator().manual_seed(seed)
    ordinary = min(len(tokenizer), 40_000)  # SmolLM2's special tokens sit at the start of its vocabulary
    rows = []
    for prompt in prompts:
        for _ in range(ROLLOUTS):
            length = int(torch.randint(MIN_RESPONSE, MAX_RESPONSE + 1, (1,), generator=generator))
            rows.append((prompt, torch.randint(100, ordinary, (length,), generator=generator).tolist()))
    width = max(len(p) + len(r) for p, r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.int64)
    mask, positions = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, (prompt, response) in enumerate(rows):
        ids[i, : len(prompt) + len(response)] = torch.tensor(prompt + response)
        mask[i, : len(prompt) + len(response)] = 1
        positions[i, len(prompt) : len(prompt) + len(response)] = 1
    return ids, mask, positions


def linear_rate(tokens: int, inner: int, outer: int, dtype: torch.dtype, repeats: int) -> float:
    """GFLOP/s of ``F.linear``'s forward and backward (input and weight gradients: ``6 x tokens x
    inner x outer`` FLOPs) at ``[tokens, inner] -> outer`` in ``dtype`` (best of ``repeats``)."""
    x = torch.randn(tokens, inner, dtype=dtype, requires_grad=True)
    weight = torch.randn(outer, inner, dtype=dtype, requires_grad=True)
    grad = torch.randn(tokens, outer, dtype=dtype)
    best = float("inf")
    for _ in range(repeats + 1):
        start = time.perf_counter()
        for _ in range(3):
            F.linear(x, weight).backward(grad)
        best = min(best, (time.perf_counter() - start) / 3)
    return 6 * tokens * inner * outer / best / 1e9


def linear_shapes(model: torch.nn.Module) -> dict[tuple[int, int], int]:
    """``{(in_features, out_features): count}`` of the body's linear layers (the head apart)."""
    head = model.get_output_embeddings()
    shapes: dict[tuple[int, int], int] = {}
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module is not head:
            key = (module.in_features, module.out_features)
            shapes[key] = shapes.get(key, 0) + 1
    return shapes


def saved_bytes(call: Callable[[], torch.Tensor], parameters: set[int]) -> int:
    """Bytes of the distinct storages the forward ``call`` keeps for its backward (parameters
    apart); the graph is dropped without a backward."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) not in parameters and tensor.device.type != "meta":
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = call()
    del loss
    return sum(storages.values())


def profile_shares(call: Callable[[], None]) -> dict[str, float]:
    """Seconds of one ``call`` by kind of kernel (self CPU time of ``torch.profiler``): matmul,
    attention, optimizer and the rest."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    shares = {"matmul": 0.0, "attention": 0.0, "optimizer": 0.0, "rest": 0.0}
    for event in prof.key_averages():
        name, seconds = event.key, event.self_cpu_time_total / 1e6
        if name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_weight_int8pack_mm"):
            shares["matmul"] += seconds
        elif "scaled_dot_product" in name or "flash_attention" in name:
            shares["attention"] += seconds
        elif "adam" in name.lower():
            shares["optimizer"] += seconds
        else:
            shares["rest"] += seconds
    return shares


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_checkpoint_arguments(parser)
    parser.add_argument("--floor-repeats", type=int, default=3, help="timed rounds per linear shape and dtype")
    parser.add_argument("--variants", nargs="+", type=int, help="run only these rows of the table (0-based)")
    parser.add_argument("--title", default="The update on the real checkpoint against its floors")
    parser.add_argument("--append", action="store_true", help="add a section to the results file")
    add_write_results(parser)
    args = parser.parse_args(argv)
    map_host_tensors()  # the torch backend's host heap setting on a CPU: the trainer's step runs under it
    tokenizer, base = load_checkpoint(args)
    ids, mask, positions = recipe_rows(tokenizer)
    scored = int(positions.sum())

    def variant(dtype: torch.dtype | None, checkpointing: bool, bf16_weights: bool = False):
        model = copy.deepcopy(base).train()
        if bf16_weights:
            model.to(torch.bfloat16)
        if checkpointing:
            enable_gradient_checkpointing(model)
        scorer = PolicyScorer(model, autocast_dtype=dtype, share_prompts=True)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = adamw(params, lr=1e-5, weight_decay=0.0)
        advantages = torch.randn(ids.shape[0], 1, generator=torch.Generator().manual_seed(1))

        def loss() -> torch.Tensor:
            log_probs = scorer(ids, mask, positions).log_probs
            return -(log_probs * advantages * positions).sum() / scored

        def step() -> None:
            loss().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return step, lambda: saved_bytes(loss, {id(p) for p in params})

    # the packed tokens the body sees: each prompt once, then its rollouts' continuations
    packed = pack_rows(ids, mask, positions)
    body_tokens = int(packed.input_ids.numel()) if packed is not None else int(mask.sum())
    head = base.get_output_embeddings().weight
    head_rows = min(default_chunk_tokens(head.shape[0]), scored)  # the head runs chunk by chunk
    # (tokens, in_features, out_features, how many such layers) of the body
    work = [(body_tokens, i, o, count) for (i, o), count in linear_shapes(base).items()]
    head_shape = (head_rows, head.shape[1], head.shape[0])
    rates = {
        dtype: {
            (t, i, o): linear_rate(t, i, o, dtype, args.floor_repeats)
            for t, i, o in [*((t, i, o) for t, i, o, _ in work), head_shape]
        }
        for dtype in (torch.float32, torch.bfloat16)
    }

    def floor(dtype: torch.dtype, checkpointing: bool) -> float:
        """Seconds of the call's matmul FLOPs at the rates measured at their shapes: the body's
        linear layers 6 x (8 x with checkpointing) their weights per token, the head 8 x per scored token."""
        passes = 8 if checkpointing else 6
        body = sum(count * passes * t * i * o / rates[dtype][(t, i, o)] for t, i, o, count in work)
        return (body + 8 * scored * head.shape[0] * head.shape[1] / rates[dtype][head_shape]) / 1e9

    rows = [
        ("float32, checkpointing", torch.float32, True, False),
        ("bf16 autocast, checkpointing", torch.bfloat16, True, False),
        ("float32, no checkpointing", torch.float32, False, False),
        ("bf16 autocast, no checkpointing", torch.bfloat16, False, False),
        ("bf16 weights, no checkpointing (a bound)", torch.bfloat16, False, True),
    ]
    load = os.getloadavg()[0]
    results = []
    for name, dtype, checkpointing, bf16_weights in [rows[i] for i in args.variants] if args.variants else rows:
        autocast = torch.bfloat16 if dtype == torch.bfloat16 and not bf16_weights else None
        step, saved = variant(autocast, checkpointing, bf16_weights)
        step()  # warm-up (AdamW's state is made here)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        seconds = statistics.median(times)
        results.append((name, seconds, dtype, checkpointing, profile_shares(step), saved()))
        print(f"{name}: {seconds:.2f} s", file=sys.stderr, flush=True)
    isa = ", ".join(f"`{k}={os.environ[k]}`" for k in ISA_VARIABLES if k in os.environ) or "none (the CPU's own)"
    lines = [
        f"# {args.title}",
        "",
        f"Run {datetime.datetime.now():%Y-%m-%d %H:%M} with `python benchmarks/bench_update.py --model-path $GGUF"
        f"{' --write-results' if args.write_results else ''}` on {cpu_name()}, "
        f"{len(os.sched_getaffinity(0))} cores, {args.threads} torch threads; torch {torch.__version__}, "
        f"transformers {transformers.__version__}; load average {load:.2f} at the start. Instruction sets held "
        f"by: {isa}.",
        "",
        f"SmolLM2-135M-Instruct (float32 weights), {PROMPTS} word_addition prompts x {ROLLOUTS} rollouts, "
        f"{scored} scored tokens; the body runs {body_tokens} packed tokens (each prompt once). Median of "
        f"{args.repeats} calls after a warm-up. Linear layers' forward and backward at the call's shapes: "
        + "; ".join(
            f"{t} x {i} -> {o}: {rates[torch.float32][(t, i, o)]:.0f} / {rates[torch.bfloat16][(t, i, o)]:.0f}"
            for t, i, o in rates[torch.float32]
        )
        + " GFLOP/s (float32 / bf16).",
        "",
        "| variant | s | bf16 floor, s | s / bf16 floor | float32 floor, s | s / float32 floor | matmul s | "
        "attention s | optimizer s | rest s | saved for backward |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, seconds, _, checkpointing, shares, saved_total in results:
        bf16_floor, f32_floor = floor(torch.bfloat16, checkpointing), floor(torch.float32, checkpointing)
        lines.append(
            f"| {name} | {seconds:.2f} | {bf16_floor:.2f} | {seconds / bf16_floor:.1f}x | {f32_floor:.2f} | "
            f"{seconds / f32_floor:.1f}x | {shares['matmul']:.2f} | {shares['attention']:.2f} | "
            f"{shares['optimizer']:.2f} | {shares['rest']:.2f} | {saved_total / 2**30:.2f} GiB |"
        )
    lines.append("")
    lines.append(
        "Profile columns: self CPU seconds of one profiled call (the profiler's own overhead included, so they "
        "add up to a little more than `s`)."
    )
    text = "\n".join(lines) + "\n"
    target = write_results_file("RESULTS_update.md", text, args.write_results, append=args.append)
    print(text)
    print(f"wrote {target}", file=sys.stderr)


if __name__ == "__main__":
    main()
