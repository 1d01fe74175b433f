"""The run directory of ``rllm-torch-train`` from the launch to the end: checked before Hydra makes
it (:class:`RunDirectoryCheck`, a Hydra callback; :func:`check_run_directory`), held by one run at
a time (:func:`claimed_run_directory`, over :mod:`~rllm_torch.trainer.logs.run_lock`), and left as
it was found by a run that fails, is stopped or interrupted before its first step
(:func:`remove_empty_run_dir`); :func:`resume_point` says what the same command then does."""

from __future__ import annotations

import json
import os
import shutil
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from rllm_torch.cli.error_lines import ERROR_EXIT_STATUS, report_error
from rllm_torch.core.errors import ConfigError
from rllm_torch.trainer.logs.run_lock import LOCK_NAME, RunLock, hold_run_directory
from rllm_torch.trainer.ranks import RunRanks

__all__ = [
    "MIN_FREE_BYTES",
    "RunDirectoryCheck",
    "check_run_directory",
    "claimed_run_directory",
    "remove_empty_run_dir",
    "resume_point",
]

#: A run directory on a file system with less room than this is refused at start-up as full: less
#: than one checkpoint of the default tiny model (about 1.3 MB: weights and AdamW's two moments).
MIN_FREE_BYTES = 1 << 20

#: The directory Hydra was about to make for this launch (None: it existed, or no launch yet); the
#: console script removes it when Ctrl-C ends the launch before the run took it over.
LAUNCH: dict[str, Path | None] = {"made": None}


def check_run_directory(path: str | os.PathLike, key: str) -> None:
    """``path`` can be made and written: its nearest existing ancestor is a directory this process
    may write to, on a file system with at least :data:`MIN_FREE_BYTES` free.

    Raises:
        ConfigError: naming ``key``, the path and what is in the way (a file; no write permission
            or a read-only file system; a kernel file system such as /proc; a full file system).
    """
    ancestor = Path(path).absolute()
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigError(f"{key}={path}: {ancestor} is a file, not a directory; choose a run directory elsewhere.")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{key}={path}: this process may not write to {ancestor} (permissions or a read-only file system); "
            "choose a run directory you can write to."
        )
    usage = shutil.disk_usage(ancestor)
    if usage.total == 0:  # proc, sysfs and the like: no blocks at all, not a full disk
        raise ConfigError(
            f"{key}={path}: {ancestor} is on a file system of the kernel's (no storage: /proc, /sys), not a disk; "
            "choose a run directory on a disk."
        )
    free = usage.free
    if free < MIN_FREE_BYTES:
        raise ConfigError(
            f"{key}={path}: the file system of {ancestor} is full ({free} bytes free, less than one checkpoint); "
            "free some space or choose a run directory on another file system."
        )


class RunDirectoryCheck(Callback):
    """Hydra callback (``hydra.callbacks`` in ``configs/train.yaml``): before Hydra makes the run
    directory (``hydra.run.dir``, by default ``outputs/<project>/<experiment>``), check it with
    :func:`check_run_directory`; a problem is one line on stderr and exit status 2, with nothing
    written (Hydra would raise ``NotADirectoryError`` or ``FileExistsError`` with its traceback)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        path = OmegaConf.select(config, "hydra.run.dir")
        if path is None:
            return
        try:
            check_run_directory(str(path), "hydra.run.dir")
        except ConfigError as exc:
            report_error(exc)
            sys.exit(ERROR_EXIT_STATUS)
        LAUNCH["made"] = None if Path(str(path)).exists() else Path(str(path)).absolute()


def _trained(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a step: a complete checkpoint, or a metrics row of a step >= 1."""
    from rllm_torch.trainer.runtime.checkpoint import CheckpointStore

    with warnings.catch_warnings():  # a partial checkpoint is named when the run resumes
        warnings.simplefilter("ignore")
        if CheckpointStore(run_dir / "checkpoints").latest() is not None:
            return True
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        return False
    for line in metrics.read_text().splitlines():
        try:
            if int(json.loads(line)["step"]) > 0:
                return True
        except (ValueError, KeyError, TypeError):
            continue
    return False


@contextmanager
def claimed_run_directory(run_dir: Path, ranks: RunRanks, *, key: str) -> Iterator[RunLock]:
    """Hold ``run_dir``'s lock for the block (:func:`~rllm_torch.trainer.logs.run_lock.hold_run_directory`;
    rank 0). A run that found the directory empty and ends, by any exception (an error, SIGTERM,
    Ctrl-C), before its first step leaves it empty again: its ``config.yaml``, ``.hydra/``, metrics
    and logs are removed (nothing a resume needs: the same command starts the run again).

    Raises:
        ConfigError: another process holds the directory, or it cannot be written.
    """
    hold = hold_run_directory(run_dir, ranks, key=key)
    fresh = ranks.is_main and not [p for p in run_dir.iterdir() if p.name != LOCK_NAME]
    try:
        yield hold
    except BaseException:
        if fresh and not _trained(run_dir):
            for entry in run_dir.iterdir():
                if entry.name == LOCK_NAME:
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
        raise
    finally:
        hold.release(everyone=True)


def remove_empty_run_dir(run_dir: str | os.PathLike | None) -> None:
    """Remove a run directory that holds nothing but Hydra's ``.hydra/`` (made by a launch that
    failed at start-up), and then each parent below the working directory that is left empty
    (``outputs/rllm_torch/``); a directory with anything else in it (an earlier run, or another
    run's lock) is kept."""
    if run_dir is None:
        return
    path = Path(run_dir).absolute()
    if not path.is_dir() or not {p.name for p in path.iterdir()} <= {".hydra"}:
        return
    shutil.rmtree(path, ignore_errors=True)
    cwd = Path.cwd().absolute()
    for parent in path.parents:
        if parent == cwd or cwd not in parent.parents or any(parent.iterdir()):
            break
        parent.rmdir()


def resume_point(run_dir: str | os.PathLike) -> str:
    """What starting the same command again does, from the newest complete checkpoint of
    ``run_dir``: ``"resumes from step 32 (.../step_000032)"`` or ``"starts the run again from
    step 0 (no checkpoint yet)"``."""
    from rllm_torch.trainer.runtime.checkpoint import CheckpointStore

    with warnings.catch_warnings():  # a partial checkpoint is named when the run resumes
        warnings.simplefilter("ignore")
        latest = CheckpointStore(Path(run_dir) / "checkpoints").latest()
    if latest is None:
        return "starts the run again from step 0 (no checkpoint yet)"
    return f"resumes from step {latest.step} ({latest.path})"
