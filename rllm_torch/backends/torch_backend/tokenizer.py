"""Tokenizers: a ``transformers`` tokenizer saved with the model, or the default one token per
character built in memory with ``tokenizers``; and the prompts' token ids (chat template or not)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from rllm_torch.core.errors import ConfigError

__all__ = [
    "build_char_tokenizer",
    "load_tokenizer",
    "encode_prompts",
    "require_chat_template",
    "has_saved_tokenizer",
    "SPECIAL_TOKENS",
]

SPECIAL_TOKENS = {"eos_token": "<eos>", "unk_token": "<unk>"}
"""Special tokens of the character tokenizer (ids 0 and 1); the eos token is also the pad token."""


def build_char_tokenizer(alphabet: str) -> PreTrainedTokenizerFast:
    """A character-level tokenizer over ``alphabet`` plus :data:`SPECIAL_TOKENS`.

    A BPE model with no merges splits any text into single characters; a character outside
    the alphabet becomes ``<unk>``. The pad token is the eos token, so a sampled pad is an end.

    Raises:
        ConfigError: an empty alphabet or one with repeated characters.

    Examples:
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


def has_saved_tokenizer(path: str | None) -> bool:
    """Whether ``path`` is a directory holding a ``transformers`` tokenizer."""
    return path is not None and any(
        (Path(path) / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")
    )


def load_tokenizer(path: str | None, alphabet: str, *, pad_token: str | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer saved in ``path`` (``model.path``) when it has one, with its own special
    tokens, else :func:`build_char_tokenizer` over ``alphabet``.

    Args:
        path: a ``save_pretrained`` directory, or None.
        alphabet: the character tokenizer's characters (used when ``path`` has no tokenizer).
        pad_token: ``model.pad_token``: the pad token to set on a tokenizer that has none (one of
            its tokens, e.g. its eos token); None: the tokenizer must have its own.

    Raises:
        ConfigError: the tokenizer has no eos token (responses could not end), has no pad token
            and ``pad_token`` is None, or ``pad_token`` is not in its vocabulary.
    """
    tokenizer = (
        AutoTokenizer.from_pretrained(path, local_files_only=True)
        if has_saved_tokenizer(path)
        else build_char_tokenizer(alphabet)
    )
    if tokenizer.eos_token_id is None:
        raise ConfigError(
            f"the tokenizer at model.path={path!r} has no eos token, so sampled responses could not end; "
            "save it with one (tokenizer.eos_token = ...; tokenizer.save_pretrained(path))."
        )
    if tokenizer.pad_token_id is not None and pad_token is not None and pad_token != tokenizer.pad_token:
        raise ConfigError(
            f"model.pad_token={pad_token!r} is set, but the tokenizer ({path or 'the character tokenizer'}) has its own pad "
            f"token {tokenizer.pad_token!r}, which is used; drop model.pad_token (it is for tokenizers without one)."
        )
    if tokenizer.pad_token_id is None:
        if pad_token is None:
            raise ConfigError(
                f"the tokenizer at model.path={path!r} has no pad token, which batched sampling and training need; set "
                f"model.pad_token to one of its tokens, e.g. \"model.pad_token='{tokenizer.eos_token}'\" (its eos token, "
                "as TRL and verl do; quoted so that the shell keeps the quotes), or save the tokenizer with a pad token."
            )
        if tokenizer.convert_tokens_to_ids(pad_token) in (None, tokenizer.unk_token_id):
            raise ConfigError(
                f"model.pad_token={pad_token!r} is not a token of the tokenizer at model.path={path!r}; use one of its "
                f"tokens, e.g. its eos token {tokenizer.eos_token!r}."
            )
        tokenizer.pad_token = pad_token
    return tokenizer


def require_chat_template(tokenizer: PreTrainedTokenizerBase) -> None:
    """Raise :class:`ConfigError` (naming ``task.apply_chat_template``) when ``tokenizer`` has no chat template."""
    if tokenizer.chat_template is None:
        raise ConfigError(
            "task.apply_chat_template=true but the tokenizer has no chat template (the default character tokenizer "
            "has none; a model.path tokenizer needs chat_template in its tokenizer_config.json); set "
            "task.apply_chat_template=false to use the prompts as they are, or use a tokenizer with a chat template."
        )


def encode_prompts(
    tokenizer: PreTrainedTokenizerBase, prompts: list[str | list[dict]], *, apply_chat_template: bool = False
) -> list[list[int]]:
    """Token ids of each prompt: with ``apply_chat_template`` the prompt is the user message of
    a one-turn conversation formatted by the tokenizer's chat template with its generation
    prompt (the template writes the special tokens); otherwise the text with the tokenizer's
    own special tokens (e.g. a BOS; the character tokenizer adds none). A prompt given as a chat
    (rLLM's messages, a list of ``{"role", "content"}``) is formatted by the chat template when
    the tokenizer has one, else it is its messages' contents joined by newlines.

    Raises:
        ConfigError: ``apply_chat_template`` with a tokenizer that has no chat template.
    """
    if any(not isinstance(p, str) for p in prompts):
        return [_encode_one(tokenizer, p, apply_chat_template) for p in prompts]
    if not apply_chat_template:
        return tokenizer(prompts, add_special_tokens=True)["input_ids"]
    require_chat_template(tokenizer)
    try:
        texts = [
            tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
            for p in prompts
        ]
    except Exception as exc:  # jinja2's TemplateError and whatever the template raises
        raise ConfigError(
            f"the tokenizer's chat template failed on a one-turn user message ({type(exc).__name__}: {exc}); fix the "
            "chat_template in the tokenizer_config.json of model.path, or set task.apply_chat_template=false."
        ) from exc
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def _encode_one(tokenizer: PreTrainedTokenizerBase, prompt: str | list[dict], apply_chat_template: bool) -> list[int]:
    if isinstance(prompt, str):
        return encode_prompts(tokenizer, [prompt], apply_chat_template=apply_chat_template)[0]
    if tokenizer.chat_template is None:
        text = "\n".join(str(m.get("content", "")) for m in prompt)
        return tokenizer([text], add_special_tokens=True)["input_ids"][0]
    try:
        text = tokenizer.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # jinja2's TemplateError and whatever the template raises
        raise ConfigError(
            f"the tokenizer's chat template failed on a task's messages ({type(exc).__name__}: {exc}); fix the "
            "chat_template in the tokenizer_config.json of model.path, or give the task's prompt as a string."
        ) from exc
    return tokenizer([text], add_special_tokens=False)["input_ids"][0]
