"""One run per directory: the process that writes a run directory (rank 0 under torchrun) holds an
OS file lock on ``RUN_DIR/.run.lock`` (``fcntl.flock``) for the whole run. A second process
started on the same directory (the same command twice, or another experiment pointed there) is
refused before it changes anything, with one line naming the directory and the process that
holds it; two runs never mix their ``config.yaml``, checkpoints and ``metrics.jsonl``.

The kernel releases the lock when its process ends, however it ends (``kill -9`` too), so a lock
never outlives its run: the same command resumes at once. The file itself holds the holder's pid
and host, for the message; the holder deletes it when it lets go (a killed run leaves it behind,
unlocked, and the next run takes it over). Taking the lock creates the run directory when it is
missing, and letting go removes what taking it created when it is still empty, so a run that
never started leaves nothing behind.

Within one process the lock is re-entrant (the command line holds it around the trainer, which
takes it too): the lock is let go when the last holder releases it, or at once with
``release(everyone=True)``.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from rllm_torch.core.errors import ConfigError
from rllm_torch.trainer.ranks import RunRanks

__all__ = ["LOCK_NAME", "RunLock", "hold_run_directory", "lock_holder"]

#: The lock file's name inside the run directory.
LOCK_NAME = ".run.lock"


@dataclass
class _Held:
    fd: int
    path: Path
    created: list[Path] = field(default_factory=list)  # directories made by taking the lock, deepest first
    count: int = 1


_HELD: dict[Path, _Held] = {}  # this process's locks, by resolved run directory


class RunLock:
    """A hold on a run directory's lock (:func:`hold_run_directory`); :meth:`release` lets go of
    it (also when the object is garbage-collected unreleased). A hold of a rank other than 0 holds
    nothing."""

    def __init__(self, held: _Held | None, key: Path | None) -> None:
        self._held, self._key = held, key
        self._finalizer = weakref.finalize(self, _release, held, key, False) if held is not None else None

    @property
    def path(self) -> Path | None:
        """The lock file (None: this rank holds nothing)."""
        return self._held.path if self._held is not None else None

    def release(self, *, everyone: bool = False) -> None:
        """Let go of this hold; the lock itself goes with the last hold of the process, or at once
        with ``everyone`` (the command line's end of a run, whatever the trainer left)."""
        if self._held is not None:
            self._finalizer.detach()
            _release(self._held, self._key, everyone)
            self._held = None


def _release(held: _Held, key: Path, everyone: bool) -> None:
    if _HELD.get(key) is not held:  # already let go of (everyone=True before)
        return
    held.count -= 1
    if held.count > 0 and not everyone:
        return
    del _HELD[key]
    try:
        held.path.unlink(missing_ok=True)  # while still locked: see _lock_file for the other side
    except OSError:
        pass
    os.close(held.fd)
    for directory in held.created:
        try:
            directory.rmdir()  # only when empty
        except OSError:
            break


def lock_holder(path: Path) -> str:
    """Who holds the lock file ``path``, as written in it: ``"process 123"`` (``"process 123 on
    host-b"`` from another machine), or ``"another process"`` when it does not say."""
    try:
        pid, _, host = path.read_text().strip().partition(" ")
    except OSError:
        return "another process"
    if not pid.isdigit():
        return "another process"
    return f"process {pid}" + (f" on {host}" if host and host != socket.gethostname() else "")


def _made_dirs(run_dir: Path) -> list[Path]:
    """The missing directories of ``run_dir`` (itself and ancestors), deepest first, made now."""
    missing = []
    directory = run_dir
    while not directory.exists() and directory != directory.parent:
        missing.append(directory)
        directory = directory.parent
    run_dir.mkdir(parents=True, exist_ok=True)
    return missing


def _lock_file(path: Path) -> int:
    """An open descriptor of ``path`` holding its exclusive lock.

    A holder deletes the file when it lets go, so a process that opened the file just before may
    lock an unlinked inode: after locking, the path must still name the locked file, else try again.

    Raises:
        BlockingIOError: another process holds it.
    """
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
        except BaseException:
            os.close(fd)
            raise
        if same:
            return fd
        os.close(fd)


def _take(run_dir: Path, key_name: str) -> _Held:
    """Lock ``run_dir`` for this process (made when missing)."""
    path = run_dir / LOCK_NAME
    created: list[Path] = []
    fd = None
    try:
        created = _made_dirs(run_dir)
        fd = _lock_file(path)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
    except BlockingIOError:
        raise ConfigError(
            f"the run directory {run_dir} is in use by {lock_holder(path)}, which holds {path}; two runs in one "
            f"directory would mix their checkpoints and metrics. Wait for it to end, stop it, or give this run another "
            f"directory ({key_name}, or another rllm.trainer.experiment_name)."
        ) from None
    except OSError as exc:
        if fd is not None:
            os.close(fd)
            path.unlink(missing_ok=True)
        for directory in created:
            try:
                directory.rmdir()
            except OSError:
                break
        raise ConfigError(
            f"{key_name}={run_dir}: cannot write the run directory ({_os_reason(exc)}); choose a run directory on a "
            "file system with room that you may write to."
        ) from exc
    return _Held(fd, path, created)


def _os_reason(exc: OSError) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "the file system is full"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "no permission to write there, or a read-only file system"
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):
        return f"a file is in the way: {exc.filename}"
    return exc.strerror or str(exc)


def hold_run_directory(run_dir: str | os.PathLike, ranks: RunRanks | None = None, *, key: str = "") -> RunLock:
    """Hold the lock of ``run_dir`` for this run (rank 0; every other rank gets an empty hold).

    Args:
        run_dir: the run directory (made when missing).
        ranks: the run's processes; with several, every rank learns whether rank 0 got the lock
            (one collective), so every rank raises the same error.
        key: the setting that names the directory, for the messages (default
            ``rllm.trainer.default_local_dir``).

    Raises:
        ConfigError: another process holds the lock (naming the directory and its pid); the
            directory cannot be made or written (a file in the way, no permission, a full disk).
    """
    ranks = ranks if ranks is not None else RunRanks()
    run_dir = Path(run_dir)
    error, hold = None, RunLock(None, None)
    if ranks.is_main:
        resolved = run_dir.absolute().resolve()
        held = _HELD.get(resolved)
        try:
            if held is None:
                held = _HELD[resolved] = _take(run_dir, key or "rllm.trainer.default_local_dir")
            else:
                held.count += 1
            hold = RunLock(held, resolved)
        except ConfigError as exc:
            error = exc
    ranks.agree(error)
    return hold
