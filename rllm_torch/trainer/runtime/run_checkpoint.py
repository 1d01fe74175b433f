"""``RunCheckpointer``: what a training run saves to continue later, and the resume that reads it.

A checkpoint (see :class:`~rllm_torch.trainer.runtime.checkpoint.CheckpointStore` for the atomic layout)
holds two files: ``backend.pt``, the backend's :meth:`~BackendProtocol.state_dict` (for the torch
backend: model, optimizer, lr scheduler), and ``trainer.pt``: step, epoch, batches done in that
epoch, last validation step, rejection-sampling state, validation history and, for every rank,
its random-number-generator states (python ``random``, numpy, torch CPU, CUDA when present) and
its :meth:`~BackendProtocol.rank_state_dict` (for the torch backend: its sampling generator).
Its manifest records the config fingerprint (:mod:`~rllm_torch.trainer.runtime.fingerprint`), which
includes the world size, and the resumable settings, so that a resumed run can say which of them
it changes.

In a run of several processes rank 0 alone writes (after gathering every rank's states, one
``all_gather_object``) and a failed write is raised on every rank; on resume every rank reads
the checkpoint (the run directory must be on a filesystem every rank sees, as for any
multi-node run) and takes its own entry. A resume on another world size is refused
(:class:`~rllm_torch.core.errors.CheckpointMismatchError` naming both sizes): each rank's data share
and generator belong to the world size that wrote them.

``trainer.pt`` holds Python objects (episodes of the rejection-sampling state) and is read with
``torch.load(weights_only=False)``: resume only from checkpoints you wrote.
"""

from __future__ import annotations

import random
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from omegaconf import DictConfig

from rllm_torch.core.errors import CheckpointError, CheckpointMismatchError, ConfigError
from rllm_torch.trainer.ranks import RunRanks
from rllm_torch.trainer.runtime.checkpoint import CheckpointInfo, CheckpointStore, read_manifest
from rllm_torch.trainer.runtime.fingerprint import (
    check_fingerprint,
    config_fingerprint,
    resumable_changes,
    resumable_settings,
)
from rllm_torch.trainer.state import TrainerState

__all__ = ["RunCheckpointer", "capture_rng_states", "restore_rng_states", "RESUME_MODES"]

RESUME_MODES = ("auto", "disable", "resume_path")
SHARDED = "sharded"  # the subdirectory of a checkpoint where torch.distributed.checkpoint writes shards


def capture_rng_states() -> dict[str, Any]:
    """The global generators' states: python ``random``, numpy, torch CPU and every CUDA device."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def restore_rng_states(states: dict[str, Any]) -> None:
    """Set the generators from :func:`capture_rng_states`'s dict."""
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if states.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


