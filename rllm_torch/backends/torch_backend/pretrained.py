"""Where a pretrained checkpoint's files are: ``model.path`` (and ``model.ref_path``) name a
``save_pretrained`` directory, or a single ``.gguf`` file (llama.cpp's format, as many
checkpoints are shipped).

A ``.gguf`` file is converted once into a plain ``save_pretrained`` directory (weights
dequantised to float32 by ``transformers``' GGUF loader, the tokenizer and its chat template
included) under ``model.gguf_cache_dir``, in a folder named after the file and a digest of its
resolved path, size and modification time; every later start (a resume, another rank, the
reference and the critic) reads that directory. The conversion writes a temporary folder and
renames it into place, so concurrent ranks and a killed conversion never leave half a model.
Everything downstream (the sampler, vLLM, the checkpoints, the ``checkpoints/final`` export) then
sees an ordinary ``transformers`` model; the export is a plain directory either way.

The loader needs the ``gguf`` and ``accelerate`` packages (``pip install 'rllm_torch[gguf]'``). Its
progress bar over the file's tensors is drawn on a terminal only: a piped log gets none (tqdm's
bar rewrites itself with carriage returns).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from rllm_torch.core.errors import ConfigError, ModelNotFoundError

__all__ = ["is_gguf", "pretrained_dir"]

_COMPLETE = "config.json"  # written last by save_pretrained of the model: its presence marks a whole conversion


def is_gguf(path: str | os.PathLike | None) -> bool:
    """Whether ``path`` names a ``.gguf`` file (by its suffix; existence is checked on use)."""
    return path is not None and str(path).lower().endswith(".gguf")


def pretrained_dir(path: str | os.PathLike, *, cache_dir: str | os.PathLike | None, key: str = "model.path") -> Path:
    """The ``save_pretrained`` directory of ``path``: ``path`` itself for a directory, the cached
    conversion of a ``.gguf`` file (made now when there is none yet).

    Args:
        path: a directory, or a ``.gguf`` file.
        cache_dir: where conversions live (``model.gguf_cache_dir``; ``~`` is expanded); only a
            ``.gguf`` path needs it.
        key: the setting that gave ``path``, named in errors.

    Raises:
        ModelNotFoundError: ``path`` does not exist.
        ConfigError: the ``gguf`` or ``accelerate`` package is missing (naming the extra),
            ``transformers`` cannot read the file's architecture (naming ``key``), or a ``.gguf``
            path comes without a ``cache_dir``.
    """
    path = Path(path).expanduser()
    if not is_gguf(path):
        return path
    if not path.is_file():
        raise ModelNotFoundError(f"{key}={str(path)!r}: no such file.")
    if cache_dir is None:
        raise ConfigError(f"{key}={str(path)!r} is a GGUF file: set model.gguf_cache_dir to where it may be converted.")
    stat = path.resolve().stat()
    digest = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    target = Path(cache_dir).expanduser() / f"{path.stem}-{digest}"
    if not (target / _COMPLETE).is_file():
        _convert(path, target, key)
    return target


def _convert(path: Path, target: Path, key: str) -> None:
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(
            f"{key}={str(path)!r} is a GGUF file, whose loader needs the {' and '.join(missing)} package(s): "
            "pip install 'rllm_torch[gguf]'."
        )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        try:
            with _bars_on_terminals_only():
                loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
                tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        except (ValueError, KeyError, RuntimeError, OSError) as exc:
            raise ConfigError(
                f"{key}={str(path)!r}: transformers cannot load this GGUF file ({type(exc).__name__}: {exc}); "
                "use a GGUF file of an architecture transformers' GGUF loader lists (llama, qwen2, mistral, ...), or "
                "a save_pretrained directory."
            ) from exc
        # the loaded model keeps a GGUF "quantizer" that refuses save_pretrained; the same weights in a
        # plain model of the same config save as any other model
        plain = AutoModelForCausalLM.from_config(loaded.config.__class__.from_dict(_plain_config(loaded.config)))
        plain.load_state_dict(loaded.state_dict())
        tokenizer.save_pretrained(scratch)
        plain.save_pretrained(scratch)  # config.json: the mark of a complete conversion
        try:
            os.replace(scratch, target)
        except OSError:  # another rank renamed its copy first: theirs is as good
            if not (target / _COMPLETE).is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@contextmanager
def _bars_on_terminals_only() -> Iterator[None]:
    """tqdm bars made in the block take tqdm's ``disable=None`` (no bar unless their stream is a
    terminal) when their caller does not choose: ``transformers``' GGUF loader draws one with plain
    tqdm, which ``transformers``' own progress-bar switch does not reach."""
    from tqdm import tqdm

    drawing = tqdm.__init__
    tqdm.__init__ = functools.partialmethod(drawing, disable=None)
    try:
        yield
    finally:
        tqdm.__init__ = drawing


def _plain_config(config) -> dict:
    fields = config.to_dict()
    fields.pop("quantization_config", None)
    fields["dtype"] = "float32"
    return fields
