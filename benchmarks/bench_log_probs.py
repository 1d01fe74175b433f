"""The chunked log-probs of the output head (``logprobs.chunked_token_log_probs``) against the plain
computation (every logit at once, ``log_softmax``, gather), forward and backward, in one run on the
same inputs: CPU seconds and the largest tensor either side creates.

    python benchmarks/bench_log_probs.py                 # writes outputs/benchmarks/RESULTS_log_probs.md
    python benchmarks/bench_log_probs.py --write-results # benchmarks/RESULTS_log_probs.md

Each case: ``M`` scored tokens of hidden size ``H`` over a vocabulary of ``V`` (151,936: Qwen2.5's),
float32, 1 torch thread; the loss is the sum of the log-probs (and, "with entropy", of the
entropies too: the backward then also flows through the entropy, as with an entropy bonus). Time is
the process's CPU time (``time.process_time``) of a forward and backward, the mean of 3 after a
warm-up, so other jobs on the machine slow neither side's figure much; the largest tensor is the
number of elements of the biggest tensor any op returns (a ``TorchDispatchMode``), in MB of float32.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time

import torch
from machine import cpu_name
from results import add_write_results, results_path
from torch.utils._python_dispatch import TorchDispatchMode

from rllm_torch.backends.torch_backend.logprobs import chunked_token_log_probs, default_chunk_tokens

CASES = [(1024, 64, 151_936), (1024, 896, 151_936), (4096, 64, 151_936), (4096, 64, 32_000)]


class LargestTensor(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def full(hidden, weight, targets, entropy):
    logp_MV = (hidden @ weight.T).log_softmax(-1)
    loss = logp_MV.gather(1, targets[:, None]).sum()
    if entropy:
        loss = loss - (logp_MV.exp() * logp_MV).sum()
    loss.backward()


def chunked(hidden, weight, targets, entropy):
    logp, ent = chunked_token_log_probs(hidden, weight, targets, with_entropy=entropy)
    (logp.sum() + (ent.sum() if entropy else 0)).backward()


def measure(fn, hidden, weight, targets, entropy) -> tuple[float, float]:
    fn(hidden, weight, targets, entropy)  # warm-up
    with LargestTensor() as mode:
        fn(hidden, weight, targets, entropy)
    start = time.process_time()
    for _ in range(3):
        fn(hidden, weight, targets, entropy)
    return (time.process_time() - start) / 3, mode.largest * 4 / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_write_results(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    lines = [
        "# Chunked log-probs of the output head against the full log-softmax",
        "",
        f"Run {datetime.datetime.now():%Y-%m-%d %H:%M} with `python benchmarks/bench_log_probs.py` on {cpu_name()}, "
        f"{os.cpu_count()} cores, 1 torch thread, torch {torch.__version__}; CPU seconds of one forward and backward "
        "(mean of 3) and the largest tensor created, float32.",
        "",
        "| M tokens | H | V | entropy | full s | chunked s | full / chunked | full largest MB | chunked largest MB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for num_tokens, hidden_size, vocab in CASES:
        hidden = torch.randn(num_tokens, hidden_size, requires_grad=True)
        weight = (torch.randn(vocab, hidden_size) / hidden_size**0.5).requires_grad_()
        targets = torch.randint(0, vocab, (num_tokens,))
        for entropy in (False, True):
            (full_s, full_mb), (ours_s, ours_mb) = (
                measure(fn, hidden, weight, targets, entropy) for fn in (full, chunked)
            )
            row = (
                f"| {num_tokens} | {hidden_size} | {vocab} | {'yes' if entropy else 'no'} | {full_s:.2f} | {ours_s:.2f} | "
                f"{full_s / ours_s:.2f}x | {full_mb:.0f} | {ours_mb:.0f} |"
            )
            print(row, flush=True)
            lines.append(row)
    lines += [
        "",
        f"Chunk: {default_chunk_tokens(151_936)} tokens at V = 151,936 (128 MiB of float32 logits). The chunked side's "
        "largest tensor is the weight (or its gradient, `V x H`) or a chunk of logits; the full side's is `M x V`.",
    ]
    target = results_path("RESULTS_log_probs.md", args.write_results)
    target.write_text("\n".join(lines) + "\n")
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