class RunCheckpointer:
    """Periodic checkpoints and resume for one run.

    Args:
        backend: saved with ``backend.state_dict()``, restored with ``backend.load_state_dict()``.
        config: the run config; reads ``rllm.trainer.save_freq``, ``max_checkpoints_to_keep``,
            ``resume_mode`` (``auto``: the newest complete checkpoint of the run directory, if any;
            ``disable``: start at step 0; ``resume_path`` with ``resume_from_path``, or a checkpoint
            directory given as ``resume_mode`` itself: exactly that checkpoint).
        run_dir: the run directory; checkpoints go to ``run_dir/checkpoints``.
        ranks: the run's processes (default: one).

    The checkpoint to resume from is chosen, and its fingerprint checked, when the object is
    built, so a run that cannot resume stops before it writes anything.

    Raises:
        ConfigError: an unknown ``resume_mode`` that is not a directory either.
        CheckpointMismatchError: the config changed in a setting resuming cannot honour.
        CheckpointError: the requested checkpoint is damaged; every checkpoint of the run
            directory is (a fresh start would overwrite the run's metrics); or
            ``resume_mode=disable`` in a run directory that already holds checkpoints (two runs
            would mix).
    """

    def __init__(self, backend: Any, config: DictConfig, run_dir: Path, ranks: RunRanks | None = None) -> None:
        trainer = config.rllm.trainer
        self.backend, self.save_freq = backend, trainer.save_freq
        self.ranks = ranks if ranks is not None else RunRanks()
        self.store = CheckpointStore(run_dir / "checkpoints", max_to_keep=trainer.max_checkpoints_to_keep)
        self.fingerprint = config_fingerprint(config, world_size=self.ranks.world_size)
        self.resumable = resumable_settings(config)
        self.changes: dict[str, tuple[Any, Any]] = {}  # resumable settings changed since the resumed checkpoint
        self.saved_step: int | None = None  # the step of the newest checkpoint written or resumed by this run
        mode = str(trainer.resume_mode)
        self.mode, self.path = mode, None
        if mode == "resume_path" or mode not in RESUME_MODES:
            self.mode, self.path = "resume_path", trainer.resume_from_path if mode == "resume_path" else mode
            if not self.path or not Path(self.path).is_dir():
                raise ConfigError(
                    f"rllm.trainer.resume_mode={mode!r}: expected auto, disable, or a checkpoint directory (resume_path with rllm.trainer.resume_from_path={self.path!r}); no such directory."
                )
        self.candidates = self._candidates()
        if self.candidates:
            check_fingerprint(
                self.candidates[0].metadata.get("fingerprint", {}), self.fingerprint, str(self.candidates[0].path)
            )

    def _candidates(self) -> list[CheckpointInfo]:
        """Checkpoints to try, newest first."""
        if self.mode == "disable":
            if (latest := self.store.latest()) is not None:
                raise CheckpointError(
                    f"rllm.trainer.resume_mode=disable but {self.store.root} already holds checkpoints (newest {latest.path.name}); a fresh run there would mix two runs. Use another run directory (rllm.trainer.experiment_name=... or default_local_dir=...), delete that directory, or resume_mode=auto to continue it."
                )
            return []
        if self.mode == "resume_path":
            return [read_manifest(Path(self.path))]
        complete = self.store.complete()[::-1]
        if not complete and (damaged := sorted(p.name for p in self.store.root.glob("step_*"))):
            raise self._all_damaged(damaged)
        return complete

    def _all_damaged(self, names: list[str]) -> CheckpointError:
        return CheckpointError(
            f"every checkpoint of {self.store.root} is damaged ({', '.join(names)}; see the warnings above): the run "
            "cannot continue, and starting it over would overwrite its metrics. Copy them back from a backup, or "
            "start over in another directory (rllm.trainer.experiment_name=...) or after removing that directory."
        )

    def newest(self) -> Path | None:
        """Rank 0: the newest complete checkpoint's directory (None: none yet; other ranks: None)."""
        latest = self.store.latest() if self.ranks.is_main else None
        return latest.path if latest is not None else None

    def due(self, state: TrainerState) -> bool:
        """True when ``state.global_step`` is a multiple of ``save_freq`` (> 0)."""
        return self.save_freq > 0 and state.global_step % self.save_freq == 0

    def save(self, state: TrainerState, val_history: list) -> Path | None:
        """Write the checkpoint of ``state.global_step`` (every rank must call; rank 0 writes and
        returns its path, the others None). A backend with sharded state (FSDP) has every rank
        write its shards into the checkpoint's ``sharded/`` with ``torch.distributed.checkpoint``.

        Raises:
            CheckpointError: the write failed (on every rank); earlier checkpoints are intact.
        """
        step, main = state.global_step, self.ranks.is_main
        per_rank = self.ranks.gather({"rng": capture_rng_states(), "backend": self.backend.rank_state_dict()})
        sharded = self.backend.sharded_state_dict()
        tmp, error = None, None
        if main:
            try:
                tmp = self.store.begin(step)
            except CheckpointError as exc:
                error = exc
        self.ranks.agree(error)
        if sharded is not None:
            tmp = Path(self.ranks.gather(str(tmp))[0])  # rank 0's directory, for every rank
            try:
                dcp.save(sharded, checkpoint_id=tmp / SHARDED)
            except Exception as exc:  # noqa: BLE001 - any failure of the collective write fails the checkpoint
                error = self.store.abort(step, tmp, exc) if main else CheckpointError(f"writing shards failed: {exc}")
            self.ranks.agree(error)
        path = None
        if main:
            trainer_state = {
                "global_step": step,
                "epoch": state.epoch,
                "batch_in_epoch": state.batch_in_epoch,
                "last_validation_step": state.last_validation_step,
                "rs_state": state.rs_state,
                "val_history": val_history,
                "ranks": per_rank,
            }
            metadata = {
                "fingerprint": self.fingerprint,
                "resumable": self.resumable,
                "epoch": state.epoch,
                "batch_in_epoch": state.batch_in_epoch,
            }
            try:
                torch.save(self.backend.state_dict(), tmp / "backend.pt")
                torch.save(trainer_state, tmp / "trainer.pt")
                path = self.store.commit(step, tmp, metadata)
            except CheckpointError as exc:
                error = exc
            except Exception as exc:  # noqa: BLE001 - e.g. ENOSPC or an object that cannot be pickled
                error = self.store.abort(step, tmp, exc)
        self.ranks.agree(error)
        self.saved_step = step
        return path

    def resume(self, state: TrainerState, val_history: list) -> CheckpointInfo | None:
        """Restore ``state``, ``val_history`` (in place), the backend and the generators from the
        newest readable checkpoint chosen at construction; returns it (None: starting at step 0).
        A checkpoint is readable when its files have the sizes and SHA-256 digests of its manifest
        and load; an unreadable one is skipped with a warning for the next older one.
        ``self.changes`` then holds the resumable settings that differ from the checkpoint's.

        Raises:
            CheckpointMismatchError: an older checkpoint, tried because the newer ones are
                unreadable, does not fit the config; or the model's weights do not fit the one
                built now (e.g. a data file whose characters changed: another vocabulary).
            CheckpointError: ``resume_mode`` named a checkpoint that cannot be read; or none of
                the run's checkpoints can.
        """
        for stale in self.store.remove_stale_temporaries() if self.ranks.is_main else []:
            warnings.warn(f"removed {stale}: an unfinished write of a run that was stopped", stacklevel=2)
        damaged = []
        for info in self.candidates:
            check_fingerprint(info.metadata.get("fingerprint", {}), self.fingerprint, str(info.path))
            try:
                read_manifest(info.path, verify_content=True)
                backend_state = torch.load(info.path / "backend.pt", map_location="cpu", weights_only=False)
                trainer_state = torch.load(info.path / "trainer.pt", map_location="cpu", weights_only=False)
            except Exception as exc:  # noqa: BLE001 - any unreadable file makes the checkpoint unusable
                if self.mode == "resume_path":
                    raise CheckpointError(f"cannot read checkpoint {info.path}: {exc}") from exc
                warnings.warn(f"skipping checkpoint {info.path}: unreadable ({exc}); trying an older one", stacklevel=2)
                damaged.append(info.path.name)
                continue
            try:
                self.backend.load_state_dict(backend_state)
            except (RuntimeError, ValueError) as exc:  # torch's "size mismatch for ...": a model of another shape
                lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
                detail = next(
                    (line for line in lines if "size mismatch" in line), lines[0] if lines else type(exc).__name__
                )
                raise CheckpointMismatchError(
                    f"cannot resume from {info.path}: its weights do not fit the model built now ({detail}); "
                    "the vocabulary or a shape setting changed (e.g. the characters of a data file). Restore the data and settings "
                    "of that run, or start a new run in another directory (rllm.trainer.experiment_name=...)."
                ) from exc
            sharded = self.backend.sharded_state_dict()
            if sharded is not None:  # every rank reads its shards (resharded if the layout allows)
                dcp.load(sharded, checkpoint_id=info.path / SHARDED)
                self.backend.load_sharded_state_dict(sharded)
            self._restore(trainer_state, state, val_history)
            self.changes = resumable_changes(info.metadata.get("resumable"), self.resumable)
            self.saved_step = info.step
            if self.ranks.is_main and not damaged:  # a run stopped before its prune (never an older fallback's)
                self.store.prune()
            return info
        if damaged:
            raise self._all_damaged(damaged)
        return None

    def _restore(self, saved: dict[str, Any], state: TrainerState, val_history: list) -> None:
        state.global_step, state.epoch, state.batch_in_epoch = (
            saved["global_step"],
            saved["epoch"],
            saved["batch_in_epoch"],
        )
        state.last_validation_step, state.rs_state = saved["last_validation_step"], saved["rs_state"]
        val_history[:] = saved["val_history"]
        mine = saved["ranks"][self.ranks.rank]  # the world size matches: the fingerprint says so
        restore_rng_states(mine["rng"])
        self.backend.load_rank_state_dict(mine["backend"])
