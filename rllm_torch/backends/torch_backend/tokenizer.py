"""The default tokenizer: one token per character, built in memory with ``tokenizers``."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from rllm_torch.errors import ConfigError

__all__ = ["build_char_tokenizer", "load_tokenizer", "SPECIAL_TOKENS"]

SPECIAL_TOKENS = {"eos_token": "<eos>", "unk_token": "<unk>"}
"""Special tokens of the character tokenizer (ids 0 and 1); the eos token is also the pad token."""


def build_char_tokenizer(alphabet: str) -> PreTrainedTokenizerFast:
    """A character-level tokenizer over ``alphabet`` plus :data:`SPECIAL_TOKENS`.

    A BPE model with no merges splits any text into single characters; a character outside
    the alphabet becomes ``<unk>``. The pad token is the eos token, so a sampled pad is an end.

    Raises:
        ConfigError: an empty alphabet or one with repeated characters.

    Example:
        >>> tok = build_char_tokenizer("0123456789+=")
        >>> tok("3+4=")["input_ids"], tok.decode([9, 1], skip_special_tokens=True)
        ([5, 12, 6, 13], '7')
    """
    if not alphabet or len(set(alphabet)) != len(alphabet):
        raise ConfigError(f"the tokenizer alphabet must be non-empty with distinct characters, got {alphabet!r}.")
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS.values())}
    vocab |= {ch: len(SPECIAL_TOKENS) + i for i, ch in enumerate(alphabet)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=SPECIAL_TOKENS["unk_token"]))
    backend.decoder = decoders.Fuse()  # join characters without spaces
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token=SPECIAL_TOKENS["eos_token"], **SPECIAL_TOKENS)


def load_tokenizer(path: str | None, alphabet: str) -> PreTrainedTokenizerBase:
    """The tokenizer saved in ``path`` when it has one, else :func:`build_char_tokenizer`.

    A tokenizer without a pad token gets its eos token as pad.
    """
    if (
        path is not None
        and (Path(path) / "tokenizer.json").exists()
        or path is not None
        and (Path(path) / "tokenizer_config.json").exists()
    ):
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    else:
        tokenizer = build_char_tokenizer(alphabet)
    if tokenizer.eos_token_id is None:
        raise ConfigError(f"the tokenizer at {path!r} has no eos token; the sampler needs one to end responses.")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
