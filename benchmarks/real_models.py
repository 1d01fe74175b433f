"""Real model shapes with random weights, saved with ``save_pretrained`` for ``model.path=``.

Qwen2.5's published vocabulary (151,936 tokens) is what makes a real model's log-probs and
sampling expensive, so both shapes keep it:

* ``small``: a Qwen2-shaped model with hidden size 64 and 2 layers (9.8M parameters, nearly all of
  them the tied embedding);
* ``qwen2.5-0.5b``: Qwen2.5-0.5B's published config (hidden 896, 24 layers, 14 query / 2 key-value
  heads, intermediate 4864, tied embeddings; 494M parameters).

The tokenizer is a saved ``transformers`` fast tokenizer with one token per character of the
tasks' text (digits, ``+``, ``=``, letters, space and punctuation), an end token and filler
tokens up to the full vocabulary, so the model's head and softmax are as wide as Qwen2.5's.

    python benchmarks/real_models.py /tmp/qwen-small --shape small
"""

from __future__ import annotations

import argparse
import string
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

__all__ = ["SHAPES", "VOCAB_SIZE", "save_real_model"]

VOCAB_SIZE = 151_936  # Qwen2.5's published vocab_size
SHAPES = {
    "small": dict(
        hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    ),
    "qwen2.5-0.5b": dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2
    ),
}
_CHARACTERS = string.digits + "+-=*/()., ?:" + string.ascii_letters


def _tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<|endoftext|>": 0, "<unk>": 1} | {ch: 2 + i for i, ch in enumerate(_CHARACTERS)}
    vocab |= {f"<|extra_{i}|>": i for i in range(len(vocab), VOCAB_SIZE)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|endoftext|>", pad_token="<|endoftext|>", unk_token="<unk>"
    )


def save_real_model(directory: str | Path, shape: str = "small", *, seed: int = 0, max_positions: int = 32768) -> Path:
    """Save a randomly initialised ``shape`` model (see :data:`SHAPES`) and its tokenizer to
    ``directory`` (created), float32, and return the directory.

    Raises:
        KeyError: an unknown ``shape``.
    """
    tokenizer = _tokenizer()
    config = Qwen2Config(
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=max_positions,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **SHAPES[shape],
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    directory = Path(directory)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    args = parser.parse_args()
    path = save_real_model(args.directory, args.shape)
    print(f"saved {args.shape} ({VOCAB_SIZE} tokens) to {path}")
