"""``CheckpointStore``: numbered checkpoint directories written atomically, found and pruned.

Layout under ``root`` (``RUN_DIR/checkpoints``)::

    step_000032/            a complete checkpoint: its files (and subdirectories), then manifest.json (written last)
    .tmp-step_000040-1234/  being written by process 1234 (never read; removed when found stale)
    final/                  the exported model (the backend's; written as .tmp-final-<pid>, then renamed)

A checkpoint is written into its ``.tmp-*`` directory, every file is fsynced, ``manifest.json``
(step, file sizes and SHA-256 digests, the caller's metadata) is written last, and the directory is renamed into place
with ``os.replace``: a process killed at any moment leaves either the complete checkpoint or none.
A directory named ``step_*`` without a readable manifest, or whose files do not have the sizes the
manifest records, is skipped with a warning that names it; the digests are checked when a checkpoint
is loaded (:func:`read_manifest` with ``verify_content``), not each time the directory is listed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rllm_torch.core.errors import CheckpointError

__all__ = [
    "CheckpointStore",
    "CheckpointInfo",
    "MANIFEST",
    "checkpoint_name",
    "directory_digests",
    "directory_matches",
    "file_digest",
    "read_manifest",
    "replace_directory",
]

MANIFEST = "manifest.json"
_NAME = re.compile(r"^step_(\d+)$")
_FORMAT = 1


def checkpoint_name(step: int) -> str:
    """``step_000032``: zero-padded so names sort by step."""
    return f"step_{step:06d}"


@dataclass(frozen=True)
class CheckpointInfo:
    """A complete checkpoint: its directory, step and manifest ``metadata``."""

    path: Path
    step: int
    metadata: dict[str, Any]


def file_digest(path: Path) -> str:
    """The SHA-256 of the file's bytes, hex (about 1 GB/s with the CPU's SHA instructions)."""
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def directory_digests(directory: Path) -> dict[str, list]:
    """``{file name: [size, SHA-256]}`` of the files directly in ``directory`` (an exported model)."""
    return {f.name: [f.stat().st_size, file_digest(f)] for f in sorted(directory.iterdir()) if f.is_file()}


def directory_matches(directory: Path, record: Path) -> bool:
    """Whether ``directory`` holds every file that ``record`` (a JSON of :func:`directory_digests`)
    lists, with its size and SHA-256; False when the record is missing or unreadable."""
    try:
        recorded = json.loads(record.read_text())
    except (OSError, ValueError):
        return False
    return all(
        (directory / n).is_file() and (directory / n).stat().st_size == size and file_digest(directory / n) == digest
        for n, (size, digest) in recorded.items()
    )


def read_manifest(path: Path, *, verify_content: bool = False) -> CheckpointInfo:
    """The manifest of checkpoint directory ``path``, checked against the files there: each file's
    size, and with ``verify_content`` its SHA-256 too (a checkpoint written before the manifest
    recorded digests is checked by size only).

    Raises:
        CheckpointError: no manifest, an unreadable one, or a file missing, of the wrong size or
            (``verify_content``) whose bytes changed since it was written (bit rot, a bad copy).
    """
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        step, files, metadata = int(manifest["step"]), dict(manifest["files"]), dict(manifest["metadata"])
        digests = dict(manifest.get("sha256", {}))
    except FileNotFoundError as exc:
        raise CheckpointError(
            f"{path}: no {MANIFEST} (an incomplete checkpoint: its writer stopped before finishing)."
        ) from exc
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: unreadable {MANIFEST} ({exc}).") from exc
    for name, size in files.items():
        file = path / name
        if not file.is_file() or file.stat().st_size != size:
            found = file.stat().st_size if file.is_file() else "missing"
            raise CheckpointError(
                f"{path}: file {name} should have {size} bytes, found {found} (a damaged checkpoint)."
            )
    for name, digest in digests.items() if verify_content else ():
        if file_digest(path / name) != digest:
            raise CheckpointError(
                f"{path}: the bytes of {name} changed since it was written (its SHA-256 differs from the manifest's): "
                "a damaged checkpoint."
            )
    return CheckpointInfo(path, step, metadata)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_directory(tmp: Path, final: Path) -> None:
    """Move the fully written directory ``tmp`` to ``final`` (same filesystem), replacing an existing
    ``final``: every file under ``tmp`` is fsynced first, the old ``final`` is renamed aside to
    ``.old-<name>-<pid>`` and removed after the rename, so a process killed at any moment leaves
    ``final`` complete (old or new) or absent, never half written."""
    for file in sorted(tmp.rglob("*")):
        if file.is_file():
            _fsync(file)
    old = final.with_name(f".old-{final.name}-{os.getpid()}")
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync(final.parent)
    shutil.rmtree(old, ignore_errors=True)


class CheckpointStore:
    """Checkpoints of one run under ``root``.

    Args:
        root: the checkpoints directory (created on the first save).
        max_to_keep: after each save, only the newest ``max_to_keep`` complete checkpoints are
            kept; ``None`` or ``<= 0`` keeps all.
    """

    def __init__(self, root: str | Path, *, max_to_keep: int | None = None) -> None:
        self.root, self.max_to_keep = Path(root), max_to_keep

    def complete(self) -> list[CheckpointInfo]:
        """Every complete checkpoint, oldest first; incomplete or damaged ones are skipped with a warning."""
        found = []
        for path in sorted(self.root.glob("step_*")) if self.root.is_dir() else []:
            if not _NAME.match(path.name) or not path.is_dir():
                continue
            try:
                found.append(read_manifest(path))
            except CheckpointError as exc:
                warnings.warn(f"skipping checkpoint {exc}", stacklevel=2)
        return sorted(found, key=lambda info: info.step)

    def latest(self) -> CheckpointInfo | None:
        """The complete checkpoint with the highest step (None: there is none)."""
        complete = self.complete()
        return complete[-1] if complete else None

    def save(self, step: int, write: Callable[[Path], None], metadata: dict[str, Any]) -> Path:
        """Write checkpoint ``step``: ``write(tmp_dir)`` fills a temporary directory, then the
        manifest is added and the directory renamed to ``step_{step:06d}`` (replacing an older
        checkpoint of the same step), and old checkpoints are pruned.

        Raises:
            CheckpointError: writing failed (e.g. ``OSError`` ENOSPC, disk full, or an object that
                cannot be pickled); the temporary directory is removed and every earlier
                checkpoint is left as it was.
        """
        tmp = self.begin(step)
        try:
            write(tmp)
        except Exception as exc:  # noqa: BLE001 - whatever stopped the write, the half directory goes
            raise self.abort(step, tmp, exc) from exc
        return self.commit(step, tmp, metadata)

    def begin(self, step: int) -> Path:
        """The empty temporary directory checkpoint ``step`` is written into (the first phase of
        :meth:`save`, for writers that are several processes: they all fill this directory).

        Raises:
            CheckpointError: it cannot be created.
        """
        tmp = self.root / f".tmp-{checkpoint_name(step)}-{os.getpid()}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        except OSError as exc:
            raise self.abort(step, tmp, exc) from exc
        return tmp

    def commit(self, step: int, tmp: Path, metadata: dict[str, Any]) -> Path:
        """Fsync every file under ``tmp`` (subdirectories too), write the manifest last and move
        ``tmp`` into place as checkpoint ``step``; prune old checkpoints.

        Raises:
            CheckpointError: as :meth:`save`; ``tmp`` is removed.
        """
        final = self.root / checkpoint_name(step)
        try:
            names = [str(p.relative_to(tmp)) for p in sorted(tmp.rglob("*")) if p.is_file()]
            files = {name: (tmp / name).stat().st_size for name in names}
            digests = {name: file_digest(tmp / name) for name in names}
            manifest = {"format": _FORMAT, "step": step, "files": files, "sha256": digests, "metadata": metadata}
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, default=str))
            replace_directory(tmp, final)
        except Exception as exc:  # noqa: BLE001 - whatever stopped the write, the half directory goes
            raise self.abort(step, tmp, exc) from exc
        self.prune()
        return final

    def abort(self, step: int, tmp: Path, exc: BaseException) -> CheckpointError:
        """Remove ``tmp`` and return the :class:`CheckpointError` that says what failed and which
        earlier checkpoint is intact."""
        final = self.root / checkpoint_name(step)
        shutil.rmtree(tmp, ignore_errors=True)
        previous = [i for i in self._quiet_complete() if i.step != step]
        intact = (
            f"the previous checkpoint {previous[-1].path} is intact and a restart resumes from it"
            if previous
            else "no earlier checkpoint exists"
        )
        if isinstance(exc, OSError):
            return CheckpointError(
                f"saving checkpoint {final} failed: {exc.strerror or exc} (errno {exc.errno}); {intact}. Free disk space (or fix the path) and start the same command again."
            )
        return CheckpointError(f"saving checkpoint {final} failed: {type(exc).__name__}: {exc}; {intact}.")

    def _quiet_complete(self) -> list[CheckpointInfo]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return self.complete()

    def prune(self) -> list[Path]:
        """Remove all but the newest ``max_to_keep`` complete checkpoints; returns the removed paths."""
        if not self.max_to_keep or self.max_to_keep <= 0:
            return []
        removed = [info.path for info in self._quiet_complete()[: -self.max_to_keep]]
        for path in removed:
            shutil.rmtree(path, ignore_errors=True)
        return removed

    def remove_stale_temporaries(self) -> list[Path]:
        """Remove the ``.tmp-*`` / ``.old-*`` directories (of checkpoints and of the exported model)
        left by killed writers; returns them."""
        stale = sorted([*self.root.glob(".tmp-*"), *self.root.glob(".old-*")]) if self.root.is_dir() else []
        for path in stale:
            shutil.rmtree(path, ignore_errors=True)
        return stale
