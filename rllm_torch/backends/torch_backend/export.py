"""The trained model as a plain ``transformers`` directory (``model.path=`` loads it), written so
that a process stopped or failing at any moment loses nothing: :func:`export_pretrained` writes it
beside its place and renames it in, then records each file's SHA-256, which
:func:`export_complete` checks (the end-of-run stage is redone until it passes)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from rllm_torch.backends.torch_backend.actor import Actor
from rllm_torch.core.errors import CheckpointError
from rllm_torch.trainer.runtime.checkpoint import directory_digests, directory_matches, replace_directory
from rllm_torch.trainer.runtime.stop import StopRequested, stop_point

__all__ = ["export_pretrained", "export_complete"]


def export_pretrained(actor: Actor, tokenizer: Any, path: Path, is_main: bool) -> Path | None:
    """Save ``actor``'s model (LoRA: adapters merged) and ``tokenizer`` to ``path`` with
    ``save_pretrained``; rank 0 (``is_main``) writes and gets ``path``, other ranks None (with
    FSDP every rank must call, to gather the weights). Written into ``.tmp-{name}-<pid>`` and
    renamed into place, replacing an older one, then ``{name}.sha256.json`` beside it. A stop
    request (SIGTERM) between its files abandons it (:func:`~rllm_torch.trainer.runtime.stop.stop_point`).

    Raises:
        CheckpointError: writing failed (a full disk, or a model ``save_pretrained`` refuses);
            the temporary directory is removed, the run's checkpoints are intact.
    """
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    try:
        if is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        stop_point()
        if not actor.save_pretrained(tmp):
            return None
        stop_point()
        tokenizer.save_pretrained(tmp)
        digests = directory_digests(tmp)
        stop_point()
        replace_directory(tmp, path)
        path.with_name(f"{path.name}.sha256.json").write_text(json.dumps(digests))  # after: a kill leaves none
    except StopRequested:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    except Exception as exc:  # noqa: BLE001 - any failure: the export is missing, the checkpoints are not
        shutil.rmtree(tmp, ignore_errors=True)
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
        raise CheckpointError(
            f"exporting the model to {path} failed ({detail.splitlines()[0] if detail else type(exc).__name__}); "
            "the run's checkpoints are intact and the same command writes it again. Free disk space (or fix "
            "the path) first."
        ) from exc
    return path


def export_complete(path: Path) -> bool:
    """``path`` holds every file of an export, each of the size and SHA-256 that
    ``{name}.sha256.json`` beside it records (written after the export was renamed into place)."""
    return directory_matches(path, path.with_name(f"{path.name}.sha256.json"))
